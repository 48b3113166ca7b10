"""Compression operators: the common interface, identity, sign operators and compositions.

A :class:`Compressor` maps a tensor to a :class:`~fedlightning.federated.message.Message`
whose payload is the exact bitstream of ``C(x)``; ``message.decode()`` is ``C(x)`` itself
(what the receiver reconstructs), so the bits measured and the vector used are one object.

Every operator is self-delimiting inside a larger stream: ``write(writer, x, generator)``
appends its code for a flat float32 ``x`` and returns the header bits it declares;
``read(reader, numel)`` reads it back. That is how compositions, the induced compressor and
layer-wise (per-tensor) application share one message.

Metadata (thesis arXiv 2207.00392, §1.6 conventions):

* ``unbiased``: ``E[C(x)] = x``;
* ``omega(d)``: for unbiased operators, ``E‖C(x) − x‖² ≤ ω‖x‖²`` in dimension ``d``;
* ``finite_output``: the encoder refuses inf/NaN, so a decoded non-finite value means a
  corrupted message (:meth:`Compressor.decode` raises
  :class:`~fedlightning.errors.MessageDecodeError`);
* ``delta(d)``: the B³ parameter, ``E‖C(x) − x‖² ≤ (1 − 1/δ)‖x‖²`` (for an unbiased operator
  this is ``ω + 1``, the parameter of its scaled version ``C/(ω+1)``, Lemma 1.6.7);
  ``math.inf`` when no finite δ holds (plain sign).

>>> import torch
>>> c = Identity()
>>> msg = c.compress(torch.arange(4.0))
>>> msg.num_bits, c.omega(4), c.delta(4)
(128, 0.0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.federated.message import Message
from fedlightning.federated.payloads import DENSE_UPDATES, Payload

__all__ = [
    "Blockwise",
    "Compressor",
    "Identity",
    "ScaledSign",
    "Sign",
    "default_generator",
    "flat_cpu",
]


def flat_cpu(x: Tensor) -> Tensor:
    """``x`` flattened to a contiguous float32 CPU tensor."""
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()


def refuse_non_finite(x: Tensor, who: str) -> None:
    """Stop, in one sentence naming ``who``, unless every entry of ``x`` is finite.

    On the CPU NumPy decides (about ten times faster than ``torch.isfinite`` there).
    """
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        finite = bool(np.isfinite(x.detach().numpy()).all())
    else:
        finite = bool(torch.isfinite(x).all())
    if not finite:
        raise ValueError(f"{who} received inf or NaN; compress finite updates only.")


def default_generator() -> torch.Generator:
    """A generator seeded with 0 (used only when the caller passes none)."""
    return torch.Generator().manual_seed(0)


class Compressor:
    """Base class of every compression operator (see the module docstring)."""

    name = "compressor"
    unbiased = True
    deterministic = False
    accepts: frozenset[Payload] = DENSE_UPDATES
    """Payloads this operator understands: real-valued updates (model deltas, gradients)."""
    finite_output = False
    """True when :meth:`write` refuses inf/NaN: a valid message then decodes to finite values."""

    # ------------------------------------------------------------------ metadata
    def omega(self, d: int) -> float | None:
        """Variance parameter ω in dimension ``d`` (``None`` for biased operators)."""
        raise NotImplementedError

    def delta(self, d: int) -> float:
        """B³ parameter δ in dimension ``d`` (``ω + 1`` for unbiased operators)."""
        om = self.omega(d)
        if om is None:
            raise NotImplementedError
        return om + 1.0

    def analytic_bits(self, d: int) -> float | None:
        """The thesis's bit count for a message of dimension ``d`` (``None`` if data-dependent)."""
        return None

    # ------------------------------------------------------------------ stream interface
    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        """Append the code of ``C(x)`` for flat float32 CPU ``x``; return declared header bits."""
        raise NotImplementedError

    def read(self, reader: BitReader, numel: int) -> Tensor:
        """Read back ``C(x)`` (flat float32) written by :meth:`write`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ message interface
    def compress(self, x: Tensor, generator: torch.Generator | None = None) -> Message:
        """The message carrying ``C(x)``; ``message.decode()`` has ``x``'s shape."""
        w = BitWriter()
        header = self.write(w, flat_cpu(x), generator or default_generator())
        payload, n = w.getvalue()
        return Message(payload=payload, num_bits=n, codec=self, shape=tuple(x.shape), header_bits=header)

    encode = compress  # a compressor is also a Codec (deterministic ones need no generator)

    def decode(self, message: Message) -> Tensor:
        """``C(x)`` from the message; a malformed stream raises :class:`~fedlightning.errors.MessageDecodeError`."""
        r = BitReader(message.payload, message.num_bits, codec=self.name)
        out = self.read(r, math.prod(message.shape))
        if r.remaining:
            raise r.error(f"{r.remaining} bits are left after decoding")
        if self.finite_output and not bool(np.isfinite(out.numpy()).all()):  # NumPy: far faster than torch on CPU
            raise r.error("the stream decodes to inf or NaN, which this operator never sends")
        return out.reshape(message.shape)

    def blockwise(self, sizes: Sequence[int]) -> Compressor:
        """This operator applied to consecutive blocks of ``sizes`` entries: layer-wise (:class:`Blockwise`)."""
        return Blockwise(self, list(sizes))

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``C(x)`` as the receiver decodes it, on ``x``'s device."""
        return self.compress(x, generator).decode().to(x.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class Identity(Compressor):
    """No compression: float32, 32 bits per coordinate (ω = 0, δ = 1)."""

    name = "identity"
    deterministic = True

    def omega(self, d: int) -> float:
        return 0.0

    def analytic_bits(self, d: int) -> float:
        return 32.0 * d

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        writer.write_array(x.numpy().view(np.uint32), 32)
        return 0

    def read(self, reader: BitReader, numel: int) -> Tensor:
        return torch.from_numpy(reader.read_array(numel, 32).astype(np.uint32).view(np.float32).copy())


class Sign(Compressor):
    """``sign(x)`` (signSGD), 1 bit per coordinate; zero is sent as +1. Biased, no finite δ.

    inf/NaN are refused (NaN has no sign: sending +1 would hide a diverged update).
    """

    name = "sign"
    unbiased = False
    deterministic = True
    finite_output = True

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        return math.inf

    def analytic_bits(self, d: int) -> float:
        return float(d)

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        refuse_non_finite(x, self.name)
        writer.write_bitarray((x.numpy() < 0).astype(np.uint8))
        return 0

    def read(self, reader: BitReader, numel: int) -> Tensor:
        neg = reader.read_bitarray(numel).astype(np.float32)
        return torch.from_numpy(1.0 - 2.0 * neg)


class ScaledSign(Compressor):
    """``(‖x‖₁/d)·sign(x)``: one float32 scale + 1 bit per coordinate.

    Deterministic; ``‖C(x) − x‖² = ‖x‖² − ‖x‖₁²/d ≤ (1 − 1/d)‖x‖²`` so δ = d [DERIVED].
    inf/NaN are refused.
    """

    name = "scaled_sign"
    unbiased = False
    deterministic = True
    finite_output = True

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        return float(d)

    def analytic_bits(self, d: int) -> float:
        return 32.0 + d

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        refuse_non_finite(x, self.name)
        scale = np.float32(x.abs().sum(dtype=torch.float64).item() / max(x.numel(), 1))
        writer.write_array(np.array([scale], dtype=np.float32).view(np.uint32), 32)
        writer.write_bitarray((x.numpy() < 0).astype(np.uint8))
        return 32

    def read(self, reader: BitReader, numel: int) -> Tensor:
        scale = reader.read_array(1, 32).astype(np.uint32).view(np.float32)[0]
        if not np.isfinite(scale) or scale < 0:
            raise reader.error(f"the scale is {scale}; the encoder sends a finite mean magnitude")
        neg = reader.read_bitarray(numel).astype(np.float32)
        return torch.from_numpy((1.0 - 2.0 * neg) * scale)


class Blockwise(Compressor):
    """Apply ``inner`` to consecutive blocks (parameter tensors) of a flat vector: layer-wise.

    One message holds every block's code in order; ω and δ are the worst over the blocks.
    """

    def __init__(self, inner: Compressor, sizes: list[int]) -> None:
        self.inner = inner
        self.sizes = [int(s) for s in sizes]
        self.name = f"{inner.name}/layerwise"
        self.unbiased = inner.unbiased
        self.deterministic = inner.deterministic
        self.finite_output = inner.finite_output

    def omega(self, d: int) -> float | None:
        if not self.unbiased:
            return None
        return max(self.inner.omega(s) or 0.0 for s in self.sizes)

    def delta(self, d: int) -> float:
        return max(self.inner.delta(s) for s in self.sizes)

    def analytic_bits(self, d: int) -> float | None:
        parts = [self.inner.analytic_bits(s) for s in self.sizes]
        return None if any(p is None for p in parts) else float(sum(parts))  # type: ignore[arg-type]

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        if sum(self.sizes) != x.numel():
            raise ValueError(f"Blockwise sizes sum to {sum(self.sizes)}, the tensor has {x.numel()} entries.")
        header = 0
        for block in torch.split(x, self.sizes):
            header += self.inner.write(writer, block.contiguous(), generator)
        return header

    def read(self, reader: BitReader, numel: int) -> Tensor:
        return torch.cat([self.inner.read(reader, s) for s in self.sizes])
