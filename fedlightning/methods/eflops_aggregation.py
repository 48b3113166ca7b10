"""E-FLoPS's server rebuild: (θ̃, π̄, λ) as sample-weighted means over the gated sparse uploads.

Paper: E-FLoPS, arXiv 2607.00275: the server rebuilds θ̃ and the gate probabilities π̄ =
P(z ≠ 0) from the uploads' supports and recovers log α from π̄ (hard-concrete gates, Louizos
et al., arXiv 1712.01312). π̄_j is averaged over the senders of j or over every client
(``method.gate_aggregation``, :data:`GATE_AGGREGATIONS`). :func:`aggregate_gated_uploads` is
the rebuild on stacked uploads; :class:`GatedUploadSums` the same as fixed-size running sums.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from fedlightning.compression.gated_sparse import unpack_gate_state
from fedlightning.federated.aggregators import Aggregator
from fedlightning.methods.eflops_off_support import expand_groups
from fedlightning.methods.strategy import Strategy

__all__ = [
    "GATE_AGGREGATIONS",
    "AllClientsMean",
    "GateAggregation",
    "GateAggregationName",
    "GatedUploadSums",
    "SendersMean",
    "aggregate_gated_uploads",
]


class GateAggregation(Strategy):
    """Over whom π̄_j is averaged."""

    senders_only: ClassVar[bool]


class SendersMean(GateAggregation):
    """π̄_j as θ̃_j: the mean over the clients that sent j (the fill only where nobody did)."""

    name = "senders"
    senders_only = True


class AllClientsMean(GateAggregation):
    """π̄_j over every client, a non-sender of j counting at its fill (π_min or its own π_off)."""

    name = "all"
    senders_only = False


GateAggregationName = Literal["senders", "all"]
"""The names of :data:`GATE_AGGREGATIONS`."""

GATE_AGGREGATIONS: dict[str, GateAggregation] = {"senders": SendersMean(), "all": AllClientsMean()}
"""``method.gate_aggregation`` → over whom π̄ is averaged."""


def aggregate_gated_uploads(
    thetas: Tensor, pis: Tensor, weights: Tensor, pi_unsent: float | Tensor, *, senders_only: bool = False
) -> tuple[Tensor, Tensor]:
    """Server rebuild of (θ̃, π̄) from K sparse uploads stacked as (K, d) rows.

    θ̃_j is the weighted mean over the clients that sent j (π_kj > 0), 0 if none did;
    π̄_j = Σ_k w_k π_kj with π_kj := ``pi_unsent`` where client k did not send j (a scalar,
    or a tensor broadcastable to (K, d): client k's own off-support statistic). With
    ``senders_only`` π̄_j is instead the weighted mean over the senders of j, like θ̃_j, and
    the fill is used only for coordinates nobody sent. ``weights`` sum to one.

    >>> th = torch.tensor([[2.0, 0.0], [4.0, 1.0]]); pi = torch.tensor([[0.5, 0.0], [1.0, 0.8]])
    >>> t, p = aggregate_gated_uploads(th, pi, torch.tensor([0.25, 0.75]), pi_unsent=0.0)
    >>> t.tolist(), p.tolist()
    ([3.5, 1.0], [0.875, 0.6000000238418579])
    """
    sent = (pis > 0).to(thetas.dtype)
    w = weights.to(thetas.dtype).reshape(-1, 1)
    mass = (w * sent).sum(dim=0)
    theta = torch.where(mass > 0, (w * sent * thetas).sum(dim=0) / mass.clamp_min(1e-12), torch.zeros_like(mass))
    fill = torch.as_tensor(pi_unsent, dtype=pis.dtype, device=pis.device).expand_as(pis)
    if senders_only:  # π̄_j as θ̃_j: mean over the senders; the fill only where nobody sent j
        pi_sent = (w * sent * pis).sum(dim=0) / mass.clamp_min(1e-12)
        return theta, torch.where(mass > 0, pi_sent, (w * fill).sum(dim=0))
    pi = (w * torch.where(sent > 0, pis, fill)).sum(dim=0)
    return theta, pi


class GatedUploadSums(Aggregator):
    """:func:`aggregate_gated_uploads` as fixed-size sums, folded in as each upload arrives.

    For uploads k with coefficient w_k, sent_kj = [π_kj > 0] and fill_kj (client k's own
    off-support statistic of j's parameter tensor, clamped to [π_min, 1]; π_min when messages
    carry none), :attr:`sums` holds, in one flat float64 tensor (4 d + 2 entries whatever the
    cohort size, so one all-reduce adds the shares of all processes):

    ``[Σ w sent θ̃ (d) | Σ w sent (d) | Σ w sent π (d) | Σ w (1 − sent) fill (d) | Σ w λ | Σ w]``.

    :meth:`result` then gives θ̃_j = Σ w sent θ̃ / Σ w sent (0 where nobody sent j), π̄_j as
    the same mean over the senders (``senders_only``; Σ w fill / Σ w where nobody sent j) or
    (Σ w sent π + Σ w (1 − sent) fill) / Σ w (every client counts), and λ = Σ w λ / Σ w. The
    coefficients need not sum to one: every statistic is normalised by its own weight.

    Args:
        dim: |θ|, the number of gated coordinates.
        group_sizes: sizes of the parameter tensors (for the per-tensor statistics).
        num_groups: statistics per message (``len(group_sizes)``, or 0 when messages carry none).
        pi_min: the floor of π (and the fill when messages carry no statistics).
        senders_only: π̄ over the senders of each coordinate (:class:`SendersMean`).
        device: where the sums live.

    >>> from fedlightning.compression.gated_sparse import pack_gate_state
    >>> agg = GatedUploadSums(dim=2, group_sizes=[2], num_groups=0, pi_min=0.0, senders_only=False)
    >>> th, pi = torch.tensor([[2.0, 0.0], [4.0, 1.0]]), torch.tensor([[0.5, 0.0], [1.0, 0.8]])
    >>> for k, (w, lam) in enumerate([(1.0, 1.0), (3.0, 3.0)]):  # the aggregate_gated_uploads example, λ too
    ...     agg.accumulate(pack_gate_state(th[k], pi[k], pi[k] > 0, lam), weight=w)
    >>> [t.tolist() for t in agg.result()]
    [[3.5, 1.0], [0.875, 0.6000000238418579], [2.5]]
    """

    def __init__(
        self,
        *,
        dim: int,
        group_sizes: list[int],
        num_groups: int,
        pi_min: float,
        senders_only: bool,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        if num_groups not in (0, len(group_sizes)) or sum(group_sizes) != dim:
            raise ValueError(f"{num_groups} statistics for parameter tensors of sizes {group_sizes} (|θ| = {dim}).")
        self.dim = int(dim)
        self.group_sizes = list(group_sizes)
        self.num_groups = int(num_groups)
        self.pi_min = float(pi_min)
        self.senders_only = senders_only
        self.sums = torch.zeros(4 * self.dim + 2, dtype=torch.float64, device=device)

    @property
    def message_numel(self) -> int:
        """Entries of one decoded message: [θ̃ (d), π (d), π_off (groups), λ]."""
        return 2 * self.dim + self.num_groups + 1

    def accumulate(self, decoded: Tensor, *, weight: float) -> None:
        flat = decoded.reshape(-1)
        if flat.numel() != self.message_numel:
            raise ValueError(
                f"An E-FLoPS message of {flat.numel()} entries reached the sums of "
                f"{self.message_numel}-entry messages (|θ| = {self.dim})."
            )
        d, w = self.dim, float(weight)
        theta, pi, sent, pi_off, lam = unpack_gate_state(flat, self.num_groups)
        if self.num_groups:  # a non-sender of j counts at its own statistic of j's tensor
            fill = expand_groups(pi_off.clamp(self.pi_min, 1.0), self.group_sizes)
        else:
            fill = torch.full_like(pi, self.pi_min)
        s = sent.to(self.sums)
        self.sums[:d].add_(s * theta.to(self.sums), alpha=w)
        self.sums[d : 2 * d].add_(s, alpha=w)
        self.sums[2 * d : 3 * d].add_(s * pi.to(self.sums), alpha=w)
        self.sums[3 * d : 4 * d].add_((1.0 - s) * fill.to(self.sums), alpha=w)
        self.sums[4 * d] += w * float(lam)
        self.sums[4 * d + 1] += w
        self.count += 1

    def result(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
        """(θ̃, π̄, λ) of the rebuilt global state (λ as a 1-vector)."""
        d = self.dim
        total = self.sums[4 * d + 1]
        if float(total) <= 0:
            raise ValueError("No upload reached the aggregator this round.")
        theta_sum, mass, pi_sum, unsent = torch.split(self.sums[: 4 * d], d)
        sent = mass > 0
        theta = torch.where(sent, theta_sum / mass.clamp_min(1e-300), torch.zeros_like(mass))
        if self.senders_only:  # π̄_j as θ̃_j: mean over the senders; the fill only where nobody sent j
            pi = torch.where(sent, pi_sum / mass.clamp_min(1e-300), unsent / total)
        else:
            pi = (pi_sum + unsent) / total
        lagrange = (self.sums[4 * d] / total).reshape(1)
        return theta.to(dtype), pi.to(dtype), lagrange.to(dtype)
