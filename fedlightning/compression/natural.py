"""Natural compression C_nat and exponential rounding (thesis Def 2.4.1, Table 4.3 (e)–(g)).

C_nat rounds every float32 to one of the two neighbouring powers of two, up with probability
equal to its mantissa ``m`` (``t = ±2^e(1 + m)``), so it is unbiased with ω = 1/8
(Theorem 2.4.2; the worst case ``t = (4/3)·2^a`` attains ``E[C(t)²] = (9/8)t²``). The output is
a sign and an 8-bit exponent: **exactly 9 bits per coordinate**, no header; zero is the
all-zero exponent. The same bit formula handles subnormals (they round to 0 or ``2^−126``,
unbiasedly); rounding up from the largest finite exponent is clamped to ``2^127`` (biased,
only for |t| ≥ 2^127); inf/NaN are refused.

>>> import torch
>>> c = NaturalCompression()
>>> msg = c.compress(torch.tensor([0.75, -2.75, 0.0, 4.0]), torch.Generator().manual_seed(0))
>>> msg.num_bits, msg.header_bits
(36, 0)
>>> sorted(set(abs(v) for v in msg.decode().tolist()) - {0.5, 1.0, 2.0, 4.0, 0.0})
[]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.operators import Compressor

__all__ = ["DeterministicNatural", "ExponentialRounding", "NaturalCompression", "natural_round"]

_SIGN_EXP = 0xFF800000
_EXP_ONE = 1 << 23


def _check_finite(x: Tensor, who: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{who} received inf or NaN; compress finite updates only.")


def natural_round(x: Tensor, generator: torch.Generator) -> Tensor:
    """C_nat(x) for a float32 CPU tensor (bit-level stochastic rounding to powers of two)."""
    _check_finite(x, "natural compression")
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    mantissa = (u & 0x7FFFFF).to(torch.float64) / float(1 << 23)
    up = torch.rand(x.shape, generator=generator, dtype=torch.float64) < mantissa
    exp = (u >> 23) & 0xFF
    up &= ~((exp == 0xFE) & up)  # clamp: 2^127 cannot round up to infinity
    out = (u & _SIGN_EXP) + up.to(torch.int64) * _EXP_ONE
    return _bits_to_float(out)


def _bits_to_float(bits: Tensor) -> Tensor:
    arr = bits.numpy().astype(np.uint32)
    return torch.from_numpy(arr.view(np.float32).copy())


class NaturalCompression(Compressor):
    """C_nat: unbiased stochastic rounding to powers of two; 9 bits per coordinate; ω = 1/8."""

    name = "natural"
    finite_output = True

    def omega(self, d: int) -> float:
        return 1.0 / 8.0

    def analytic_bits(self, d: int) -> float:
        return 9.0 * d

    def round(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """C_nat(x) without encoding (same values the message decodes to)."""
        return natural_round(x, generator)

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        y = natural_round(x, generator)
        top = y.numpy().view(np.uint32) >> np.uint32(23)
        writer.write_array(top.astype(np.uint64), 9)
        return 0

    def read(self, reader: BitReader, numel: int) -> Tensor:
        top = reader.read_array(numel, 9).astype(np.uint32)
        return torch.from_numpy((top << np.uint32(23)).view(np.float32).copy())


class DeterministicNatural(NaturalCompression):
    """Biased rounding to the *nearest* power of two (Table 4.3 (f), b = 2): δ = 9/8, 9 bits."""

    name = "natural_deterministic"
    unbiased = False
    deterministic = True

    def omega(self, d: int) -> None:  # type: ignore[override]
        return None

    def delta(self, d: int) -> float:
        return 9.0 / 8.0

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        _check_finite(x, "deterministic natural compression")
        u = x.numpy().view(np.uint32).astype(np.uint64)
        exp = (u >> np.uint64(23)) & np.uint64(0xFF)
        up = ((u & np.uint64(0x7FFFFF)) >= np.uint64(1 << 22)) & (exp != np.uint64(0xFE))
        top = (u >> np.uint64(23)) + up.astype(np.uint64)
        writer.write_array(top, 9)
        return 0


class ExponentialRounding(Compressor):
    """Rounding to levels ``b^k`` (Table 4.3 (e)/(f)): unbiased (stochastic) or biased (nearest).

    Unbiased: ζ = ¼(b + 1/b + 2), ω = ζ − 1 (b = 2 is C_nat). Biased (round to nearest level):
    δ = (b + 1)²/(4b). Code: a 16-bit signed smallest exponent ``k_min`` and a 6-bit width ``w``
    (header, 22 bits), then per coordinate a sign bit and ``k − k_min + 1`` in ``w`` bits
    (0 means zero): ``22 + d(1 + w)`` bits, ``w = ⌈log2(k_max − k_min + 2)⌉``.
    """

    def __init__(self, base: float = 2.0, unbiased: bool = True) -> None:
        if base <= 1:
            raise ValueError(f"Exponential rounding needs base > 1 (got {base}).")
        self.base = float(base)
        self.finite_output = True
        self.unbiased = unbiased
        self.deterministic = not unbiased
        self.name = f"exp_rounding(b={base:g},{'unbiased' if unbiased else 'nearest'})"

    def omega(self, d: int) -> float | None:
        b = self.base
        return 0.25 * (b + 1 / b + 2) - 1 if self.unbiased else None

    def delta(self, d: int) -> float:
        b = self.base
        return 0.25 * (b + 1 / b + 2) if self.unbiased else (b + 1) ** 2 / (4 * b)

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        _check_finite(x, self.name)
        v = x.to(torch.float64)
        a = v.abs()
        nz = a > 0
        logb = math.log(self.base)
        k = torch.zeros_like(v, dtype=torch.int64)
        k[nz] = torch.floor(torch.log(a[nz]) / logb).to(torch.int64)
        lo = torch.pow(self.base, k.to(torch.float64))
        # fix floating error in floor(log): ensure lo <= a < b*lo
        too_big = nz & (lo > a)
        k[too_big] -= 1
        lo = torch.pow(self.base, k.to(torch.float64))
        too_small = nz & (lo * self.base <= a)
        k[too_small] += 1
        lo = torch.pow(self.base, k.to(torch.float64))
        hi = lo * self.base
        p_up = (a - lo) / (hi - lo)
        if self.unbiased:  # round up with probability p_up
            draw = torch.rand(v.shape, generator=generator, dtype=torch.float64)
        else:  # round to the nearest level
            draw = torch.full_like(p_up, 0.5 - 1e-12)
        up = draw < p_up
        k = k + (up & nz).to(torch.int64)
        header = 16 + 6
        if nz.any():
            kmin, kmax = int(k[nz].min()), int(k[nz].max())
        else:
            kmin = kmax = 0
        if not -(2**15) <= kmin < 2**15:
            raise ValueError(f"{self.name}: exponent {kmin} outside the 16-bit header range.")
        width = max(1, int(kmax - kmin + 2 - 1).bit_length())
        writer.write_bits(kmin + 2**15, 16)
        writer.write_bits(width, 6)
        code = torch.where(nz, k - kmin + 1, torch.zeros_like(k)).numpy().astype(np.uint64)
        signs = (v < 0).numpy().astype(np.uint64)
        writer.write_array((signs << np.uint64(width)) | code, width + 1)
        return header

    def read(self, reader: BitReader, numel: int) -> Tensor:
        kmin = reader.read_bits(16) - 2**15
        width = reader.read_bits(6)
        if width == 0:
            raise reader.error("the exponent width is 0; the encoder writes at least 1")
        words = reader.read_array(numel, width + 1)
        code = (words & np.uint64((1 << width) - 1)).astype(np.int64)
        neg = (words >> np.uint64(width)).astype(np.float64)
        with np.errstate(over="ignore"):  # an exponent beyond float range is caught as non-finite in decode
            mag = np.where(code > 0, np.power(self.base, (code - 1 + kmin).astype(np.float64)), 0.0)
            return torch.from_numpy(((1 - 2 * neg) * mag).astype(np.float32))
