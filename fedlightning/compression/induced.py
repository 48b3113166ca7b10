"""The induced compressor (thesis Ch. 5, Theorem 5.5.1): ``C(x) = C₁(x) + C₂(x − C₁(x))``.

``C₁`` is any (biased) compressor in B(δ₁), ``C₂`` an unbiased one with variance ω₂; the sum
is unbiased with ``ω = ω₂(1 − 1/δ₁)`` (the consistent reading of the theorem, methods notes
§6.4). The message carries both codes back to back (C₁'s, then C₂'s of the residual), so its
bits are ``bits(C₁(x)) + bits(C₂(residual))``. The residual exists only during compression:
no state across rounds (unlike error feedback).

>>> import torch
>>> from fedlightning.compression.sparse import RandK, TopK
>>> c = InducedCompressor(TopK(k=10), RandK(k=10))
>>> round(c.omega(100), 6)  # (d/k - 1)(1 - k/d)
8.1
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.operators import Compressor

__all__ = ["InducedCompressor"]


class InducedCompressor(Compressor):
    """Unbiased ``C₁(x) + C₂(x − C₁(x))`` from a biased ``c1`` and an unbiased ``c2``."""

    unbiased = True

    def __init__(self, c1: Compressor, c2: Compressor) -> None:
        if not c2.unbiased:
            raise ValueError(f"The induced compressor needs an unbiased C2; {c2.name} is biased.")
        self.c1, self.c2 = c1, c2
        self.finite_output = c1.finite_output and c2.finite_output
        self.name = f"induced({c1.name}+{c2.name})"

    def omega(self, d: int) -> float:
        omega2 = self.c2.omega(d)
        assert omega2 is not None
        return omega2 * (1 - 1 / self.c1.delta(d))

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        sub = BitWriter()
        header = self.c1.write(sub, x, generator)
        payload, n = sub.getvalue()
        c1x = self.c1.read(BitReader(payload, n), x.numel())  # exactly what the receiver decodes
        writer.write_payload(payload, n)
        return header + self.c2.write(writer, (x - c1x).contiguous(), generator)

    def read(self, reader: BitReader, numel: int) -> Tensor:
        return self.c1.read(reader, numel) + self.c2.read(reader, numel)
