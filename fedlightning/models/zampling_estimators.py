"""Zampling's score estimators: how a client's score s gives p, and which gradient reaches s.

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246 (``zampling``: p = clip(s), the masked straight-through gradient); Zhou et al.,
arXiv 1905.01067 (``zhou``: p = sigmoid(s), dL/ds = σ'(s)·Qᵀ∇_w L); Isik et al. (FedPM),
arXiv 2209.15328 (``fedpm``: the same, times p). ``method.estimator`` picks one by name
(:func:`score_estimator`); the client model :class:`fedlightning.models.sampled_network.SampledNetwork`,
the method :class:`fedlightning.methods.zampling.Zampling` and its vectorised local work
(:mod:`fedlightning.methods.zampling_stacked`) call only the strategy's methods. Pure maths on
tensors: it sits with the models, below every method (``tests/test_import_layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedlightning.errors import ConfigError
from fedlightning.models.zampling import SparseQ, ZampledWeights

__all__ = [
    "SCORE_ESTIMATORS",
    "ClippedScore",
    "Estimator",
    "ScoreEstimator",
    "SigmoidScore",
    "probability_from_score",
    "score_estimator",
    "score_from_probability",
]

Estimator = Literal["zampling", "zhou", "fedpm"]
_LOGIT_EPS = 1e-6


@dataclass(frozen=True)
class ScoreEstimator:
    """How a client's score s gives the probabilities p, and which gradient reaches s.

    The forward pass always uses w = Q·z with z ~ Bernoulli(p) (or z = p for the continuous
    model); the backward hands ∂L/∂z straight through to p (:class:`ZampledWeights`), and
    autograd carries it from p to s through :meth:`probability`.

    Attributes:
        name: the value of ``method.estimator``.
        mask_frozen: zero the gradient where p is exactly 0 or 1 (Zampling's gradient mask).
        scale_by_p: multiply the straight-through gradient by p (FedPM's estimator).
    """

    name: str
    mask_frozen: bool = False
    scale_by_p: bool = False

    def probability(self, s: Tensor) -> Tensor:
        """p as a differentiable function of the score."""
        raise NotImplementedError

    def score(self, p: Tensor) -> Tensor:
        """The score a client starts from when the server's state is p."""
        raise NotImplementedError

    def score_gradient(self, s: Tensor, p: Tensor, grad_p: Tensor, *, zero_where_frozen: bool = False) -> Tensor:
        """∂L/∂s from ∂L/∂p, where p = :meth:`probability` (s) (the chain rule autograd applies).

        ``zero_where_frozen``: ``grad_p`` is already 0 wherever p ∈ {0, 1} (a masked straight-through
        gradient), which lets an estimator skip work its derivative would do there.
        """
        raise NotImplementedError

    def weights(self, q: SparseQ) -> ZampledWeights:
        """w = Q·z with this estimator's backward (a fresh cache: one per client and round)."""
        return ZampledWeights(q, mask_frozen=self.mask_frozen, scale_by_p=self.scale_by_p)


class ClippedScore(ScoreEstimator):
    """p = clip(s, 0, 1) and s = p: Zampling (arXiv 2503.14246).

    >>> ClippedScore("zampling").probability(torch.tensor([-0.5, 0.25, 1.5])).tolist()
    [0.0, 0.25, 1.0]
    """

    def probability(self, s: Tensor) -> Tensor:
        return s.clamp(0.0, 1.0)

    def score(self, p: Tensor) -> Tensor:
        return p.clone()

    def score_gradient(self, s: Tensor, p: Tensor, grad_p: Tensor, *, zero_where_frozen: bool = False) -> Tensor:
        """``grad_p`` where 0 < s < 1, else 0 (autograd's clamp passes no gradient at its bounds either).

        With ``zero_where_frozen`` it is returned as it is: p ∈ {0, 1} exactly where s ∉ (0, 1).

        >>> s = torch.tensor([-0.5, 0.0, 0.5, 1.0, 1.5])
        >>> ClippedScore("clip").score_gradient(s, None, torch.ones(5)).tolist()
        [0.0, 0.0, 1.0, 0.0, 0.0]
        """
        if zero_where_frozen:
            return grad_p
        return torch.where((s > 0.0) & (s < 1.0), grad_p, 0.0)


class SigmoidScore(ScoreEstimator):
    """p = sigmoid(s) and s = logit(p), p kept in [1e-6, 1 − 1e-6]: arXiv 1905.01067, 2209.15328.

    >>> SigmoidScore("zhou").score(torch.tensor([0.5])).tolist()
    [0.0]
    """

    def probability(self, s: Tensor) -> Tensor:
        return torch.sigmoid(s)

    def score(self, p: Tensor) -> Tensor:
        return torch.logit(p.clamp(_LOGIT_EPS, 1.0 - _LOGIT_EPS))

    def score_gradient(self, s: Tensor, p: Tensor, grad_p: Tensor, *, zero_where_frozen: bool = False) -> Tensor:
        """``grad_p``·(1 − p)·p, in the order of autograd's sigmoid backward.

        >>> SigmoidScore("zhou").score_gradient(None, torch.tensor([0.5]), torch.tensor([4.0])).tolist()
        [1.0]
        """
        return grad_p * (1.0 - p) * p


SCORE_ESTIMATORS: dict[str, ScoreEstimator] = {
    "zampling": ClippedScore("zampling", mask_frozen=True),
    "zhou": SigmoidScore("zhou"),
    "fedpm": SigmoidScore("fedpm", scale_by_p=True),
}
"""The estimators of ``method.estimator``, by name."""


def score_estimator(name: str) -> ScoreEstimator:
    """The estimator called ``name`` (``method.estimator``).

    >>> score_estimator("fedpm").scale_by_p, score_estimator("zampling").mask_frozen
    (True, True)
    """
    estimator = SCORE_ESTIMATORS.get(name)
    if estimator is None:
        raise ConfigError(f"method.estimator={name!r} is not supported; choose one of {', '.join(SCORE_ESTIMATORS)}.")
    return estimator


def probability_from_score(s: Tensor, estimator: Estimator) -> Tensor:
    """p = clip(s, 0, 1) for Zampling, sigmoid(s) for Zhou and FedPM (differentiable).

    >>> probability_from_score(torch.tensor([-0.5, 0.25, 1.5]), "zampling").tolist()
    [0.0, 0.25, 1.0]
    """
    return score_estimator(estimator).probability(s)


def score_from_probability(p: Tensor, estimator: Estimator) -> Tensor:
    """The inverse map: s = p (Zampling) or logit(p) with p kept in [1e-6, 1 − 1e-6].

    >>> score_from_probability(torch.tensor([0.5]), "zhou").tolist()
    [0.0]
    """
    return score_estimator(estimator).score(p)
