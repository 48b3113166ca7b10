"""What crosses the wire: an encoded bitstream and the codec that reads it.

A :class:`Message` holds real bytes produced by a :class:`Codec`. Its ``num_bits`` is the
exact length of that bitstream (the last byte may carry up to 7 padding bits that are not
counted), including any side information the codec declares as ``header_bits``. Bits are
never computed from a formula in the accounting: they are read off the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor


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
        payload: the bitstream, padded to whole bytes.
        num_bits: exact bitstream length in bits, header included; ``len(payload) == ceil(num_bits / 8)``.
        codec: the codec that wrote it and can read it.
        shape: the decoded tensor's shape (known to both sides).
        header_bits: declared side information inside ``num_bits`` (scales, norms, counts).
    """

    payload: bytes
    num_bits: int
    codec: Codec
    shape: tuple[int, ...]
    header_bits: int = 0

    def __post_init__(self) -> None:
        if len(self.payload) != (self.num_bits + 7) // 8:
            raise ValueError(
                f"{self.codec.name} wrote {len(self.payload)} bytes for a {self.num_bits}-bit "
                "stream; a codec must pad to whole bytes only."
            )

    def decode(self) -> Tensor:
        """The tensor the receiver reconstructs."""
        return self.codec.decode(self)
