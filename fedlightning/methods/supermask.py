"""Zhou et al.'s supermask: learned Bernoulli masks over frozen random weights (arXiv 1905.01067).

Paper: Zhou, Lan, Liu, Yosinski, "Deconstructing Lottery Tickets: Zeros, Signs, and the
Supermask", NeurIPS 2019, arXiv 1905.01067; the defaults follow the authors' reference code
(its masked networks and its README's training command).

On the Zampling engine (:mod:`fedlightning.methods.zampling`) the supermask is
Q = diag(w_init) (d = 1, n = m): kernels are frozen Glorot-normal weights
(``signed_constant: true`` gives sign(w)·std instead), biases stay at zero (Zhou masks kernels
only, so bias rows of Q are 0), scores start at 0 (p = 0.5), and p = sigmoid(s) is trained
through the straight-through sample (dL/ds = σ'(s)·dL/dz, the ``zhou`` estimator) with SGD
lr 100, momentum 0.9. Centralised use: ``data.num_clients=1`` with ``upload: probabilities``,
as Local Zampling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.methods.zampling import Zampling, refuse_fixed_settings
from fedlightning.models.zampling import SparseQ, diagonal_q, glorot_std, row_fan_in, row_fan_out

__all__ = ["Supermask", "supermask_weights"]


def supermask_weights(model: nn.Module, generator: torch.Generator, *, signed_constant: bool = False) -> Tensor:
    """Frozen weights: Glorot normal on ≥2-D weights, 0 on biases and other 1-D parameters.

    >>> from fedlightning.models.mlp import MLP
    >>> w = supermask_weights(MLP(in_features=2, hidden=[], num_classes=2), torch.Generator().manual_seed(0))
    >>> w[-2:].tolist()
    [0.0, 0.0]
    """
    std = glorot_std(row_fan_in(model), row_fan_out(model))
    is_kernel = torch.cat([torch.full((p.numel(),), p.dim() >= 2) for p in model.parameters()])
    w = torch.randn(std.shape, generator=generator) * std
    if signed_constant:
        w = torch.sign(w) * std
    return torch.where(is_kernel, w, torch.zeros_like(w))


class Supermask(Zampling):
    """Zhou's supermask (d = 1, n = m, sigmoid scores over frozen Glorot weights).

    Args:
        signed_constant: use sign(w)·std instead of Glorot-normal values.
        **kwargs: :class:`Zampling` arguments (``d`` = 1, n = m and ``estimator`` are fixed: another value is refused).
    """

    def __init__(self, *, signed_constant: bool = False, **kwargs: Any) -> None:
        self.signed_constant = signed_constant
        fixed = {"d": 1, "compression": 1, "n": "m", "estimator": "zhou"}
        refuse_fixed_settings("Supermask", fixed, {key: kwargs.pop(key) for key in fixed if key in kwargs})
        kwargs.setdefault("p_init", "half")
        super().__init__(d=1, compression=1, n=None, estimator="zhou", **kwargs)

    @override
    def build_q(self, model: nn.Module) -> SparseQ:
        gen = torch.Generator().manual_seed(self.q_seed)
        return diagonal_q(supermask_weights(model, gen, signed_constant=self.signed_constant))
