"""Bit-exact codecs for dense floats and binary vectors.

Each codec writes a real bitstream; ``Message.num_bits`` is its exact length. The float32 codec
the engine sends with lives in :mod:`fedlightning.federated.codecs` and is importable from here.

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
from fedlightning.federated.codecs import DenseCodec, Float32Codec
from fedlightning.federated.message import Message

__all__ = ["BFloat16Codec", "BitPackCodec", "DenseCodec", "Float16Codec", "Float32Codec"]


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
