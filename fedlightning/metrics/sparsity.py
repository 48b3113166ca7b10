"""Sparsity maths as pure functions: the top-m support, density, feature selection, recovery.

>>> import torch
>>> top_m_mask(torch.tensor([0.1, -3.0, 2.0, 0.0]), 2).tolist()
[False, True, True, False]
>>> num_kept(0.025, 1000)
25
>>> support_recovery(torch.tensor([1, 4, 7]), torch.tensor([4, 7, 9, 11]))
0.5
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["density", "num_kept", "selected_input_features", "support_recovery", "top_m_mask"]


def num_kept(rho: float, dim: int) -> int:
    """m = ⌊ρ · |θ|⌋, the number of parameters a density-ρ model keeps (at least one).

    Raises:
        ValueError: if ``rho`` is not in (0, 1].
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"method.density must be in (0, 1] (got {rho}); use e.g. method.density=0.02")
    return max(1, math.floor(rho * dim + 1e-9))


def top_m_mask(scores: Tensor, m: int) -> Tensor:
    """Boolean mask of the ``m`` largest ``|scores|`` (exactly ``m``; ties go to the lower index)."""
    flat = scores.reshape(-1).abs()
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    if m >= flat.numel():
        mask[:] = True
    elif m > 0:
        # A stable sort keeps the lower index first among equal scores (torch.topk does not promise it).
        order = torch.sort(flat, descending=True, stable=True).indices
        mask[order[:m]] = True
    return mask.reshape(scores.shape)


def density(flat: Tensor) -> float:
    """Fraction of non-zero entries."""
    return float(torch.count_nonzero(flat)) / max(flat.numel(), 1)


def selected_input_features(model: nn.Module, flat: Tensor) -> Tensor:
    """Input features that the first weight matrix of ``model`` uses under the parameters ``flat``.

    For a linear or logistic model this is the selected variable set (genes, regressors):
    the columns of the first 2-D parameter with at least one non-zero entry.
    """
    offset = 0
    for p in model.parameters():
        n = p.numel()
        if p.ndim == 2:
            w = flat[offset : offset + n].reshape(p.shape)
            return torch.nonzero(w.ne(0).any(dim=0), as_tuple=True)[0].cpu()
        offset += n
    raise ValueError("The model has no 2-D weight matrix whose columns name input features.")


def support_recovery(selected: Tensor, true_support: Tensor) -> float:
    """|Ŝ ∩ S| / |S|: the fraction of the true non-zero features that the model selected."""
    truth = set(int(i) for i in true_support.reshape(-1).tolist())
    if not truth:
        raise ValueError("support_recovery needs a non-empty true support.")
    chosen = set(int(i) for i in selected.reshape(-1).tolist())
    return len(truth & chosen) / len(truth)
