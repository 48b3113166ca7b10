"""A small synthetic binary classification set for convex (logistic regression) experiments.

Features ``a ~ N(0, I/dim)`` (so ``‖a‖ ≈ 1`` and the logistic loss is well conditioned),
labels ``b ~ Bernoulli(σ(aᵀx_true))`` with ``x_true ~ N(0, scale² I)``. Split across
clients by the configured partitioner (``partition=dirichlet`` skews labels, making the
local optima differ: ``∇f_i(x*) ≠ 0``, the regime where compressed SGD has a noise floor and
DIANA does not). Fully determined by ``seed``.

>>> dm = SyntheticLogisticDataModule(num_clients=3, num_samples=300, dim=5)
>>> dm.setup("fit")
>>> dm.input_shape, dm.num_classes, sum(dm.client_sizes) == dm.num_train_samples
((5,), 2, True)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fedlightning.datamodules.base import FederatedDataModule

__all__ = ["SyntheticLogisticDataModule"]


class SyntheticLogisticDataModule(FederatedDataModule):
    """Synthetic logistic-regression data (``num_samples`` train + 20 % as many test samples)."""

    name = "synthetic_logistic"
    num_classes = 2
    data_depends_on_seed = True

    def __init__(self, *, num_samples: int = 2000, dim: int = 20, scale: float = 3.0, **kwargs: Any) -> None:
        if num_samples < 2 or dim < 1:
            raise ValueError(f"data.num_samples must be >= 2 and data.dim >= 1 (got {num_samples}, {dim}).")
        if not 0 <= scale < math.inf:
            raise ValueError(f"data.scale must be a finite number >= 0 (got {scale}): it scales the true weights.")
        self.num_samples = int(num_samples)
        self.dim = int(dim)
        self.scale = float(scale)
        self.input_shape = (self.dim,)
        super().__init__(**kwargs)

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        gen = torch.Generator().manual_seed(int(self.seed) + 7919)
        x_true = torch.randn(self.dim, generator=gen) * self.scale
        total = self.num_samples + max(1, self.num_samples // 5)
        a = torch.randn(total, self.dim, generator=gen) / self.dim**0.5
        b = (torch.rand(total, generator=gen) < torch.sigmoid(a @ x_true)).to(torch.int64)
        n = self.num_samples
        return (a[:n].contiguous(), b[:n].contiguous()), (a[n:].contiguous(), b[n:].contiguous())
