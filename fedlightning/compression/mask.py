"""Zampling's uplink codec: a binary mask range-coded under the broadcast p, or bit-packed.

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246: a client uploads z ~ Bernoulli(p_new); both sides know the broadcast p, so
the mask is coded with p as the model (:class:`~fedlightning.compression.arithmetic.BernoulliRangeCodec`)
unless plain bit-packing (:class:`~fedlightning.compression.codecs.BitPackCodec`) is shorter.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from fedlightning.compression.arithmetic import BernoulliRangeCodec
from fedlightning.compression.codecs import BitPackCodec
from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Bitstream, Message

__all__ = ["MaskCodec"]


def _bits(payload: Bitstream, count: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=count, bitorder="little")


class MaskCodec:
    """A binary mask range-coded under the broadcast p, or bit-packed where that is shorter.

    One flag bit comes first (1: range code, :class:`BernoulliRangeCodec`; 0: n bits,
    :class:`BitPackCodec`), then the shorter of the two streams; ties go to bit-packing. The
    flag is counted in ``num_bits`` (``header_bits = 1``), so a mask costs at most n + 1 bits:
    a mask that is unlikely under p (round 1, where p(0) ~ U(0,1) has nothing to do with the
    uploaded masks) no longer costs more than bit-packing would. Decoding re-encodes the mask
    and refuses a stream that is not exactly its code, flag included.

    Args:
        model_p: the probabilities both sides know (the broadcast p).

    >>> import torch
    >>> codec = MaskCodec(model_p=torch.tensor([0.5, 0.5, 0.5]))  # p = 1/2: the range code is 32 bits
    >>> message = codec.encode(torch.tensor([1.0, 0.0, 1.0]))
    >>> message.num_bits, message.decode().tolist()
    (4, [1.0, 0.0, 1.0])
    """

    name = "mask_range_or_bitpack"
    header_bits = 1

    def __init__(self, *, model_p: Tensor) -> None:
        self.range = BernoulliRangeCodec(model_p=model_p)
        self.bitpack = BitPackCodec()

    def encode(self, x: Tensor) -> Message:
        x = x.detach().cpu()  # one host copy serves both codes
        ranged, packed = self.range.encode(x), self.bitpack.encode(x)
        body, flag = (ranged, 1) if ranged.num_bits < packed.num_bits else (packed, 0)
        stream = np.concatenate([np.array([flag], dtype=np.uint8), _bits(body.payload, body.num_bits)])
        payload = np.packbits(stream, bitorder="little").tobytes()
        return Message(payload=payload, num_bits=1 + body.num_bits, codec=self, shape=tuple(x.shape), header_bits=1)

    def decode(self, message: Message) -> Tensor:
        if message.num_bits < 1:
            raise MessageDecodeError(f"{self.name}: an empty stream has no flag bit.")
        stream = _bits(message.payload, message.num_bits)
        sub = self.range if stream[0] else self.bitpack
        body_bits = message.num_bits - 1
        body = Message(
            payload=np.packbits(stream[1:], bitorder="little").tobytes(),
            num_bits=body_bits,
            codec=sub,
            shape=message.shape,
        )
        mask = sub.decode(body)
        if self.encode(mask).payload != message.payload:
            raise MessageDecodeError(
                f"{self.name}: the flag says {sub.name} but the other code of this mask is shorter; "
                "the stream is not this codec's output."
            )
        return mask
