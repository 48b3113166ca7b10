"""Full participation and uniform sampling without replacement.

Uniform sampling draws ``clients_per_round`` of the ``N`` clients without replacement, so each
client is included with probability ``clients_per_round / N``. The draw uses the server's
stream for the round only, so the cohort does not depend on world size or resume.
"""

from __future__ import annotations

from typing import cast

import lightning as L
import torch
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.rng import SERVER


class FullParticipation(ClientSampler):
    """Every client takes part in every round."""

    @override
    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        return Cohort.full(round_idx=round_idx, num_clients=module.num_clients)


class UniformSampler(ClientSampler):
    """``clients_per_round`` clients drawn uniformly without replacement each round.

    Args:
        clients_per_round: cohort size; must not exceed the number of clients.
    """

    def __init__(self, *, clients_per_round: int) -> None:
        if clients_per_round < 1:
            raise ConfigError(f"clients_per_round must be at least 1 (got {clients_per_round}).")
        self.clients_per_round = clients_per_round

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        num_clients = cast(FederatedModule, pl_module).num_clients
        if self.clients_per_round > num_clients:
            raise ConfigError(
                f"clients_per_round={self.clients_per_round} exceeds data.num_clients={num_clients}; "
                "lower clients_per_round or raise data.num_clients."
            )

    @override
    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        n = module.num_clients
        gen = module.generator(round_idx, SERVER, "cohort")
        chosen = torch.randperm(n, generator=gen)[: self.clients_per_round]
        ids = tuple(sorted(chosen.tolist()))
        probs = torch.full((len(ids),), self.clients_per_round / n)
        return Cohort(round_idx=round_idx, client_ids=ids, inclusion_probabilities=probs)
