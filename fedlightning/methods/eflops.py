"""E-FLoPS: entropy-regularised federated learning with probabilistic gates (arXiv 2607.00275).

Every parameter j has a hard-concrete gate z_j with parameter φ_j = log α_j (Louizos et al.,
arXiv 1712.01312) and the network uses θ = θ̃ ⊙ z. Each client runs local SGD on θ̃ and φ for

    L = (1/n_k) Σ_i ℓ(h(x_i; θ̃ ⊙ z), y_i) + λ c(φ) + T_t (1/|θ|) Σ_j KL(q(z_j) ‖ p(z_j)),

one gate sample per mini-batch, with the L0 density constraint c = D(φ) − ρ, D(φ) =
(1/|θ|) Σ_j P(z_j ≠ 0), and after every step λ ← λ + η_λ c (:func:`dual_ascent_step`). The multiplier enforces a
user-given *target* density, so the constraint is D = ρ and λ is free in sign
(``constraint="inequality"``: D ≤ ρ, λ ≥ 0). q(z_j) = Bernoulli(P(z_j ≠ 0)), p = Bernoulli(ρ)
(``prior``); T_t follows ``temperature_schedule`` (:func:`annealed_temperature`; the text names
no schedule, so the default is constant).

Communication: every message carries the top-m coordinates, m = ⌊ρ |θ|⌋ (index-coded
positions, θ̃ and π = P(z ≠ 0) as float32; coordinates of score 0 are never sent) and λ; with
``support_allocation="per_tensor"`` each parameter tensor contributes its own top ⌊ρ n_t⌋
(:func:`per_tensor_budgets`) instead of one global top m. A
gate no message carries is closed on both sides (``off_support_gates="closed"``; round 1 starts
from the shared open initial gates with λ held), so D counts the gates the model holds. The
server rebuilds θ̃ and π̄ as sample-weighted means over the senders and recovers log α from π̄.
The evaluated network is θ̃ ⊙ E[z] pruned to its m largest magnitudes (per tensor, under
the same allocation).

Departures from the text are named options, measured in ``benchmarks/results/eflops.md``:
``constraint_scale``, ``penalty`` (augmented Lagrangian), ``density_estimator="expected_gate"``,
``prior="uniform"``, ``off_support_gates="resume"`` / ``"regrow"``, ``support_allocation="per_tensor"``
and an Adam optimiser.

On the ``vectorised`` backend a process's clients train at once on stacked (θ̃, log α, λ)
(:mod:`fedlightning.methods.eflops_stacked`), as :meth:`EFLoPS.client_update` trains each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.callbacks.sparse_report import SparseModelReport
from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.index_coding import read_positions, write_positions
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, Estimator
from fedlightning.federated.message import Message
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER
from fedlightning.methods import eflops_stacked
from fedlightning.metrics.sparse_report import unflatten
from fedlightning.metrics.sparsity import num_kept, top_m_mask
from fedlightning.models.hard_concrete import HardConcrete, bernoulli_kl, uniform_noise

__all__ = [
    "CONSTRAINT_SCALES",
    "DENSITY_ESTIMATORS",
    "SUPPORT_ALLOCATIONS",
    "TEMPERATURE_SCHEDULES",
    "EFLoPS",
    "GateMessageCodec",
    "GatedUploadSums",
    "aggregate_gated_uploads",
    "allocated_top_m_mask",
    "annealed_temperature",
    "dual_ascent_step",
    "expand_groups",
    "gated_top_m",
    "kl_to_constraint_pull",
    "nonzero_top_m_mask",
    "off_support_means",
    "pack_gate_state",
    "per_tensor_budgets",
    "regrow_candidates",
    "unpack_gate_state",
]


def pack_gate_state(
    theta: Tensor, pi: Tensor, support: Tensor, lagrange: float | Tensor, pi_off: Tensor | None = None
) -> Tensor:
    """The logical message [θ̃ on S, π on S, π_off per group, λ] as one flat tensor.

    Zeros off S (π > 0 on S). ``pi_off`` (one value per parameter tensor, the mean P(z ≠ 0)
    of that tensor's coordinates outside S) is omitted when None (the ``"reset"`` variant).
    """
    s = support.to(theta.dtype)
    lam = torch.as_tensor(lagrange, dtype=theta.dtype, device=theta.device).reshape(1)
    off = theta.new_zeros(0) if pi_off is None else pi_off.to(theta.dtype).reshape(-1)
    return torch.cat([theta * s, pi * s, off, lam])


def unpack_gate_state(flat: Tensor, num_groups: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Inverse of :func:`pack_gate_state`: ``(theta, pi, support, pi_off, lagrange)``."""
    dim = (flat.numel() - 1 - num_groups) // 2
    theta, pi = flat[:dim], flat[dim : 2 * dim]
    pi_off, lam = flat[2 * dim : 2 * dim + num_groups], flat[-1]
    return theta, pi, pi > 0, pi_off, lam


def off_support_means(pi: Tensor, support: Tensor, sizes: list[int], fallback: float) -> Tensor:
    """Mean of ``pi`` over the coordinates outside ``support``, per group of ``sizes`` coordinates.

    A group entirely inside the support gets ``fallback``.

    >>> import torch
    >>> pi = torch.tensor([0.9, 0.1, 0.3, 0.8, 0.2]); s = torch.tensor([True, False, False, True, True])
    >>> [round(v, 4) for v in off_support_means(pi, s, [3, 2], 0.5).tolist()]
    [0.2, 0.5]
    """
    out = []
    for p, sup in zip(torch.split(pi, sizes), torch.split(support, sizes), strict=True):
        off = ~sup
        out.append(p[off].mean() if off.any() else p.new_tensor(fallback))
    return torch.stack(out)


def expand_groups(values: Tensor, sizes: list[int]) -> Tensor:
    """One value per group, repeated over the group's coordinates.

    >>> import torch
    >>> expand_groups(torch.tensor([1.0, 2.0]), [2, 1]).tolist()
    [1.0, 1.0, 2.0]
    """
    return torch.repeat_interleave(values, torch.tensor(sizes, device=values.device))


def log_constraint(density: Tensor, rho: float) -> Tensor:
    """c = log D − log ρ (``constraint_scale="log"``): over- and undershoot by a factor move λ alike."""
    return torch.log(density) - math.log(rho)


def relative_constraint(density: Tensor, rho: float) -> Tensor:
    """c = D/ρ − 1 (``"relative"``): a density at ρ/2 moves λ as fast as one at 1.5 ρ."""
    return density / rho - 1.0


def absolute_constraint(density: Tensor, rho: float) -> Tensor:
    """c = D − ρ (``"absolute"``): dual steps below the target are ρ times smaller than the overshoot above it."""
    return density - rho


CONSTRAINT_SCALES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "log": log_constraint,
    "relative": relative_constraint,
    "absolute": absolute_constraint,
}
"""``constraint_scale`` → c(D, ρ); one feasible set (c ≤ 0 iff D ≤ ρ), different dual dynamics.

>>> [round(float(CONSTRAINT_SCALES[k](torch.tensor(0.04), 0.02)), 4) for k in ("log", "relative", "absolute")]
[0.6931, 1.0, 0.02]
"""


def dual_ascent_step(lagrange: float, constraint: float, lr: float, *, nonnegative: bool) -> float:
    """λ ← λ + η_λ c, projected on λ ≥ 0 when ``nonnegative`` (the inequality D ≤ ρ).

    >>> dual_ascent_step(0.5, 0.2, 2.0, nonnegative=False), dual_ascent_step(0.1, -0.2, 1.0, nonnegative=True)
    (0.9, 0.0)
    """
    new = lagrange + lr * constraint
    return max(0.0, new) if nonnegative else new


TEMPERATURE_SCHEDULES = ("constant", "linear", "cosine")
"""``temperature_schedule``: T_t = T, T (1 − s) or T (1 + cos π s)/2 with s = (t − 1)/(R − 1)."""


def annealed_temperature(temperature: float, *, round_idx: int, rounds: int, schedule: str) -> float:
    """T_t of round ``round_idx`` (numbered from 1) of ``rounds``: T at round 1, 0 at round R unless constant.

    >>> [annealed_temperature(0.4, round_idx=t, rounds=3, schedule="linear") for t in (1, 2, 3)]
    [0.4, 0.2, 0.0]
    >>> round(annealed_temperature(0.4, round_idx=2, rounds=3, schedule="cosine"), 6)
    0.2
    >>> annealed_temperature(0.4, round_idx=3, rounds=3, schedule="constant")
    0.4
    """
    if schedule == "constant" or rounds <= 1:
        return temperature
    s = min(max((round_idx - 1) / (rounds - 1), 0.0), 1.0)
    if schedule == "linear":
        return temperature * (1.0 - s)
    if schedule == "cosine":
        return temperature * 0.5 * (1.0 + math.cos(math.pi * s))
    raise ValueError(f"unknown temperature schedule {schedule!r}; choose one of {', '.join(TEMPERATURE_SCHEDULES)}")


def kl_to_constraint_pull(pi: Tensor, lagrange: float, temperature: float, prior: float) -> Tensor:
    """|∂(T · KL)/∂π_j| / |∂(λ c)/∂π_j| per gate, for c = D − ρ and the mean KL to Bernoulli(``prior``).

    Both terms are means over |θ|, so the factor 1/|θ| (and ∂π_j/∂φ_j) cancels and the ratio is
    T |logit π_j − logit p| / |λ|: how strongly the entropy term pulls a gate relative to the
    density constraint (inf where λ = 0).

    >>> import torch
    >>> [round(v, 4) for v in kl_to_constraint_pull(torch.tensor([0.5, 0.9]), -2.0, 0.1, 0.5).tolist()]
    [0.0, 0.1099]
    """
    p = torch.as_tensor(prior, dtype=pi.dtype, device=pi.device)
    q = pi.clamp(1e-7, 1.0 - 1e-7)
    pull = temperature * (torch.logit(q) - torch.logit(p)).abs()
    return pull / abs(lagrange) if lagrange != 0 else torch.full_like(pull, math.inf)


def regrow_candidates(
    theta: Tensor, log_alpha: Tensor, closed: Tensor, grad_mean: Tensor, lr: float, log_alpha_open: float
) -> tuple[Tensor, Tensor]:
    """(θ̃, log α) with every ``closed`` coordinate replaced by its regrowth candidate.

    A closed gate (z_j = 0) passes no gradient to θ̃_j, but the data loss still has a gradient
    g_j = ∂ℓ/∂θ_j at the effective weight θ_j = θ̃_j z_j = 0. Its candidate is one SGD step
    from an open gate, θ̃_j − η ḡ_j with ḡ_j the mean of g_j over the local steps, at the
    shared initial gate ``log_alpha_open``; it then competes for the top m like any other
    coordinate (a gradient regrowth in the spirit of RigL, arXiv 1911.11134).

    >>> import torch
    >>> th, la = torch.tensor([1.0, 0.25]), torch.tensor([3.0, -10.0])
    >>> t, a = regrow_candidates(th, la, torch.tensor([False, True]), torch.tensor([5.0, -4.0]), 0.5, 0.0)
    >>> t.tolist(), a.tolist()
    ([1.0, 2.25], [3.0, 0.0])
    """
    theta_new = torch.where(closed, theta - lr * grad_mean, theta)
    log_alpha_new = torch.where(closed, torch.full_like(log_alpha, log_alpha_open), log_alpha)
    return theta_new, log_alpha_new


def nonzero_top_m_mask(scores: Tensor, m: int) -> Tensor:
    """The ``m`` largest |scores| among the non-zero ones (fewer when fewer are non-zero).

    A score of 0 carries nothing, so it is never selected: ties at zero do not fill the
    support with the lowest indices.

    >>> import torch
    >>> nonzero_top_m_mask(torch.tensor([0.0, 0.0, 2.0, -1.0, 0.0]), 3).tolist()
    [False, False, True, True, False]
    """
    return top_m_mask(scores, m) & (scores != 0)


SUPPORT_ALLOCATIONS = ("global", "per_tensor")
"""``support_allocation``: one top m over all of θ (``"global"``) or a top-k_t inside each parameter tensor."""


def per_tensor_budgets(sizes: list[int], rho: float, m: int) -> list[int]:
    """k_t = max(1, ⌊ρ n_t⌋) coordinates for each parameter tensor t of n_t entries, Σ_t k_t ≤ m.

    Σ_t ⌊ρ n_t⌋ ≤ ⌊ρ Σ_t n_t⌋ = m; only the minimum of one coordinate per tensor can push the total above m,
    and then the largest budgets (the lower index among equal ones) give one coordinate back each
    until the total is m. Layers whose initial weights scale as 1/√fan-in keep their share of
    the support, which a single global ranking of magnitudes would hand to the small layers.

    Raises:
        ValueError: if there are more tensors than m (one coordinate each does not fit).

    >>> per_tensor_budgets([800, 32, 1000], 0.02, 36)
    [16, 1, 19]
    >>> per_tensor_budgets([10, 10, 100], 0.05, 6)
    [1, 1, 4]
    """
    if len(sizes) > m:
        raise ValueError(f"{len(sizes)} parameter tensors cannot keep one coordinate each within m = {m}")
    budgets = [max(1, math.floor(rho * n + 1e-9)) for n in sizes]
    while sum(budgets) > m:
        i = max(range(len(budgets)), key=lambda t: (budgets[t], -t))
        budgets[i] -= 1
    return budgets


def allocated_top_m_mask(scores: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
    """:func:`nonzero_top_m_mask` inside each group of ``sizes`` coordinates, ``budgets[t]`` in group t.

    >>> import torch
    >>> s = torch.tensor([0.9, 0.8, 0.7, 0.05, 0.0, 0.01])
    >>> allocated_top_m_mask(s, [1, 2], [3, 3]).tolist()
    [True, False, False, True, False, True]
    """
    parts = [nonzero_top_m_mask(chunk, k) for chunk, k in zip(torch.split(scores, sizes), budgets, strict=True)]
    return torch.cat(parts) if parts else torch.zeros_like(scores, dtype=torch.bool)


def prob_nonzero_density(hc: HardConcrete, log_alpha: Tensor, nodes: int) -> Tensor:
    """D(φ) = mean_j P(z_j ≠ 0), the closed-form L0 surrogate (Louizos et al., arXiv 1712.01312)."""
    return hc.prob_nonzero(log_alpha).mean()


def expected_gate_density(hc: HardConcrete, log_alpha: Tensor, nodes: int) -> Tensor:
    """D(φ) = mean_j E[z_j] by the midpoint rule over u with ``nodes`` points (the FLoPS text, arXiv 2512.23071)."""
    return hc.expected_gate(log_alpha, nodes=nodes).mean()


DENSITY_ESTIMATORS: dict[str, Callable[[HardConcrete, Tensor, int], Tensor]] = {
    "prob_nonzero": prob_nonzero_density,
    "expected_gate": expected_gate_density,
}
"""``density_estimator`` → D(hc, log α, quadrature nodes), differentiable in log α."""


class GateMessageCodec:
    """Bit-exact wire format of an E-FLoPS message.

    Stream: the index-coded positions of the support S (``write_positions``), then θ̃_S and
    π_S as float32, then the ``num_groups`` off-support statistics π_off (float32 each, one per
    parameter tensor; none in the ``"reset"`` variant), then λ as float32. ``header_bits``
    covers the position header, π_off and λ.

    Args:
        num_groups: number of per-tensor off-support statistics in every message.

    >>> import torch
    >>> theta = torch.tensor([0.0, 1.5, 0.0, -2.0]); pi = torch.tensor([0.0, 0.9, 0.0, 0.6])
    >>> x = pack_gate_state(theta, pi, pi > 0, 0.25)
    >>> msg = GateMessageCodec().encode(x)
    >>> torch.equal(msg.decode(), x), msg.num_bits - 32 * 5 > 0
    (True, True)
    """

    name = "eflops_gates"

    def __init__(self, *, num_groups: int = 0) -> None:
        self.num_groups = int(num_groups)

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
        theta, pi, support, pi_off, lam = unpack_gate_state(flat, self.num_groups)
        positions = torch.nonzero(support, as_tuple=True)[0]
        w = BitWriter()
        header = write_positions(w, positions, theta.numel())
        w.write_array(theta[positions].numpy().view(np.uint32), 32)
        w.write_array(pi[positions].numpy().view(np.uint32), 32)
        if self.num_groups:
            w.write_array(pi_off.contiguous().numpy().view(np.uint32), 32)
        w.write_array(lam.reshape(1).numpy().view(np.uint32), 32)
        payload, n = w.getvalue()
        extra = 32 * (self.num_groups + 1)
        return Message(payload=payload, num_bits=n, codec=self, shape=tuple(x.shape), header_bits=header + extra)

    def decode(self, message: Message) -> Tensor:
        total = math.prod(message.shape)
        dim = (total - 1 - self.num_groups) // 2
        r = BitReader(message.payload, message.num_bits, codec=self.name)
        if total != 2 * dim + self.num_groups + 1 or dim < 0:
            raise r.error(f"a shape of {total} entries is not 2 d + {self.num_groups} + 1 for any dimension d")
        positions = torch.from_numpy(read_positions(r, dim))
        k = positions.numel()
        theta_s = r.read_array(k, 32).astype(np.uint32).view(np.float32)
        pi_s = r.read_array(k, 32).astype(np.uint32).view(np.float32)
        pi_off = r.read_array(self.num_groups, 32).astype(np.uint32).view(np.float32) if self.num_groups else None
        lam = r.read_array(1, 32).astype(np.uint32).view(np.float32)
        if r.remaining:
            raise r.error(f"{r.remaining} bits are left after decoding")
        values = np.concatenate([theta_s, pi_s, pi_off if pi_off is not None else pi_s[:0], lam])
        if not np.isfinite(values).all():
            raise r.error("a parameter, gate probability or multiplier is not finite")
        probabilities = np.concatenate([pi_s, pi_off if pi_off is not None else pi_s[:0]])
        if ((probabilities < 0) | (probabilities > 1)).any():
            raise r.error("a gate probability lies outside [0, 1]")
        out = torch.zeros(total, dtype=torch.float32)
        out[positions] = torch.from_numpy(theta_s.copy())
        out[dim + positions] = torch.from_numpy(pi_s.copy())
        if pi_off is not None:
            out[2 * dim : 2 * dim + self.num_groups] = torch.from_numpy(pi_off.copy())
        out[-1] = float(lam[0])
        return out.reshape(message.shape)


def aggregate_gated_uploads(
    thetas: Tensor, pis: Tensor, weights: Tensor, pi_unsent: float | Tensor, *, senders_only: bool = False
) -> tuple[Tensor, Tensor]:
    """Server rebuild of (θ̃, π̄) from K sparse uploads stacked as (K, d) rows.

    θ̃_j is the weighted mean over the clients that sent j (π_kj > 0), 0 if none did;
    π̄_j = Σ_k w_k π_kj with π_kj := ``pi_unsent`` where client k did not send j (a scalar,
    or a tensor broadcastable to (K, d): client k's own off-support statistic). With
    ``senders_only`` π̄_j is instead the weighted mean over the senders of j, like θ̃_j, and
    the fill is used only for coordinates nobody sent. ``weights`` sum to one.

    >>> import torch
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
        num_groups: statistics per message (``len(group_sizes)``, or 0 for ``"reset"``).
        pi_min: the floor of π (and the fill when messages carry no statistics).
        senders_only: ``gate_aggregation="senders"``.
        device: where the sums live.

    >>> import torch
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


def gated_top_m(theta: Tensor, gate: Tensor, m: int) -> Tensor:
    """θ ⊙ g on the ``m`` coordinates of largest |θ ⊙ g|, zeros elsewhere (ties: lower index).

    >>> import torch
    >>> gated_top_m(torch.tensor([2.0, -3.0, 0.5, 1.0]), torch.tensor([0.9, 0.1, 0.8, 0.5]), 2).tolist()
    [1.7999999523162842, 0.0, 0.0, 0.5]
    """
    weighted = theta * gate
    return torch.where(top_m_mask(weighted, m), weighted, torch.zeros_like(weighted))


@dataclass
class _LocalGates:
    """One client's local-training state in :meth:`EFLoPS.client_update` (shared by the loss and the dual step)."""

    names: list[str]
    sizes: list[int]
    lagrange: float
    data_loss_sum: Tensor
    density: Tensor | None = None
    gated: list[Tensor] = field(default_factory=list)


class EFLoPS(FederatedModule):
    """E-FLoPS with hard-concrete gates, an L0 density constraint by dual ascent, and a KL term.

    Args:
        density: target density ρ (``method.density``); m = ⌊ρ |θ|⌋ coordinates are sent.
        temperature: weight T of the KL (relative-entropy) regulariser at round 1.
        temperature_schedule: ``"constant"`` (default), ``"linear"`` or ``"cosine"`` decay to 0
            at the last round (:func:`annealed_temperature`).
        prior: p(z_j) = Bernoulli(ρ) (``"target"``) or Bernoulli(1/2) (``"uniform"``: the KL is
            log 2 minus the gate entropy).
        density_estimator: D = mean P(z ≠ 0) (``"prob_nonzero"``, closed form) or mean E[z]
            (``"expected_gate"``, midpoint quadrature with ``quadrature_nodes`` nodes).
        quadrature_nodes: midpoints for ``expected_gate`` and for E[z] of the evaluated network.
        lambda_lr: dual-ascent step η_λ of the Lagrange multiplier.
        lambda_init: initial λ.
        log_alpha_lr: learning rate of the gate parameters (a second group of ``client_optimizer``).
        log_alpha_init: initial log α (0: P(z ≠ 0) = 0.83).
        log_alpha_min: lower clamp of log α (Louizos' −4.6 would floor P(z ≠ 0) at 0.047 > ρ).
        log_alpha_max: upper clamp of log α.
        selection: top-m score, |θ̃| P(z ≠ 0) (``"expected_magnitude"``) or |θ̃ ⊙ ẑ| with the
            test-time gate (``"test_gate"``).
        off_support: θ̃ off the broadcast support: its initial value (``"init"``, from the shared
            seed, no bits) or 0 (``"zero"``).
        constraint: ``"equality"`` (D = ρ, λ free in sign) or ``"inequality"`` (D ≤ ρ, λ ≥ 0).
        off_support_gates: ``"closed"`` (a gate no message carries is closed, log α = ``log_alpha_min``,
            on both sides; in round 1 every gate starts at ``log_alpha_init`` and λ is held, a
            screening round), ``"regrow"`` (as ``"closed"``, and a closed coordinate re-enters the
            upload when one SGD step of its mean gradient, at the initial gate, beats the m-th score:
            :func:`regrow_candidates`; needs an SGD ``client_optimizer``; the server closes every
            gate outside its own top m after the rebuild), ``"resume"`` (one
            off-support mean π per tensor in every message) or
            ``"reset"`` (off-support log α restarts at ``log_alpha_init``, non-senders count as closed).
        constraint_scale: c = D − ρ (``"absolute"``, the text), D/ρ − 1 (``"relative"``) or
            log D − log ρ (``"log"``).
        gate_aggregation: π̄_j averaged over the senders of j (``"senders"``) or all clients (``"all"``).
        penalty: μ of the augmented-Lagrangian term (μ/2) c² (0: the plain Lagrangian of the text).
        final_support: ``"top_m"`` (the m largest |θ̃ ⊙ E[z]|) or ``"test_gate"`` (top-m by
            ``selection`` times the test-time gate).
        support_allocation: how the top m is drawn, for the messages, the server's regrow
            rebuild and the final support alike: ``"global"`` (one ranking over all of θ) or
            ``"per_tensor"`` (the top k_t = max(1, ⌊ρ n_t⌋) of each parameter tensor by the same
            score, Σ k_t ≤ m: :func:`per_tensor_budgets`).
        **kwargs: the :class:`FederatedModule` arguments (no ``server_optimizer``: the server
            sets its rebuilt state).
    """

    uplink_payload = Payload.GATED_SPARSE
    downlink_payload = Payload.GATED_SPARSE
    sets_server_state = True
    client_weighting = "samples"
    stateless_clients = True  # weights and gates start from the broadcast; the dual variable is the server's
    supported_aggregation: ClassVar[tuple[Estimator, ...]] = ("normalised",)
    """A rebuilt state is a mean of the clients' states: dividing by p_i would rescale it."""
    client_metric_names = ("eflops/local_density",)

    def __init__(
        self,
        *,
        density: float,
        temperature: float = 1e-3,
        temperature_schedule: Literal["constant", "linear", "cosine"] = "constant",
        prior: Literal["target", "uniform"] = "target",
        density_estimator: Literal["prob_nonzero", "expected_gate"] = "prob_nonzero",
        quadrature_nodes: int = 32,
        lambda_lr: float = 0.0005,
        lambda_init: float = 0.0,
        log_alpha_lr: float = 0.05,
        log_alpha_init: float = 0.0,
        log_alpha_min: float = -10.0,
        log_alpha_max: float = 10.0,
        selection: Literal["expected_magnitude", "test_gate"] = "expected_magnitude",
        off_support: Literal["init", "zero"] = "init",
        constraint: Literal["inequality", "equality"] = "equality",
        off_support_gates: Literal["closed", "regrow", "resume", "reset"] = "closed",
        constraint_scale: Literal["log", "relative", "absolute"] = "absolute",
        gate_aggregation: Literal["senders", "all"] = "senders",
        penalty: float = 0.0,
        final_support: Literal["top_m", "test_gate"] = "top_m",
        support_allocation: Literal["global", "per_tensor"] = "global",
        **kwargs: Any,
    ) -> None:
        model: nn.Module = kwargs["model"]
        dim = num_parameters(model)
        try:
            m = num_kept(density, dim)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        choices: dict[str, tuple[str, tuple[str, ...]]] = {
            "prior": (prior, ("target", "uniform")),
            "temperature_schedule": (temperature_schedule, TEMPERATURE_SCHEDULES),
            "density_estimator": (density_estimator, tuple(DENSITY_ESTIMATORS)),
            "selection": (selection, ("expected_magnitude", "test_gate")),
            "off_support": (off_support, ("init", "zero")),
            "constraint": (constraint, ("inequality", "equality")),
            "off_support_gates": (off_support_gates, ("closed", "regrow", "resume", "reset")),
            "constraint_scale": (constraint_scale, tuple(CONSTRAINT_SCALES)),
            "gate_aggregation": (gate_aggregation, ("senders", "all")),
            "final_support": (final_support, ("top_m", "test_gate")),
            "support_allocation": (support_allocation, SUPPORT_ALLOCATIONS),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"method.{key}={value!r} is unknown; choose one of {', '.join(allowed)}.")
        if temperature < 0 or lambda_lr < 0 or lambda_init < 0 or penalty < 0:
            raise ConfigError(
                "method.temperature, method.lambda_lr, method.lambda_init and method.penalty must be >= 0."
            )
        factory = kwargs.get("client_optimizer")
        if off_support_gates == "regrow" and getattr(factory, "func", torch.optim.SGD) is not torch.optim.SGD:
            raise ConfigError(
                "method.off_support_gates=regrow predicts a closed coordinate's weight by plain SGD steps; "
                "use method.client_optimizer._target_=torch.optim.SGD or another off_support_gates."
            )
        group_sizes = [p.numel() for p in model.parameters()]
        budgets = [m]
        if support_allocation == "per_tensor":
            try:
                budgets = per_tensor_budgets(group_sizes, float(density), m)
            except ValueError as exc:
                raise ConfigError(
                    f"method.support_allocation=per_tensor: {exc}; raise method.density or use "
                    "method.support_allocation=global."
                ) from None
        if quadrature_nodes < 1:
            raise ConfigError(f"method.quadrature_nodes must be at least 1 (got {quadrature_nodes}).")
        try:
            self.hc = HardConcrete(log_alpha_min=log_alpha_min, log_alpha_max=log_alpha_max)
        except ValueError as exc:
            raise ConfigError(f"method.log_alpha_min/max: {exc}") from None
        super().__init__(**kwargs)
        self.rho = float(density)
        self.m = m
        self.dim = dim
        self.temperature = float(temperature)
        self.temperature_schedule = temperature_schedule
        self.prior = prior
        self.density_estimator = density_estimator
        self._density = DENSITY_ESTIMATORS[density_estimator]
        self.quadrature_nodes = int(quadrature_nodes)
        self.lambda_lr = float(lambda_lr)
        self.log_alpha_lr = float(log_alpha_lr)
        self.log_alpha_init = float(min(max(log_alpha_init, log_alpha_min), log_alpha_max))
        self.selection = selection
        self.off_support = off_support
        self.constraint = constraint
        self.off_support_gates = off_support_gates
        self.constraint_scale = constraint_scale
        self._constraint = CONSTRAINT_SCALES[constraint_scale]
        self.gate_aggregation = gate_aggregation
        self.penalty = float(penalty)
        self.final_support = final_support
        self.group_sizes = group_sizes
        self.support_allocation = support_allocation
        self.support_budgets = budgets  # coordinates each tensor may send ([m] for "global")
        self.num_groups = len(self.group_sizes) if off_support_gates == "resume" else 0
        self.uplink_channel.codec = GateMessageCodec(num_groups=self.num_groups)
        self.downlink_channel.codec = GateMessageCodec(num_groups=self.num_groups)
        self.pi_min = float(self.hc.prob_nonzero(torch.tensor(float(log_alpha_min))))
        # θ̃⁰ is derived from the shared run seed (the model was built from it): free for both sides.
        self.register_buffer("theta_init", flat_parameters(model).clone(), persistent=False)
        noise = torch.randn(dim, generator=self.generator(0, SERVER, "log_alpha_init")) * 0.01  # Louizos: N(·, 0.01²)
        self.log_alpha = nn.Parameter(self.hc.clamp_(torch.full((dim,), self.log_alpha_init) + noise))
        self.lagrange = nn.Parameter(torch.tensor([float(lambda_init)]))
        self._eval_cache: tuple[int, Tensor] | None = None

    @property
    def dense_message_bits(self) -> int:
        """Reference for compression factors: one dense float32 copy of the network θ."""
        return 32 * self.dim

    @property
    def uplink_numel(self) -> int:
        """Entries of one (decoded) message: [θ̃ (|θ|), π (|θ|), π_off (one per tensor, ``"resume"``), λ]."""
        return 2 * self.dim + self.num_groups + 1

    # ------------------------------------------------------------------ gate maths
    def density_estimate(self, log_alpha: Tensor) -> Tensor:
        """D(φ): the differentiable estimate of the expected fraction of open gates (``density_estimator``)."""
        return self._density(self.hc, log_alpha, self.quadrature_nodes)

    def constraint_value(self, density: Tensor) -> Tensor:
        """c(φ) for the density D under ``constraint_scale`` (:data:`CONSTRAINT_SCALES`)."""
        return self._constraint(density, self.rho)

    def temperature_at(self, round_idx: int) -> float:
        """T_t of the engine's ``round_idx`` (0 for round 1) under ``temperature_schedule``."""
        trainer = self.attached_trainer
        rounds = int(trainer.max_steps) if trainer is not None and trainer.max_steps and trainer.max_steps > 0 else 1
        return annealed_temperature(
            self.temperature, round_idx=round_idx + 1, rounds=rounds, schedule=self.temperature_schedule
        )

    def kl_term(self, log_alpha: Tensor) -> Tensor:
        """(1/|θ|) Σ_j KL(Bernoulli(P(z_j ≠ 0)) ‖ prior)."""
        p = self.rho if self.prior == "target" else 0.5
        return bernoulli_kl(self.hc.prob_nonzero(log_alpha), p).mean()

    def selection_scores(self, theta: Tensor, log_alpha: Tensor) -> Tensor:
        """Score of each coordinate for the top-m support."""
        if self.selection == "test_gate":
            return (theta * self.hc.test_gate(log_alpha)).abs()
        return theta.abs() * self.hc.prob_nonzero(log_alpha)

    def support_mask(self, scores: Tensor) -> Tensor:
        """The top-m support of ``scores`` under ``support_allocation`` (never a score of 0)."""
        if self.support_allocation == "per_tensor":
            return allocated_top_m_mask(scores, self.support_budgets, self.group_sizes)
        return nonzero_top_m_mask(scores, self.m)

    def upload_message(self, theta: Tensor, log_alpha: Tensor, lagrange: Tensor) -> Tensor:
        """The gate-state message of (θ̃, log α, λ): the top-m support, its values and gate probabilities."""
        support = self.support_mask(self.selection_scores(theta, log_alpha))
        pi = self.hc.prob_nonzero(log_alpha)
        pi_off = off_support_means(pi, support, self.group_sizes, self.pi_min) if self.num_groups else None
        return pack_gate_state(theta, pi, support, lagrange, pi_off)

    def _off_support_log_alpha(self, pi_off: Tensor, like: Tensor, round_idx: int = 1) -> Tensor:
        """log α that a coordinate outside the support takes (and its π when counted by the server)."""
        if self.off_support_gates in ("closed", "regrow"):  # closed, except the shared initial state of round 1
            return torch.full_like(like, self.log_alpha_init if round_idx < 1 else self.hc.log_alpha_min)
        if not self.num_groups:
            return torch.full_like(like, self.log_alpha_init)
        pi = expand_groups(pi_off.clamp(self.pi_min, 1.0 - 1e-7), self.group_sizes)
        return self.hc.log_alpha_from_prob_nonzero(pi.to(like))

    # ------------------------------------------------------------------ server
    def server_parameters(self) -> list[nn.Parameter]:
        return [*self.model.parameters(), self.log_alpha, self.lagrange]

    def broadcast_state(self, round_idx: int) -> Tensor:
        return self.upload_message(flat_parameters(self.model), self.log_alpha.detach(), self.lagrange.detach())

    def make_aggregator(self, round_idx: int) -> GatedUploadSums:
        return GatedUploadSums(
            dim=self.dim,
            group_sizes=self.group_sizes,
            num_groups=self.num_groups,
            pi_min=self.pi_min,
            senders_only=self.gate_aggregation == "senders",
            device=self.device,
        )

    def set_server_state(self, *, round_idx: int, aggregator: Aggregator) -> None:
        """The rebuilt (θ̃, log α = inverse of π̄, λ) replaces the global state."""
        assert isinstance(aggregator, GatedUploadSums)
        theta, pi, lagrange = aggregator.result()
        assign_flat_(self.model, theta)
        with torch.no_grad():
            self.log_alpha.copy_(self.hc.log_alpha_from_prob_nonzero(pi.clamp(self.pi_min, 1.0 - 1e-7)))
            self.lagrange.copy_(lagrange)
            if self.off_support_gates == "regrow":  # clients may send different coordinates: keep the top m open
                keep = self.support_mask(self.selection_scores(theta, self.log_alpha))
                self.log_alpha.masked_fill_(~keep, self.hc.log_alpha_min)
        self._eval_cache = None

    def server_metrics(self, round_idx: int) -> dict[str, float]:
        """λ, D = mean P(z ≠ 0) and T_t of the server state; ``model/*`` (D, the median KL/constraint
        pull over the m most open gates) also reach the run summary as the last round's values."""
        pi = self.hc.prob_nonzero(self.log_alpha.detach())
        lam = float(self.lagrange.detach().squeeze())
        temperature = self.temperature_at(round_idx)
        prior = self.rho if self.prior == "target" else 0.5
        pull = kl_to_constraint_pull(torch.topk(pi, self.m).values, lam, temperature, prior)
        return {
            "eflops/lambda": lam,
            "eflops/mean_prob_nonzero": float(pi.mean()),
            "eflops/temperature": temperature,
            "model/expected_density": float(pi.mean()),
            "model/kl_pull_ratio": float(pull.median()),
        }

    # ------------------------------------------------------------------ client
    def client_start(self, received: Tensor, round_idx: int = 1) -> tuple[Tensor, Tensor, float]:
        """A client's starting (θ̃, log α, λ) rebuilt from the received gate-state message."""
        theta_s, pi, support, pi_off, lam = unpack_gate_state(received, self.num_groups)
        theta_init: Tensor = self.theta_init  # type: ignore[assignment]  # a registered buffer
        off = theta_init.to(received.device) if self.off_support == "init" else torch.zeros_like(theta_s)
        theta = torch.where(support, theta_s, off)
        log_alpha = self._off_support_log_alpha(pi_off, pi, round_idx)
        if support.any():
            log_alpha[support] = self.hc.log_alpha_from_prob_nonzero(pi[support])
        return theta, log_alpha, float(lam)

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local primal steps on (θ̃, log α) by :meth:`local_train`, dual ascent on λ after each step."""
        model = self.client_model
        theta, log_alpha0, lam = self.client_start(received, round_idx)
        assign_flat_(model, theta)
        model.train()
        log_alpha = log_alpha0.clone().requires_grad_(True)
        params = list(model.parameters())
        local = _LocalGates(
            names=[n for n, _ in model.named_parameters()],
            sizes=[p.numel() for p in params],
            lagrange=lam,
            data_loss_sum=torch.zeros((), device=self.device),
        )
        gate_gen = self.generator(round_idx, client_id, "gates")
        temperature = self.temperature_at(round_idx)
        screening = self.off_support_gates in ("closed", "regrow") and round_idx < 1
        closed = ~unpack_gate_state(received, self.num_groups)[2] if self.off_support_gates == "regrow" else None
        if closed is not None and round_idx < 1:
            closed = None  # round 1: every gate starts open, nothing to regrow
        grad_sum = torch.zeros(self.dim, device=self.device) if closed is not None else None

        def batch_loss(x: Tensor, y: Tensor) -> Tensor:
            """One gate sample per mini-batch; data loss + λ c + (μ/2) c² + T · KL."""
            u = uniform_noise((self.dim,), gate_gen).to(log_alpha.device)
            z = self.hc.sample(log_alpha, u)
            gated = {
                n: p * zj.view_as(p) for n, p, zj in zip(local.names, params, torch.split(z, local.sizes), strict=True)
            }
            if grad_sum is not None:  # keep ∂ℓ/∂θ at the closed coordinates (θ = 0 there)
                for g in gated.values():
                    g.retain_grad()
                local.gated = list(gated.values())
            data_loss = self.loss_fn(functional_call(model, gated, (x,)), y)
            dens = self.density_estimate(log_alpha)
            c = self.constraint_value(dens)
            loss = data_loss + local.lagrange * c
            if self.penalty > 0:  # augmented Lagrangian: damps the primal-dual oscillation
                c_pos = c if self.constraint == "equality" else c.clamp_min(0.0)
                loss = loss + 0.5 * self.penalty * c_pos**2
            if temperature > 0:
                loss = loss + temperature * self.kl_term(log_alpha)
            local.density = dens.detach()
            local.data_loss_sum += data_loss.detach()
            return loss

        def after_step() -> None:
            """Clamp log α, then λ ← λ + η_λ c(D) at the density of the step (λ ≥ 0 for the inequality)."""
            self.hc.clamp_(log_alpha)
            if grad_sum is not None:
                grads = [g.grad if g.grad is not None else torch.zeros_like(g) for g in local.gated]
                grad_sum.add_(torch.cat([g.reshape(-1) for g in grads]))
            assert local.density is not None
            c = float(self.constraint_value(local.density))
            if screening:  # round 1 of "closed": every gate open, a screening step; λ waits for the support
                return
            local.lagrange = dual_ascent_step(
                local.lagrange, c, self.lambda_lr, nonnegative=self.constraint == "inequality"
            )

        groups: list[dict[str, Any]] = [{"params": params}, {"params": [log_alpha], "lr": self.log_alpha_lr}]
        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=groups,
            batch_loss=batch_loss,
            after_step=after_step,
        )
        theta_out, log_alpha_out = flat_parameters(model), log_alpha.detach()
        if closed is not None and grad_sum is not None:
            if not isinstance(done.optimizer, torch.optim.SGD):
                raise ConfigError("method.off_support_gates=regrow needs an SGD client_optimizer.")
            theta_out, log_alpha_out = regrow_candidates(
                theta_out,
                log_alpha_out,
                closed,
                grad_sum / max(done.steps, 1),
                float(done.optimizer.param_groups[0]["lr"]),
                self.log_alpha_init,
            )
        upload = self.upload_message(theta_out, log_alpha_out, torch.tensor(local.lagrange))
        density = float(local.density) if local.density is not None else float("nan")
        return ClientResult(
            upload=upload,
            num_samples=done.num_samples,
            loss=local.data_loss_sum / max(done.steps, 1),  # the data term: train/loss compares across methods
            metrics={"eflops/local_density": density},
        )

    # ------------------------------------------------------------------ stacked clients (vectorised backend)
    def stacked_refusal(self) -> str | None:
        """Why the share cannot be trained at once as :meth:`client_update` trains each client (``None``: it can).

        See :func:`fedlightning.methods.eflops_stacked.stacked_refusal`.
        """
        return eflops_stacked.stacked_refusal(self)

    def stacked_client_updates(self, *, round_idx: int, share: list[int], received: Tensor) -> list[ClientResult]:
        """:meth:`client_update` of every client of ``share`` at once on stacked (θ̃, log α, λ).

        See :func:`fedlightning.methods.eflops_stacked.stacked_client_updates`.
        """
        return eflops_stacked.stacked_client_updates(self, round_idx=round_idx, share=share, received=received)

    # ------------------------------------------------------------------ evaluation
    def final_parameters(self, theta: Tensor, log_alpha: Tensor) -> Tensor:
        """The evaluated network for global (θ̃, log α) under ``final_support`` (see module docstring)."""
        if self.final_support == "top_m":
            gate = self.hc.expected_gate_tail(log_alpha, nodes=self.quadrature_nodes)
            if self.support_allocation == "global":
                return gated_top_m(theta, gate, self.m)
            weighted = theta * gate
            return torch.where(self.support_mask(weighted.abs()), weighted, torch.zeros_like(weighted))
        support = self.support_mask(self.selection_scores(theta, log_alpha))
        return theta * self.hc.test_gate(log_alpha) * support

    def evaluated_parameters(self) -> Tensor:
        """The evaluated flat parameters of the current global state (cached until the state changes)."""
        step = int(self.global_step)
        if self._eval_cache is None or self._eval_cache[0] != step:
            self._eval_cache = (step, self.final_parameters(flat_parameters(self.model), self.log_alpha.detach()))
        return self._eval_cache[1]

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.model, unflatten(self.model, self.evaluated_parameters()), (x,))

    def configure_callbacks(self) -> list[L.Callback]:
        """The sparse-model report at test time (density, MACs, selected features)."""
        return [SparseModelReport()]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._eval_cache = None
