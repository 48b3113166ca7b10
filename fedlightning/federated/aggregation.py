"""Server-side aggregation maths as pure functions.

FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", arXiv 1602.05629. FedOpt (FedAdam, FedYogi, FedAdagrad): Reddi et al.,
"Adaptive Federated Optimization", arXiv 2003.00295, Algorithm 2. FedAvgM: Hsu et al.,
arXiv 1909.06335.

>>> import torch
>>> weighted_mean(torch.tensor([[1.0, 2.0], [3.0, 6.0]]), torch.tensor([1.0, 3.0]))
tensor([2.5000, 5.0000])
"""

from __future__ import annotations

import torch
from torch import Tensor


def normalised_weights(num_samples: Tensor) -> Tensor:
    """Weights proportional to client sample counts, summing to one (FedAvg's n_k / n)."""
    weights = num_samples.to(torch.float64)
    total = weights.sum()
    if total <= 0:
        raise ValueError("Cannot aggregate a cohort whose clients hold no samples.")
    return (weights / total).to(torch.float32)


def weighted_mean(updates: Tensor, weights: Tensor) -> Tensor:
    """Σ_k w_k u_k / Σ_k w_k for updates stacked as rows of a (K, m) tensor."""
    if updates.ndim != 2 or weights.shape != (updates.shape[0],):
        raise ValueError(
            f"weighted_mean needs (K, m) updates and (K,) weights, "
            f"got {tuple(updates.shape)} and {tuple(weights.shape)}."
        )
    w = weights.to(updates.dtype)
    return (w @ updates) / w.sum()


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
