"""Inclusion probabilities of the client samplers, as pure functions.

Optimal client sampling (Horváth's thesis, arXiv 2207.00392, ch. 6; Chen, Horváth and
Richtárik, arXiv 2010.13723): every client of the round computes its update U_i, only a random
subset S sends it, and the server forms the unbiased estimate Σ_{i∈S} (w_i/p_i) U_i. With
independent inclusion (client i sends with probability p_i, independently of the others) its
variance around the full aggregate Σ_i w_i U_i is

    V(p) = Σ_i ũ_i² (1 − p_i) / p_i,   ũ_i = w_i ‖U_i‖,

and minimising V subject to Σ_i p_i ≤ m, 0 ≤ p_i ≤ 1 gives (6.7): p_i ∝ ũ_i, capped at one,
the capped mass handed to the others (water-filling). The thesis states (6.7) with ũ_(j) as the
j-th *largest* norm; the rest of the statement (the saturated set holds the largest norms, the
case l = n) only holds for the j-th *smallest*, which is what :func:`optimal_probabilities` uses.

>>> optimal_probabilities(torch.tensor([1.0, 1.0, 1.0, 10.0]), 2).tolist()
[0.3333333333333333, 0.3333333333333333, 0.3333333333333333, 1.0]
>>> aocs_probabilities(torch.tensor([1.0, 1.0, 1.0, 10.0]), 2, j_max=4).probabilities.tolist()
[0.3333333333333333, 0.3333333333333333, 0.3333333333333333, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "AOCSResult",
    "aocs_probabilities",
    "capped_proportional",
    "improvement_factor",
    "independent_sampling_variance",
    "optimal_probabilities",
]


def optimal_probabilities(scores: Tensor, m: int) -> Tensor:
    """The probabilities (6.7) minimising V(p) with Σ p_i ≤ m (float64).

    Args:
        scores: ũ_i ≥ 0 of the n clients that computed an update.
        m: expected number of uploaders (an integer ≥ 1).

    With at most m non-zero scores every non-zero one gets probability one (nothing to
    sample); zero scores always get zero (a zero update contributes nothing).
    """
    u = _check_scores(scores, m)
    n = u.numel()
    nonzero = u > 0
    if int(nonzero.sum()) <= m:
        return nonzero.to(torch.float64)
    ascending, order = torch.sort(u)
    prefix = torch.cumsum(ascending, dim=0)
    # The largest l in {n − m + 1, …, n} with 0 < m + l − n ≤ Σ_{j≤l} ũ_(j) / ũ_(l); it exists
    # (l = n − m + 1 always qualifies once more than m scores are non-zero).
    for last in range(n, n - m, -1):  # `last` is the thesis' l
        budget = m + last - n
        if budget * float(ascending[last - 1]) <= float(prefix[last - 1]):
            break
    p_sorted = torch.ones(n, dtype=torch.float64)
    p_sorted[:last] = budget * ascending[:last] / prefix[last - 1]
    p = torch.empty_like(p_sorted)
    p[order] = p_sorted
    return p


def capped_proportional(weights: Tensor, budget: int) -> Tensor:
    """p_i ∝ w_i capped at one with Σ p_i = ``budget`` (importance sampling, FedShuffle's p = b·w).

    The same water-filling problem as :func:`optimal_probabilities`, so the same solution: the
    iterative renormalisation ``p ← min(p·b/Σp, 1)`` converges to it.

    >>> capped_proportional(torch.tensor([1.0, 1.0, 6.0]), 2).tolist()
    [0.5, 0.5, 1.0]
    """
    return optimal_probabilities(weights, budget)


@dataclass(frozen=True)
class AOCSResult:
    """What Algorithm 8 computed and what it cost.

    Attributes:
        probabilities: p_i of each client (float64).
        total: u = Σ_i ũ_i, the securely aggregated norm sum broadcast to every client.
        scales: the factor C broadcast after each iteration that ran.
        sums: the securely aggregated (I, P) of each iteration that ran (I = clients with
            p_i < 1, P = their total probability).
        reports: what each client sent in each iteration, t_i = (1, p_i) if p_i < 1 else
            (0, 0), shape (iterations, n, 2).
    """

    probabilities: Tensor
    total: float
    scales: tuple[float, ...]
    sums: tuple[tuple[float, float], ...]
    reports: Tensor

    @property
    def iterations(self) -> int:
        """Iterations of the (I, P) loop that ran (each costs every client 2 floats up, 1 down)."""
        return len(self.scales)


def aocs_probabilities(scores: Tensor, m: int, *, j_max: int) -> AOCSResult:
    """Approximate optimal client sampling (Algorithm 8): (6.7) from sums only.

    The server learns u = Σ ũ_i and, for at most ``j_max`` iterations, the sums (I, P) over
    the unsaturated clients; each client rescales its own p_i by the broadcast
    C = (m − n + I) / P, and the loop stops once C ≤ 1. Every aggregate is a plain sum, so the
    protocol runs under secure aggregation.
    """
    u = _check_scores(scores, m)
    if j_max < 0:
        raise ValueError(f"j_max must be non-negative (got {j_max}).")
    n = u.numel()
    total = float(u.sum())
    if total == 0.0:
        zeros = torch.zeros(n, dtype=torch.float64)
        return AOCSResult(probabilities=zeros, total=0.0, scales=(), sums=(), reports=torch.zeros(0, n, 2))
    p = torch.clamp(m * u / total, max=1.0)
    scales: list[float] = []
    sums: list[tuple[float, float]] = []
    reports: list[Tensor] = []
    for _ in range(j_max):
        unsaturated = p < 1
        t = torch.stack([unsaturated.to(torch.float64), torch.where(unsaturated, p, 0.0)], dim=1)
        reports.append(t)
        count, mass = float(t[:, 0].sum()), float(t[:, 1].sum())
        sums.append((count, mass))
        if mass == 0.0:  # nothing left to scale: every non-zero client already sends
            scales.append(1.0)
            break
        scale = (m - n + count) / mass
        scales.append(scale)
        p[unsaturated] = torch.clamp(scale * p[unsaturated], max=1.0)
        if scale <= 1:
            break
    stacked = torch.stack(reports) if reports else torch.zeros(0, n, 2, dtype=torch.float64)
    return AOCSResult(probabilities=p, total=total, scales=tuple(scales), sums=tuple(sums), reports=stacked)


def independent_sampling_variance(scores: Tensor, probabilities: Tensor) -> float:
    """V(p) = Σ ũ_i² (1 − p_i)/p_i of independent sampling (clients with p_i = 0 must score 0)."""
    u, p = scores.to(torch.float64), probabilities.to(torch.float64)
    if bool(((p == 0) & (u != 0)).any()):
        raise ValueError("A client with a non-zero score has probability zero: the estimator is biased.")
    sent = p > 0
    return float((u[sent] ** 2 * (1 - p[sent]) / p[sent]).sum())


def improvement_factor(scores: Tensor, probabilities: Tensor, m: int) -> float:
    """α = V(p) / V(p^U), the variance against independent uniform sampling p^U_i = m/n (§6.5).

    0 when at most m clients have non-zero scores (or m ≥ n), at most 1 for the optimal p.

    >>> improvement_factor(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]), 1)
    1.0
    """
    u = scores.to(torch.float64)
    n = u.numel()
    if m >= n or int((u > 0).sum()) <= m:
        return 0.0
    uniform = independent_sampling_variance(u, torch.full((n,), m / n, dtype=torch.float64))
    return independent_sampling_variance(u, probabilities) / uniform


def _check_scores(scores: Tensor, m: int) -> Tensor:
    if scores.dim() != 1:
        raise ValueError(f"Scores must be a vector (got shape {tuple(scores.shape)}).")
    u = scores.to(torch.float64)
    if not bool(torch.isfinite(u).all()) or bool((u < 0).any()):
        raise ValueError("Scores must be finite and non-negative (weighted update norms).")
    if int(m) != m or m < 1:
        raise ValueError(f"The expected number of uploaders m must be a positive integer (got {m}).")
    return u
