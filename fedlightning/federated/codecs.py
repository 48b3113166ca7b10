"""The engine's dense float codec: IEEE floats, the wire of every uncompressed message.

Each codec writes a real bitstream; ``Message.num_bits`` is its exact length. The channels of
:mod:`fedlightning.federated.channel` send with :class:`Float32Codec` unless a method or a
compressor names another codec (:mod:`fedlightning.compression.codecs` holds the others).

>>> import torch
>>> msg = Float32Codec().encode(torch.ones(266_610))
>>> msg.num_bits == 32 * 266_610
True
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Message, SentShare

__all__ = ["DenseCodec", "Float32Codec"]


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
        if numel == 0:  # (frombuffer refuses an empty buffer)
            return torch.zeros(message.shape, dtype=torch.float32)
        wire = torch.int16 if self.dtype == torch.bfloat16 else self.dtype
        flat = torch.frombuffer(bytearray(message.payload), dtype=wire)
        return flat.view(self.dtype).to(torch.float32).reshape(message.shape)

    def analytic_bits(self, numel: int) -> int:
        """Bits of a message with ``numel`` coordinates (the length :meth:`encode` writes, at any shape)."""
        return self.bits_per_coordinate * numel

    def encode_rows(self, x: Tensor, *, client_ids: list[int]) -> tuple[SentShare, Tensor]:
        """The messages of the K rows of ``x`` (one per client of ``client_ids``) and what each decodes to.

        In bulk: the rows are cast to the wire's type once, on their device, and copied to the
        host once, only when a message is asked for; each message is the one :meth:`encode`
        writes of its row, and its length is :meth:`analytic_bits` of the row. Rows this codec
        :meth:`reproduces` decode to themselves.

        >>> from fedlightning.compression.codecs import Float16Codec
        >>> x = torch.tensor([[1.0, 0.1], [2.0, 3.0]])
        >>> sent, decoded = Float16Codec().encode_rows(x, client_ids=[5, 9])
        >>> sent.num_bits, sent.message(0).payload == Float16Codec().encode(x[0]).payload
        ([32, 32], True)
        >>> torch.equal(decoded[0], Float16Codec().encode(x[0]).decode())
        True
        """
        k = len(client_ids)
        shape = tuple(x.shape[1:])
        lossless = self.reproduces(x)
        decoded = x.detach() if lossless else x.detach().to(self.dtype).to(torch.float32)
        host: list[Tensor] = []

        def message(i: int) -> Message:
            if not host:  # one copy of the share (the decoded rows hold the wire's values exactly)
                host.append(decoded.to(device="cpu").contiguous())
            row = host[0][i]
            return self.borrowed(row) if lossless else self.encode(row)

        bits = self.analytic_bits(math.prod(shape))
        sent = SentShare(client_ids=client_ids, num_bits=[bits] * k, codec_names=[self.name] * k, message=message)
        return sent, decoded

    def reproduces(self, x: Tensor) -> bool:
        """Whether decoding ``x``'s message gives ``x`` back bit for bit (float32 on the float32 wire).

        The payload then holds ``x``'s own bytes, so a sender that keeps ``x`` need not decode.

        >>> x = torch.tensor([0.1, -3e38, float("nan")])
        >>> Float32Codec().reproduces(x), Float32Codec().reproduces(x.double())
        (True, False)
        >>> torch.equal(Float32Codec().encode(x).decode().view(torch.int32), x.view(torch.int32))
        True
        """
        return self.dtype == torch.float32 and x.dtype == torch.float32


class Float32Codec(DenseCodec):
    """Dense float32: 32 bits per coordinate, lossless for float32 tensors."""

    def __init__(self) -> None:
        super().__init__(dtype=torch.float32, name="float32")
