"""FedPM: federated probabilistic masks over frozen random weights (arXiv 2209.15328).

Paper: Isik, Pase, Gunduz, Weissman, Zorzi, "Sparse Random Networks for
Communication-Efficient Federated Learning", ICLR 2023, arXiv 2209.15328. Where the paper and
the authors' reference code differ, the defaults follow the code; the functions of that code
they follow are named in parentheses.

On the Zampling engine (:mod:`fedlightning.methods.zampling`) FedPM is Q = diag(w_init)
(d = 1, n = m): every weight *and* bias is a frozen signed constant ±e·sqrt(1/fan_in) (the
code's ``ME_init``) masked by its own bit. Clients train scores s with p = sigmoid(s) and the
estimator dL/dp = p·dL/dz (the code's ``Bern.backward``), Adam lr 0.1, then upload one mask
z ~ Bernoulli(p). The server maps 0 → ε and 1 → 1 − ε (ε = 0.01, the code's ``upload_mask``),
adds them to a Beta(α, β) posterior and sets p to its mode (α − 1)/(α + β − 2).
``prior_reset``: ``every_round`` (what the code runs: α = β = 1 before every aggregation, so p
is the mean of the smoothed bits), ``periodic`` (the paper's Bayesian aggregation: the
posterior carries over and is reset every ``reset_every`` rounds) or ``never``.

The server only needs Σ_k z_k of the K uploads: the smoothing is affine, so
Σ_k smooth(z_k) = K·smooth(mean_k z_k) (:func:`smoothed_sum`), and the round's aggregator (the
plain mean of the masks and their count) is all the posterior update reads.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import WeightedMean
from fedlightning.methods.zampling import Zampling, refuse_fixed_settings
from fedlightning.models.zampling import SparseQ, diagonal_q, row_fan_in

__all__ = ["FedPM", "beta_posterior_mode", "signed_constant_weights", "smooth_bits", "smoothed_sum"]


def signed_constant_weights(fan_in: Tensor, generator: torch.Generator, *, scale: float = math.e) -> Tensor:
    """±scale·sqrt(1/fan_in) with random signs (FedPM's ``ME_init``).

    >>> w = signed_constant_weights(torch.tensor([4.0, 4.0]), torch.Generator().manual_seed(0), scale=2.0)
    >>> w.abs().tolist()
    [1.0, 1.0]
    """
    signs = torch.randint(0, 2, fan_in.shape, generator=generator).float() * 2 - 1
    return signs * scale * torch.sqrt(1.0 / fan_in)


def smooth_bits(z: Tensor, eps: float) -> Tensor:
    """0 → ε and 1 → 1 − ε (FedPM's ``upload_mask``).

    >>> smooth_bits(torch.tensor([0.0, 1.0]), 0.25).tolist()
    [0.25, 0.75]
    """
    return z * (1.0 - 2.0 * eps) + eps


def smoothed_sum(mean: Tensor, count: int, eps: float) -> Tensor:
    """Σ_k smooth(z_k) over ``count`` uploads whose mean is ``mean`` (smoothing is affine).

    >>> z = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    >>> torch.allclose(smoothed_sum(z.mean(0), 3, 0.25), smooth_bits(z, 0.25).sum(0))
    True
    """
    return count * smooth_bits(mean, eps)


def beta_posterior_mode(alpha: Tensor, beta: Tensor) -> Tensor:
    """Mode (α − 1)/(α + β − 2) of Beta(α, β).

    >>> beta_posterior_mode(torch.tensor([3.0]), torch.tensor([2.0])).tolist()
    [0.6666666865348816]
    """
    return (alpha - 1.0) / (alpha + beta - 2.0)


class FedPM(Zampling):
    """FedPM on the Zampling engine (diagonal Q of signed constants, sigmoid scores).

    Args:
        eps: smoothing of uploaded bits (0.01 in the code).
        prior_reset: ``every_round`` (code), ``periodic`` (paper) or ``never``.
        reset_every: period ρ of the ``periodic`` reset.
        weight_scale: the constant's factor (e in ``ME_init``).
        **kwargs: :class:`Zampling` arguments (``d`` = 1, n = m and ``estimator`` are fixed: another value is refused).
    """

    alpha: Tensor
    beta: Tensor

    def __init__(
        self,
        *,
        eps: float = 0.01,
        prior_reset: Literal["every_round", "periodic", "never"] = "every_round",
        reset_every: int = 5,
        weight_scale: float = math.e,
        **kwargs: Any,
    ) -> None:
        if not 0 <= eps < 0.5:
            raise ConfigError(f"method.eps must be in [0, 0.5) (got {eps}).")
        if prior_reset not in ("every_round", "periodic", "never"):
            raise ConfigError(f"method.prior_reset={prior_reset!r}; choose every_round, periodic or never.")
        if reset_every < 1:
            raise ConfigError(f"method.reset_every must be at least 1 (got {reset_every}).")
        self.eps = eps
        self.prior_reset = prior_reset
        self.reset_every = reset_every
        self.weight_scale = weight_scale
        fixed = {"d": 1, "compression": 1, "n": "m", "estimator": "fedpm"}
        refuse_fixed_settings("FedPM", fixed, {key: kwargs.pop(key) for key in fixed if key in kwargs})
        kwargs.setdefault("p_init", "score_normal")
        super().__init__(d=1, compression=1, n=None, estimator="fedpm", **kwargs)
        if self.downlink == "lattice":
            raise ConfigError("method.downlink=lattice needs a plain mean of bits; FedPM smooths them, use float32.")
        self.register_buffer("alpha", torch.ones(self.n))
        self.register_buffer("beta", torch.ones(self.n))

    @override
    def build_q(self, model: nn.Module) -> SparseQ:
        gen = torch.Generator().manual_seed(self.q_seed)
        return diagonal_q(signed_constant_weights(row_fan_in(model), gen, scale=self.weight_scale))

    @override
    def aggregate(self, *, round_idx: int, aggregator: WeightedMean) -> Tensor:
        """The Beta posterior's mode after adding the round's K smoothed bits."""
        reset = self.prior_reset == "every_round" or (
            self.prior_reset == "periodic" and round_idx % self.reset_every == 0
        )
        if reset:
            self.alpha.fill_(1.0)
            self.beta.fill_(1.0)
        count = aggregator.count
        smoothed = smoothed_sum(aggregator.result(torch.float64), count, self.eps)  # Σ_k v_k, v_k = smooth(z_k)
        self.alpha += smoothed.to(self.alpha)
        self.beta += (count - smoothed).to(self.beta)  # Σ_k (1 − v_k)
        return beta_posterior_mode(self.alpha, self.beta)
