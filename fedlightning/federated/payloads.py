"""What a message carries: the typed payloads of a method's uplink and downlink.

A method declares the payload of each direction (:attr:`FederatedModule.uplink_payload`,
:attr:`FederatedModule.downlink_payload`) and a compression operator declares the payloads it
understands (:attr:`fedlightning.compression.Compressor.accepts`). A channel refuses to put an
operator on a payload it does not accept, before any round runs: a sparsifier applied to a
Bernoulli mask, say, would decode to something the method never sent.

>>> Payload.BERNOULLI_MASK in DENSE_UPDATES
False
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DENSE_UPDATES", "Payload"]


class Payload(StrEnum):
    """Kinds of tensors that cross the wire."""

    MODEL = "model weights"
    """The dense global weights (FedAvg's broadcast)."""
    MODEL_DELTA = "model delta"
    """A difference of model weights (FedAvg's upload; a downlink against the clients' replica)."""
    GRADIENT = "gradient"
    """A (stochastic) gradient or gradient difference, possibly scaled by a step size (DCSGD, DIANA)."""
    SPARSE_MODEL = "hard-thresholded model"
    """Model weights with at most m non-zeros, in the method's sparse format (Fed-IHT)."""
    BERNOULLI_MASK = "Bernoulli mask"
    """A vector of bits z ~ Bernoulli(p) (Federated Zampling, FedPM)."""
    PROBABILITIES = "probability vector"
    """A vector in [0, 1]^n (Zampling's p)."""
    GATED_SPARSE = "gated sparse values"
    """E-FLoPS' support, weights and gate probabilities in one message."""


DENSE_UPDATES = frozenset({Payload.MODEL_DELTA, Payload.GRADIENT})
"""What the generic operators of the thesis (quantisers, sparsifiers, dithering) compress."""
