"""Independent sampling: each client joins the round on its own coin (Horváth, arXiv 2207.00392, §1.6.3).

Client i is in the cohort with probability p_i, independently of the others, so the cohort
size is random with mean Σ p_i and may be empty (the round then leaves the server state
unchanged). Among samplings with the same p, independent sampling gives the unbiased
estimator Σ_{i∈S} (w_i/p_i) Δ_i the smallest variance bound (v_i = 1 − p_i, §6.4).
Importance sampling takes p_i ∝ w_i = n_i / n, capped at one (FedShuffle, arXiv 2204.13169,
where it makes the unbiased weights w_i/p_i a plain sum).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.rng import SERVER
from fedlightning.sampling.probabilities import capped_proportional

__all__ = ["ImportanceSampler", "IndependentSampler", "bernoulli_cohort"]


def bernoulli_cohort(probabilities: Tensor, *, round_idx: int, generator: torch.Generator) -> Cohort:
    """The clients whose coin came up: client i is in with probability ``probabilities[i]``.

    >>> gen = torch.Generator().manual_seed(0)
    >>> bernoulli_cohort(torch.tensor([1.0, 0.0, 1.0]), round_idx=0, generator=gen).client_ids
    (0, 2)
    """
    p = probabilities.to(torch.float64)
    drawn = torch.rand(p.numel(), generator=generator, dtype=torch.float64) < p
    ids = tuple(torch.nonzero(drawn).flatten().tolist())
    return Cohort(round_idx=round_idx, client_ids=ids, inclusion_probabilities=p[list(ids)].to(torch.float32))


class IndependentSampler(ClientSampler):
    """Each client takes part with its own probability p_i, independently of the others.

    Args:
        clients_per_round: expected cohort size b; every client gets p_i = b / N.
        probabilities: p_i per client instead (all in (0, 1]); give exactly one of the two.
    """

    def __init__(self, *, clients_per_round: int | None = None, probabilities: Sequence[float] | None = None) -> None:
        if (clients_per_round is None) == (probabilities is None):
            raise ConfigError(
                "sampler=independent takes either clients_per_round (p_i = clients_per_round / N) or "
                "sampler.probabilities (one per client); set the other to null."
            )
        if clients_per_round is not None and clients_per_round < 1:
            raise ConfigError(f"clients_per_round must be at least 1 (got {clients_per_round}).")
        if probabilities is not None and not all(0.0 < float(p) <= 1.0 for p in probabilities):
            raise ConfigError("sampler.probabilities must all lie in (0, 1]: a client never drawn biases the estimate.")
        self.clients_per_round = clients_per_round
        self.probabilities = None if probabilities is None else [float(p) for p in probabilities]
        self._p: Tensor | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        n = cast(FederatedModule, pl_module).num_clients
        if self.probabilities is not None:
            if len(self.probabilities) != n:
                raise ConfigError(
                    f"sampler.probabilities lists {len(self.probabilities)} clients but the federation has {n}."
                )
            self._p = torch.tensor(self.probabilities, dtype=torch.float64)
            return
        assert self.clients_per_round is not None
        if self.clients_per_round > n:
            raise ConfigError(
                f"clients_per_round={self.clients_per_round} exceeds data.num_clients={n}; lower clients_per_round."
            )
        self._p = torch.full((n,), self.clients_per_round / n, dtype=torch.float64)

    def inclusion_probabilities(self) -> Tensor:
        """p_i of every client of the federation (float64)."""
        if self._p is None:
            raise RuntimeError("The sampler is not set up: it knows the federation only once a trainer runs it.")
        return self._p

    @override
    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        gen = module.generator(round_idx, SERVER, "cohort")
        return bernoulli_cohort(self.inclusion_probabilities(), round_idx=round_idx, generator=gen)


class ImportanceSampler(IndependentSampler):
    """Independent sampling with p_i ∝ w_i (the method's client shares), capped at one.

    Args:
        clients_per_round: expected cohort size b = Σ p_i.
    """

    def __init__(self, *, clients_per_round: int) -> None:
        super().__init__(clients_per_round=clients_per_round)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        module = cast(FederatedModule, pl_module)
        sizes = module.datamodule.client_sizes
        shares = torch.tensor([module.client_share(client_id=i, num_samples=n) for i, n in enumerate(sizes)])
        assert self.clients_per_round is not None
        self._p = capped_proportional(shares, self.clients_per_round)
        if bool((self._p == 0).any()):
            empty = int((self._p == 0).sum())
            raise ConfigError(f"sampler=importance gives probability 0 to {empty} clients without data; drop them.")
