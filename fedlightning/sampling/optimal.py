"""Optimal client sampling (OCS, Algorithm 7) and its secure-aggregation form (AOCS, Algorithm 8).

Horváth's thesis, arXiv 2207.00392, ch. 6 (Chen, Horváth and Richtárik, arXiv 2010.13723).
A cohort of n clients is drawn (all clients, or ``cohort_size`` uniformly without
replacement) and *every* member trains. Each then reveals one float, its weighted update norm
ũ_i = (w_i/π_i) ‖Δ_i‖ (w_i its share, π_i its probability of being in the cohort); the server
turns the norms into probabilities q_i with Σ q_i = m (:mod:`fedlightning.sampling.probabilities`)
and client i uploads with probability q_i, independently. With ``method.aggregation=normalised``
the round's update is Σ_{uploaders} (w_i/q_i) Δ_i / Σ_{cohort} w_i (FedAvg with OCS,
Algorithm 9, normalised by the weight of every client that computed); with ``unbiased`` it
is Σ_{uploaders} w_i/(π_i q_i) Δ_i.

Traffic, counted as control messages: OCS sends ũ_i up and q_i down (one float each);
AOCS sends ũ_i up and u = Σ ũ_j down, then per iteration (1, q_i) or (0, 0) up and the
scale C down. Each round logs ``sampling/alpha`` (the variance against independent uniform
sampling of m, §6.5), ``sampling/expected_uploaders`` and ``sampling/uploaders``.
"""

from __future__ import annotations

from typing import Any, cast

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, UploadChoice
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.rng import SERVER
from fedlightning.sampling.probabilities import aocs_probabilities, improvement_factor, optimal_probabilities
from fedlightning.sampling.uniform import UniformSampler

__all__ = ["ApproximateOptimalClientSampler", "OptimalClientSampler"]


class OptimalClientSampler(ClientSampler):
    """OCS: uploaders chosen after local work with the variance-optimal probabilities (6.7).

    Args:
        expected_uploaders: m, the expected number of clients that upload per round.
        cohort_size: n, the clients that train each round (uniformly without replacement);
            ``None`` trains every client.
    """

    chooses_uploaders = True
    name = "ocs"

    def __init__(self, *, expected_uploaders: int, cohort_size: int | None = None) -> None:
        if expected_uploaders < 1:
            raise ConfigError(
                f"clients_per_round (the expected uploaders m) must be at least 1 (got {expected_uploaders})."
            )
        if cohort_size is not None and cohort_size < 1:
            raise ConfigError(f"sampler.cohort_size must be at least 1 or null (got {cohort_size}).")
        self.expected_uploaders = int(expected_uploaders)
        self.cohort_size = cohort_size
        self._metrics: dict[str, float] = {}

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        num_clients = cast(FederatedModule, pl_module).num_clients
        n = num_clients if self.cohort_size is None else self.cohort_size
        if n > num_clients:
            raise ConfigError(
                f"sampler.cohort_size={n} exceeds data.num_clients={num_clients}; lower it or set it to null."
            )
        if self.expected_uploaders >= n:
            raise ConfigError(
                f"sampler={self.name} expects clients_per_round={self.expected_uploaders} uploaders out of a "
                f"{n}-client cohort, which lets every client upload and samples nothing; lower "
                "clients_per_round, or use "
                + ("sampler=full." if n == num_clients else f"sampler=uniform clients_per_round={n}.")
            )

    @override
    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        if self.cohort_size is None or self.cohort_size == module.num_clients:
            return Cohort.full(round_idx=round_idx, num_clients=module.num_clients)
        return UniformSampler(clients_per_round=self.cohort_size).select_cohort(trainer, module, round_idx)

    def scores(self, module: FederatedModule, cohort: Cohort, update_norms: Tensor) -> Tensor:
        """ũ_i = (w_i/π_i) ‖Δ_i‖ of each cohort member, as the float32 each client sends (float64)."""
        sizes = module.datamodule.client_sizes
        shares = torch.tensor(
            [module.client_share(client_id=c, num_samples=sizes[c]) for c in cohort.client_ids], dtype=torch.float64
        )
        scores = shares / cohort.inclusion_probabilities.to(torch.float64) * update_norms.to(torch.float64)
        return scores.to(torch.float32).to(torch.float64)

    def probabilities(self, scores: Tensor) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor], dict[str, float]]:
        """q per member, the control values each sends and receives (by cohort position), metrics to log."""
        q = optimal_probabilities(scores, self.expected_uploaders)
        up = {k: scores[k : k + 1] for k in range(scores.numel())}
        down = {k: q[k : k + 1] for k in range(scores.numel())}
        return q, up, down, {}

    @override
    def choose_uploaders(
        self, trainer: L.Trainer, module: FederatedModule, cohort: Cohort, update_norms: Tensor
    ) -> UploadChoice:
        scores = self.scores(module, cohort, update_norms)
        q, up, down, extra = self.probabilities(scores)
        gen = module.generator(cohort.round_idx, SERVER, "choose_uploaders")
        sent = torch.rand(q.numel(), generator=gen, dtype=torch.float64) < q
        positions = [int(k) for k in torch.nonzero(sent).flatten()]
        uploaders = Cohort(
            round_idx=cohort.round_idx,
            client_ids=tuple(cohort.client_ids[k] for k in positions),
            inclusion_probabilities=q[positions].to(torch.float32),
        )
        ids = cohort.client_ids
        self._metrics = {
            "sampling/alpha": improvement_factor(scores, q, self.expected_uploaders),
            "sampling/expected_uploaders": float(q.sum()),
            "sampling/uploaders": float(len(positions)),
            **extra,
        }
        return UploadChoice(
            uploaders=uploaders,
            uplink_control={ids[k]: v.to(torch.float32) for k, v in up.items()},
            downlink_control={ids[k]: v.to(torch.float32) for k, v in down.items()},
        )

    @override
    def on_round_end(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, metrics: dict[str, Any]
    ) -> None:
        metrics.update(self._metrics)
        self._metrics = {}


class ApproximateOptimalClientSampler(OptimalClientSampler):
    """AOCS (Algorithm 8): the probabilities of OCS from secure sums only, in at most ``j_max`` iterations.

    Args:
        expected_uploaders: m, the expected number of uploaders per round.
        cohort_size: n, the clients that train each round (``None``: every client).
        j_max: iterations of the (I, P) sums (4 in the thesis' experiments).
    """

    name = "aocs"

    def __init__(self, *, expected_uploaders: int, cohort_size: int | None = None, j_max: int = 4) -> None:
        super().__init__(expected_uploaders=expected_uploaders, cohort_size=cohort_size)
        if j_max < 0:
            raise ConfigError(f"sampler.j_max must be non-negative (got {j_max}).")
        self.j_max = j_max

    @override
    def probabilities(self, scores: Tensor) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor], dict[str, float]]:
        result = aocs_probabilities(scores, self.expected_uploaders, j_max=self.j_max)
        n = scores.numel()
        scales = torch.tensor([result.total, *result.scales], dtype=torch.float64)
        up = {k: torch.cat([scores[k : k + 1], result.reports[:, k, :].reshape(-1)]) for k in range(n)}
        down = {k: scales for k in range(n)}
        return result.probabilities, up, down, {"sampling/aocs_iterations": float(result.iterations)}
