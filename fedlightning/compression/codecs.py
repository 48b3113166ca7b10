"""Bit-exact codecs for dense floats and binary vectors.

Each codec writes a real bitstream; ``Message.num_bits`` is its exact length.

>>> import torch
>>> msg = Float32Codec().encode(torch.ones(266_610))
>>> msg.num_bits == 32 * 266_610
True
>>> BitPackCodec().encode(torch.tensor([1.0, 0.0, 1.0])).num_bits
3
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Message

__all__ = ["BFloat16Codec", "BitPackCodec", "DenseCodec", "Float16Codec", "Float32Codec"]


class DenseCodec:
    """IEEE floating point, ``bits`` per coordinate, little-endian, no header."""

    def __init__(self, *, dtype: torch.dtype, name: str) -> None:
        self.dtype = dtype
        self.name = name
        self.bits_per_coordinate = torch.finfo(dtype).bits

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).to(device="cpu", dtype=self.dtype).contiguous()
        if self.dtype == torch.bfloat16:  # NumPy has no bfloat16: ship the raw 16-bit words
            flat = flat.view(torch.int16)
        payload = flat.numpy().tobytes()
        return Message(payload=payload, num_bits=8 * len(payload), codec=self, shape=tuple(x.shape))

    def borrowed(self, x: Tensor) -> Message:
        """The message of a CPU ``x`` that :meth:`reproduces` accepts, with no copy of its bytes.

        Its payload is a read-only view of ``x``'s own float32 bytes, so it is the message
        :meth:`encode` writes as long as ``x`` is not modified; the engine sends each upload once
        and never modifies it after.

        >>> x = torch.tensor([0.5, -2.0])
        >>> msg = Float32Codec().borrowed(x)
        >>> bytes(msg.payload) == Float32Codec().encode(x).payload, msg.num_bits, msg.payload.readonly
        (True, 64, True)
        """
        if not (self.reproduces(x) and x.device.type == "cpu"):
            raise ValueError(f"{self.name} lends the bytes of a float32 CPU tensor only (got {x.dtype} on {x.device}).")
        words = x.detach().reshape(-1).contiguous().numpy()
        payload = memoryview(words).cast("B").toreadonly()  # type: ignore[arg-type]  # ndarray is a buffer
        return Message(payload=payload, num_bits=8 * len(payload), codec=self, shape=tuple(x.shape))

    def decode(self, message: Message) -> Tensor:
        numel = math.prod(message.shape)
        expected = self.bits_per_coordinate * numel
        if message.num_bits != expected:
            raise MessageDecodeError(
                f"{self.name}: a message of {numel} coordinates takes {expected} bits, this one has {message.num_bits}."
            )
        wire = torch.int16 if self.dtype == torch.bfloat16 else self.dtype
        flat = torch.frombuffer(bytearray(message.payload), dtype=wire)
        return flat.view(self.dtype).to(torch.float32).reshape(message.shape)

    def analytic_bits(self, numel: int) -> int:
        """Bits of a message with ``numel`` coordinates."""
        return self.bits_per_coordinate * numel

    def reproduces(self, x: Tensor) -> bool:
        """Whether decoding ``x``'s message gives ``x`` back bit for bit (float32 on the float32 wire).

        The payload then holds ``x``'s own bytes, so a sender that keeps ``x`` need not decode.

        >>> x = torch.tensor([0.1, -3e38, float("nan")])
        >>> Float32Codec().reproduces(x), Float16Codec().reproduces(x)
        (True, False)
        >>> torch.equal(Float32Codec().encode(x).decode().view(torch.int32), x.view(torch.int32))
        True
        """
        return self.dtype == torch.float32 and x.dtype == torch.float32


class Float32Codec(DenseCodec):
    """Dense float32: 32 bits per coordinate, lossless for float32 tensors."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.float32, name="float32")


class Float16Codec(DenseCodec):
    """Dense IEEE half precision: 16 bits per coordinate (round to nearest)."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.float16, name="float16")


class BFloat16Codec(DenseCodec):
    """Dense bfloat16: 16 bits per coordinate (float32 with the mantissa cut to 7 bits)."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.bfloat16, name="bfloat16")


class BitPackCodec:
    """Binary vectors, one bit per coordinate (LSB first), no header.

    Raises ``ValueError`` if the input is not 0/1: a mask codec must not silently round;
    decoding a message whose ``num_bits`` is not the mask's size raises
    :class:`~fedlightning.errors.MessageDecodeError`.
    """

    name = "bitpack"

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).cpu()
        bits = flat.to(torch.bool)
        if not torch.equal(bits.to(flat.dtype), flat):
            raise ValueError("BitPackCodec received values other than 0 and 1; it encodes binary masks only.")
        payload = np.packbits(bits.numpy(), bitorder="little").tobytes()
        return Message(payload=payload, num_bits=flat.numel(), codec=self, shape=tuple(x.shape))

    def decode(self, message: Message) -> Tensor:
        numel = math.prod(message.shape)
        if message.num_bits != numel:
            raise MessageDecodeError(
                f"{self.name}: a mask of {numel} coordinates takes {numel} bits, this message has {message.num_bits}."
            )
        bits = np.unpackbits(np.frombuffer(message.payload, dtype=np.uint8), count=numel, bitorder="little")
        return torch.from_numpy(bits.astype(np.float32)).reshape(message.shape)

    def analytic_bits(self, numel: int) -> int:
        """Bits of a mask with ``numel`` coordinates."""
        return numel
