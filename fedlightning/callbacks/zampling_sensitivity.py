"""The parameter-sensitivity study of Zampling's evaluation (arXiv 2503.14246), as pure maths.

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246, §"Generalisation Properties via Parameter Sensitivity". p ∈ [0,1]^n is the
probability vector, τ the hypercube margin, ε ~ N(0, I_n) the perturbation draw. Used by
:class:`fedlightning.callbacks.zampling_evaluation.ZamplingEvaluation` at test time.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fedlightning.errors import ConfigError

__all__ = [
    "Region",
    "accuracy_deviation",
    "hypercube_indicator",
    "perturb_in_hypercube",
    "perturbation_draw",
    "perturbation_support",
    "relative_sensitivity",
]

Region = Literal["hypercube", "complement"]
"""Which coordinates are perturbed (:func:`perturbation_support`)."""


def hypercube_indicator(p: Tensor, tau: float) -> Tensor:
    """𝕀(p)_j = 1{τ ≤ p_j ≤ 1 − τ}: the free directions of the τ-hypercube C_τ (paper, Def. τ-Hypercube).

    >>> hypercube_indicator(torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0]), 0.1).tolist()
    [False, False, True, False, False]
    """
    if not 0.0 <= tau <= 0.5:
        raise ConfigError(f"reports.zampling_evaluation.sensitivity_taus must lie in [0, 0.5] (got {tau}).")
    return (p >= tau) & (p <= 1.0 - tau)


def perturbation_support(p: Tensor, tau: float, region: Region) -> Tensor:
    """Which coordinates the sensitivity study perturbs.

    ``hypercube``: 𝕀(p), the paper's stated rule τ ≤ p_j ≤ 1 − τ (C_τ's free directions).
    ``complement``: p_j < τ or p_j > 1 − τ. The paper's text also says that τ = 0.5 perturbs
    "all values p_j", which only this reading gives; both are offered, the stated rule is
    the default.

    >>> perturbation_support(torch.tensor([0.0, 0.3, 0.5, 1.0]), 0.5, "complement").tolist()
    [True, True, False, True]
    """
    inside = hypercube_indicator(p, tau)
    if region == "hypercube":
        return inside
    if region == "complement":
        return ~inside
    raise ConfigError(
        f"reports.zampling_evaluation.sensitivity_region={region!r} is not supported; choose hypercube or complement."
    )


def perturb_in_hypercube(
    p: Tensor, tau: float, generator: torch.Generator, region: Region = "hypercube"
) -> tuple[Tensor, Tensor]:
    """The paper's sensitivity perturbation: (clip(p + ε_τ, 0, 1), ε_τ), ε_τ,j ~ N(0, 1) on the support.

    Only the coordinates of :func:`perturbation_support` move (by default τ ≤ p_j ≤ 1 − τ);
    the result is clipped back into [0, 1] so it stays a valid Bernoulli parameter (the
    paper does not say how it handles values leaving [0, 1]; clipping is our decision).

    >>> gen = torch.Generator().manual_seed(0)
    >>> q, eps = perturb_in_hypercube(torch.tensor([0.0, 1.0, 0.5]), 0.01, gen)
    >>> q[:2].tolist(), eps[:2].tolist()
    ([0.0, 1.0], [0.0, 0.0])
    """
    perturbed, eps, _ = perturbation_draw(p, tau, generator, region)
    return perturbed, eps


def perturbation_draw(
    p: Tensor, tau: float, generator: torch.Generator, region: Region = "hypercube"
) -> tuple[Tensor, Tensor, Tensor]:
    """(clip(p + ε_τ, 0, 1), ε_τ, ε): :func:`perturb_in_hypercube` plus the full draw ε ~ N(0, I_n).

    ε_τ is ε with the coordinates outside the support set to zero. The paper's deviation
    column is consistent with dividing by ‖ε‖₂ ≈ √n rather than ‖ε_τ‖₂ (its sensitivity /
    deviation ratio gives a norm of ≈ 128 = √16,330 in every row, τ = 0.01 included, where
    ε_τ has few non-zeros), so the full draw is returned for that reading.

    >>> gen = torch.Generator().manual_seed(0)
    >>> q, eps, full = perturbation_draw(torch.tensor([0.0, 1.0, 0.5]), 0.01, gen)
    >>> eps[:2].tolist(), bool(full[:2].abs().min() > 0), bool(eps[2] == full[2])
    ([0.0, 0.0], True, True)
    """
    support = perturbation_support(p, tau, region)
    draw = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=generator.device).to(p.device)
    eps = torch.where(support, draw, torch.zeros_like(p))
    return (p + eps).clamp(0.0, 1.0), eps, draw


def relative_sensitivity(reference: float, perturbed: float) -> float:
    """The paper's "sensitivity": (reference − perturbed) / reference (relative accuracy drop).

    >>> relative_sensitivity(1.0, 0.75)
    0.25
    """
    return (reference - perturbed) / reference if reference > 0 else float("nan")


def accuracy_deviation(reference: float, perturbed: float, eps_norm: float) -> float:
    """The paper's "deviation": accuracy drop in percentage points per unit ‖ε_τ‖₂.

    The paper's table is consistent with accuracies in percent (its regular-training row
    gives ‖ε_τ‖ ≈ 130 ≈ √n for the small architecture at m/n = 1), so the drop is × 100.

    >>> accuracy_deviation(0.75, 0.5, 5.0)
    5.0
    """
    return 100.0 * (reference - perturbed) / eps_norm if eps_norm > 0 else 0.0
