"""What crosses the wire: an encoded bitstream and the codec that reads it.

A :class:`Message` holds real bytes produced by a :class:`Codec`. Its ``num_bits`` is the
exact length of that bitstream (the last byte may carry up to 7 padding bits that are not
counted), including any side information the codec declares as ``header_bits``. Bits are
never computed from a formula in the accounting: they are read off the message.
"""

from __future__ import annotations

from collections.abc import Callable
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


class SentShare:
    """The messages of K senders sent at once (one per client of a share, in order).

    Each message's exact length is known (``num_bits``); the :class:`Message` objects themselves
    are built only when asked for (:meth:`message`), so a share whose lengths are known from its
    codec (:meth:`~fedlightning.compression.codecs.DenseCodec.encode_rows`) never copies its
    bytes to the host for the accounting alone.

    Args:
        client_ids: the senders, in order.
        num_bits: each message's exact bitstream length.
        codec_names: each message's codec name.
        message: builds the ``k``-th message (the same one a per-client send writes).

    >>> import torch
    >>> from fedlightning.compression.codecs import Float32Codec
    >>> rows = torch.ones(2, 3)
    >>> sent = SentShare.of([4, 7], [Float32Codec().encode(r) for r in rows])
    >>> sent.num_bits, sent.codec_names, sent.message(1).num_bits
    ([96, 96], ['float32', 'float32'], 96)
    """

    def __init__(
        self,
        *,
        client_ids: list[int],
        num_bits: list[int],
        codec_names: list[str],
        message: Callable[[int], Message],
    ) -> None:
        if not len(client_ids) == len(num_bits) == len(codec_names):
            raise ValueError("A share's senders, lengths and codec names must be as many.")
        self.client_ids = client_ids
        self.num_bits = num_bits
        self.codec_names = codec_names
        self._message = message

    @classmethod
    def of(cls, client_ids: list[int], messages: list[Message]) -> SentShare:
        """A share of messages that already exist (one per sender)."""
        return cls(
            client_ids=client_ids,
            num_bits=[m.num_bits for m in messages],
            codec_names=[m.codec.name for m in messages],
            message=messages.__getitem__,
        )

    def __len__(self) -> int:
        return len(self.client_ids)

    def message(self, k: int) -> Message:
        """The ``k``-th sender's message."""
        return self._message(k)
