"""What crosses the wire: an encoded bitstream and the codec that reads it.

A :class:`Message` holds real bytes produced by a :class:`Codec`. Its ``num_bits`` is the
exact length of that bitstream (the last byte may carry up to 7 padding bits that are not
counted), including any side information the codec declares as ``header_bits``. Bits are
never computed from a formula in the accounting: they are read off the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Protocol, runtime_checkable

from torch import Tensor

from fedlightning.errors import MessageDecodeError

Bitstream = bytes | memoryview
"""A message's bytes: ``bytes``, or a read-only view of the sender's tensor (a lossless float32 upload)."""


@runtime_checkable
class Codec(Protocol):
    """Encodes a tensor to a bitstream and back. Shape is agreed by both sides, never sent."""

    name: str

    def encode(self, x: Tensor) -> Message:
        """Encode ``x`` (any shape) into a message whose payload is the real bitstream."""
        ...

    def decode(self, message: Message) -> Tensor:
        """Rebuild the tensor (float32, original shape) from ``message.payload``."""
        ...


@dataclass(frozen=True, eq=False)
class Message:
    """An encoded tensor.

    Attributes:
        payload: the bitstream, padded to whole bytes (``bytes``, or a read-only ``memoryview``
            of the sender's tensor for a lossless float32 upload).
        num_bits: exact bitstream length in bits, header included; ``len(payload) == ceil(num_bits / 8)``.
        codec: the codec that wrote it and can read it.
        shape: the decoded tensor's shape (known to both sides).
        header_bits: declared side information inside ``num_bits`` (scales, norms, counts).
    """

    payload: Bitstream
    num_bits: int
    codec: Codec
    shape: tuple[int, ...]
    header_bits: int = 0

    def __post_init__(self) -> None:
        name = getattr(self.codec, "name", type(self.codec).__name__)
        if not isinstance(self.num_bits, Integral) or self.num_bits < 0:
            raise MessageDecodeError(f"{name}: num_bits must be a non-negative integer (got {self.num_bits!r}).")
        if len(self.payload) != (self.num_bits + 7) // 8:
            raise MessageDecodeError(
                f"{name}: a {self.num_bits}-bit stream takes {(self.num_bits + 7) // 8} bytes but the payload "
                f"holds {len(self.payload)}; a codec pads to whole bytes only."
            )
        if any(not isinstance(d, Integral) or d < 0 for d in self.shape):
            raise MessageDecodeError(f"{name}: a message shape has non-negative integer sizes (got {self.shape!r}).")

    def decode(self) -> Tensor:
        """The tensor the receiver reconstructs."""
        return self.codec.decode(self)
