"""What a channel needs of a compression operator: the interface, not an implementation.

The operators themselves (:mod:`fedlightning.compression`) sit above the engine; a channel
(:mod:`fedlightning.federated.channel`) holds one through this protocol, so the engine never
imports them. :class:`fedlightning.compression.operators.Compressor` implements it.

Metadata follows the thesis (arXiv 2207.00392, §1.6): ``omega(d)`` is the variance parameter ω of
an unbiased operator in dimension ``d`` (``None`` for a biased one) and ``delta(d)`` its B³
parameter δ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from fedlightning.federated.message import Message
from fedlightning.federated.payloads import Payload

__all__ = ["Operator"]


class Operator(Protocol):
    """A compression operator C as a channel applies it to a flat vector."""

    name: str
    unbiased: bool
    accepts: frozenset[Payload]
    """The payloads the operator understands."""

    def omega(self, d: int) -> float | None:
        """ω in dimension ``d`` (``None`` when C is biased)."""
        ...

    def delta(self, d: int) -> float:
        """δ in dimension ``d``."""
        ...

    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        """The message that carries C(x); decoding it gives C(x) itself."""
        ...

    def encode(self, x: Tensor) -> Message:
        """:meth:`compress` with the default stream: an operator is also the codec of its messages."""
        ...

    def decode(self, message: Message) -> Tensor:
        """C(x) from its message."""
        ...

    def blockwise(self, sizes: Sequence[int]) -> Operator:
        """C applied to consecutive blocks of ``sizes`` entries (one per parameter tensor): layer-wise."""
        ...
