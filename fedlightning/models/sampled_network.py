"""The client model of the Zampling family: a network whose one trained parameter is the score s.

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246. A client of a round trains its score s from the broadcast p: every
mini-batch draws a mask z ~ Bernoulli(p(s)) (z = p(s) for the continuous model), sets the
weights w = Q·z (:class:`~fedlightning.models.zampling.ZampledWeights`) and runs the
architecture with them (:class:`~fedlightning.models.zampling.ZampledNetwork`); the gradient
reaches s through the estimator's straight-through rule
(:class:`~fedlightning.models.zampling_estimators.ScoreEstimator`). The method that trains it
is :class:`fedlightning.methods.zampling.Zampling` (and FedPM and the supermask built on it).

The hand-taken step (:meth:`SampledNetwork.fused_gradient_`) needs the backward pass of a
chain of Linear layers, which belongs to the round engine
(:func:`fedlightning.federated.local.fused.chain_gradients_`); models sit below the engine
(``tests/test_import_layers.py``), so the method passes that routine in, typed by
:class:`ChainGradients`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from fedlightning.models.zampling import ZampledNetwork, ZampledWeights, bernoulli_draw
from fedlightning.models.zampling_estimators import ScoreEstimator

__all__ = ["ChainGradients", "LayerPair", "SampledNetwork"]

LayerPair = tuple[Tensor, Tensor | None]
"""One Linear layer's (weight, bias) tensors; ``None`` for a layer without a bias."""


class ChainGradients(Protocol):
    """The cross-entropy loss on ``(x, y)`` of a chain of Linear layers (ReLU between them), by hand.

    Writes the gradient of each layer's (weight, bias) into ``out`` (tensors of the same shapes)
    and returns the loss; :func:`fedlightning.federated.local.fused.chain_gradients_` is one.
    """

    def __call__(self, pairs: Sequence[LayerPair], x: Tensor, y: Tensor, *, out: Sequence[LayerPair]) -> Tensor: ...


class SampledNetwork(nn.Module):
    """The model a client trains in one round: its one parameter is the score s.

    :meth:`resample` draws the mini-batch's mask z ~ Bernoulli(p(s)) (z = p(s) for the
    continuous model) and sets w = Q·z; :meth:`forward` runs the architecture with w. The
    gradient of a loss of the output reaches s through the estimator's straight-through rule.

    Args:
        score: the starting score (copied into a parameter).
        network: the architecture, called functionally.
        weights: the Q·z product with the estimator's backward.
        estimator: p as a function of s.
        sampling: sample masks (true) or use w = Q·p (false).
        generator: the client's mask stream.
        chain: the Linear layers of ``network``'s model (:func:`~fedlightning.federated.local.fused.linear_chain`)
            where its steps are taken by hand (:meth:`fused_gradient_`); ``None``: autograd only.
        chain_gradients: the backward pass of ``chain`` by hand (:class:`ChainGradients`); needed with ``chain``.
    """

    def __init__(
        self,
        score: Tensor,
        *,
        network: ZampledNetwork,
        weights: ZampledWeights,
        estimator: ScoreEstimator,
        sampling: bool,
        generator: torch.Generator,
        chain: Sequence[nn.Linear] | None = None,
        chain_gradients: ChainGradients | None = None,
    ) -> None:
        super().__init__()
        if chain is not None and chain_gradients is None:
            raise ValueError("A SampledNetwork with a layer chain needs chain_gradients to take its steps by hand.")
        self.score = nn.Parameter(score.detach().clone())
        self._network = network  # a plain object around the hidden client model: nothing is registered
        self._weights = weights
        self._estimator = estimator
        self._sampling = sampling
        self._generator = generator
        self._w: Tensor | None = None
        self._chain = chain
        self._chain_gradients = chain_gradients
        self._grad: tuple[Tensor, list[LayerPair]] | None = None  # ∂L/∂w of the hand-taken step and its layer views
        self._views: tuple[Tensor, list[LayerPair]] | None = None  # the w the layer views slice, and the views

    def _pairs(self, w: Tensor) -> list[LayerPair]:
        """(weight, bias) views of ``w`` for each layer of the chain, input to output."""
        assert self._chain is not None
        view = self._network.view_of
        return [(view(w, layer.weight), None if layer.bias is None else view(w, layer.bias)) for layer in self._chain]

    def probabilities(self) -> Tensor:
        """p(s), differentiable."""
        return self._estimator.probability(self.score)

    def resample(self) -> None:
        """Draw the next mask and set the network's weights w = Q·z."""
        p = self.probabilities()
        z = bernoulli_draw(p, self._generator) if self._sampling else p.detach()
        self._w = self._weights(p, z)

    def forward(self, x: Tensor) -> Tensor:
        if self._w is None:
            raise RuntimeError("SampledNetwork.resample() must draw a mask before the forward pass.")
        return self._network.forward(x, self._w)

    def fused_gradient_(self, x: Tensor, y: Tensor) -> Tensor:
        """One mini-batch by hand: the cross-entropy loss of a fresh mask's network, ∂L/∂s into ``score.grad``.

        The same mask, w and gradient as :meth:`resample`, the forward pass and
        ``loss.backward()`` (up to float rounding), without autograd: z is drawn and w = Q·z
        updated in place (:meth:`ZampledWeights.draw_weights`), ∂L/∂w is written into one flat buffer
        (``chain_gradients``, e.g. :func:`~fedlightning.federated.local.fused.chain_gradients_`), then
        passed straight through (:meth:`ZampledWeights.straight_through`) and through p(s)
        (:meth:`ScoreEstimator.score_gradient`). Returns the loss.
        """
        if self._chain is None or self._chain_gradients is None:
            raise RuntimeError("This SampledNetwork has no layer chain to take its steps by hand.")
        s = self.score.detach()
        p = self._estimator.probability(s)
        self._weights.set_free(p)
        if self._sampling:
            w = self._weights.draw_weights(p, self._generator)  # z ~ Bernoulli(p), as bernoulli_draw draws it
        else:
            w = self._weights.weights_for(p, in_place=True)
        if self._views is None or self._views[0] is not w:  # a full product gives a new w
            self._views = (w, self._pairs(w))
        if self._grad is None:
            grad_w = torch.empty_like(w)  # every entry is written: the chain covers all of the model's parameters
            self._grad = (grad_w, self._pairs(grad_w))
        loss = self._chain_gradients(self._views[1], x, y, out=self._grad[1])
        grad_p = self._weights.straight_through(self._grad[0], p)
        self.score.grad = self._estimator.score_gradient(s, p, grad_p, zero_where_frozen=self._weights.mask_frozen)
        self._w = None  # the in-place w is the step's own: forward() needs resample() first
        return loss
