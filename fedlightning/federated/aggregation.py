"""Server-optimiser maths as pure functions (the weighted mean itself is
:class:`fedlightning.federated.aggregators.WeightedMean`).

FedOpt (FedAdam, FedYogi, FedAdagrad): Reddi et al., "Adaptive Federated Optimization",
arXiv 2003.00295, Algorithm 2. FedAvgM: Hsu et al., arXiv 1909.06335.

>>> import torch
>>> fedopt_first_moment(torch.tensor([1.0]), torch.tensor([3.0]), beta1=0.5)
tensor([2.])
"""

from __future__ import annotations

import torch
from torch import Tensor


def fedopt_first_moment(m: Tensor, delta: Tensor, beta1: float) -> Tensor:
    """m_t = β1 m_{t-1} + (1 − β1) Δ_t."""
    return beta1 * m + (1.0 - beta1) * delta


def fedadagrad_second_moment(v: Tensor, delta: Tensor) -> Tensor:
    """v_t = v_{t-1} + Δ_t²."""
    return v + delta * delta


def fedadam_second_moment(v: Tensor, delta: Tensor, beta2: float) -> Tensor:
    """v_t = β2 v_{t-1} + (1 − β2) Δ_t²."""
    return beta2 * v + (1.0 - beta2) * delta * delta


def fedyogi_second_moment(v: Tensor, delta: Tensor, beta2: float) -> Tensor:
    """v_t = v_{t-1} − (1 − β2) Δ_t² sign(v_{t-1} − Δ_t²)."""
    sq = delta * delta
    return v - (1.0 - beta2) * sq * torch.sign(v - sq)


def fedopt_step(x: Tensor, m: Tensor, v: Tensor, lr: float, tau: float) -> Tensor:
    """x_{t+1} = x_t + η m_t / (√v_t + τ)."""
    return x + lr * m / (v.sqrt() + tau)
