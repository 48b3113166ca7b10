"""Natural compression C_nat and exponential rounding (thesis Def 2.4.1, Table 4.3 (e)–(g)).

C_nat rounds every float32 to one of the two neighbouring powers of two, up with probability
equal to its mantissa ``m`` (``t = ±2^e(1 + m)``), so it is unbiased with ω = 1/8
(Theorem 2.4.2; the worst case ``t = (4/3)·2^a`` attains ``E[C(t)²] = (9/8)t²``). The output is
a sign and an 8-bit exponent: **9 bits per coordinate** for every normal power of two, no
header; zero is the all-zero exponent. Subnormal inputs round between their neighbouring
*subnormal* powers of two ``2^−149 … 2^−127`` (the same rule on the integer mantissa, so
ω = 1/8 holds over all finite float32); such an output is sent as the escape exponent 255
(never a finite float32 exponent) followed by 5 bits for its power, 14 bits in all. A
coordinate above ``2^127`` has no upper neighbour in float32 (``2^128`` overflows), so it is
refused with a clear error, as are inf/NaN.

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
from fedlightning.compression.operators import Compressor, refuse_non_finite

__all__ = ["DeterministicNatural", "ExponentialRounding", "NaturalCompression", "natural_round"]

_SIGN = -(1 << 31)
"""The sign bit of a float32 as an int32 mask (0x80000000)."""
_SIGN_EXP = -(1 << 23)
"""The sign and exponent bits of a float32 as an int32 mask (0xFF800000)."""
_EXP_ONE = 1 << 23


def _refuse_above_top_power(x: Tensor, who: str) -> None:
    """Refuse |x| > 2^127: its upper power of two 2^128 is not a float32."""
    if bool((x.abs() > 2.0**127).any()):
        big = float(x.abs().max())
        raise ValueError(
            f"{who} cannot round |x| = {big:.4g} (above 2^127): its upper power of two 2^128 overflows float32; "
            "scale the update down."
        )


def natural_round(x: Tensor, generator: torch.Generator) -> Tensor:
    """C_nat(x) for a float32 CPU tensor (bit-level stochastic rounding to powers of two).

    Normal ``t = ±2^e(1 + m)`` rounds up to ``2^{e+1}`` with probability ``m``; a subnormal
    ``t = ±j·2^−149`` rounds the integer ``j`` the same way between its neighbouring powers of
    two (``j = 2^23`` is ``2^−126``), so every output is a float32 power of two or zero.
    """
    refuse_non_finite(x, "natural compression")
    _refuse_above_top_power(x, "natural compression")
    bits = x.contiguous().view(torch.int32)
    draw = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    frac = bits & 0x7FFFFF
    # up with probability m = frac/2^23: draw < m, both sides scaled by 2^23 (exact), in place
    up = torch.lt(draw.mul_(float(1 << 23)), frac)
    out = (bits & _SIGN_EXP).add_(up, alpha=_EXP_ONE)  # sign and exponent; one more on the exponent when up
    sub = ((bits & 0x7F800000) == 0) & (frac != 0)
    if bool(sub.any()):
        j = frac[sub].to(torch.int64)
        low = _floor_pow2(j)
        scaled_p = (j - low).to(torch.float64).mul_(float(1 << 23)) / low.to(torch.float64)  # (j − low)/low · 2^23
        up_sub = draw[sub] < scaled_p
        out[sub] = (bits[sub] & _SIGN) + (low * (1 + up_sub.to(torch.int64))).to(torch.int32)
    return out.view(torch.float32)


def _floor_pow2(j: Tensor) -> Tensor:
    """The largest power of two ``<= j`` for positive int64 ``j`` below 2^24."""
    p = torch.floor(torch.log2(j.to(torch.float64))).to(torch.int64)
    p = torch.where(torch.bitwise_left_shift(torch.ones_like(p), p) > j, p - 1, p)
    p = torch.where(torch.bitwise_left_shift(torch.ones_like(p), p + 1) <= j, p + 1, p)
    return torch.bitwise_left_shift(torch.ones_like(p), p)


_ESCAPE = np.uint64(0xFF)
"""Exponent field of a subnormal power of two in the natural code (255 is never a finite float32's)."""


def write_natural_codes(writer: BitWriter, y: np.ndarray) -> None:
    """Append float32 powers of two (or zeros) ``y``: sign + 8-bit exponent, then 5 bits per subnormal."""
    u = np.ascontiguousarray(y, dtype=np.float32).view(np.uint32).astype(np.uint64)
    top = u >> np.uint64(23)
    frac = u & np.uint64(0x7FFFFF)
    sub = ((top & _ESCAPE) == 0) & (frac != 0)
    top[sub] |= _ESCAPE
    writer.write_array(top, 9)
    if sub.any():
        power = np.floor(np.log2(frac[sub].astype(np.float64))).astype(np.uint64)  # exact: frac is 2^power
        writer.write_array(power, 5)


def read_natural_codes(reader: BitReader, count: int) -> np.ndarray:
    """Inverse of :func:`write_natural_codes` (float32)."""
    top = reader.read_array(count, 9).astype(np.uint64)
    sub = (top & _ESCAPE) == _ESCAPE
    out = top << np.uint64(23)
    if sub.any():
        power = reader.read_array(int(sub.sum()), 5).astype(np.uint64)
        if int(power.max()) > 22:
            raise reader.error(f"a subnormal power decodes to 2^{int(power.max())}·2^-149, above 2^-127")
        out[sub] = (top[sub] & np.uint64(0x100)) << np.uint64(23) | (np.uint64(1) << power)
    return out.astype(np.uint32).view(np.float32)


class NaturalCompression(Compressor):
    """C_nat: unbiased stochastic rounding to powers of two; 9 bits per coordinate; ω = 1/8."""

    name = "natural"
    finite_output = True

    def omega(self, d: int) -> float:
        return 1.0 / 8.0

    def analytic_bits(self, d: int) -> float:
        return 9.0 * d

    def round(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """C_nat(x) without encoding (same values the message decodes to), on ``x``'s device."""
        return natural_round(x.detach().cpu(), generator).to(x.device)

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        write_natural_codes(writer, natural_round(x, generator).numpy())
        return 0

    def read(self, reader: BitReader, numel: int) -> Tensor:
        return torch.from_numpy(read_natural_codes(reader, numel).copy())


class DeterministicNatural(NaturalCompression):
    """Biased rounding to the *nearest* power of two (Table 4.3 (f), b = 2): δ = 9/8, 9 bits.

    Up from ``t = 2^e(1 + m)`` when ``m ≥ 1/2``; a subnormal rounds its integer mantissa the
    same way (escape code as in :class:`NaturalCompression`). ``|t| ≥ 1.5·2^127`` would round
    to ``2^128``, which overflows float32, and is refused.
    """

    name = "natural_deterministic"
    unbiased = False
    deterministic = True

    def omega(self, d: int) -> None:  # type: ignore[override]
        return None

    def delta(self, d: int) -> float:
        return 9.0 / 8.0

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        refuse_non_finite(x, "deterministic natural compression")
        u = x.numpy().view(np.uint32).astype(np.uint64)
        exp = (u >> np.uint64(23)) & np.uint64(0xFF)
        frac = u & np.uint64(0x7FFFFF)
        up = frac >= np.uint64(1 << 22)
        if bool((up & (exp == np.uint64(0xFE))).any()):
            raise ValueError(
                f"deterministic natural compression cannot round |x| = {float(x.abs().max()):.4g} to its nearest power "
                "of two 2^128, which overflows float32; scale the update down."
            )
        out = (u & np.uint64(0xFF800000)) + (up.astype(np.uint64) << np.uint64(23))
        sub = (exp == 0) & (frac != 0)
        if sub.any():
            j = frac[sub]
            low = np.uint64(1) << np.floor(np.log2(j.astype(np.float64))).astype(np.uint64)
            low = np.where(low > j, low >> np.uint64(1), low)
            nearest = np.where(2 * (j - low) >= low, low << np.uint64(1), low)
            out[sub] = (u[sub] & np.uint64(0x80000000)) | nearest
        write_natural_codes(writer, out.astype(np.uint32).view(np.float32))
        return 0


class ExponentialRounding(Compressor):
    """Rounding to levels ``b^k`` (Table 4.3 (e)/(f)): unbiased (stochastic) or biased (nearest).

    Unbiased: ζ = ¼(b + 1/b + 2), ω = ζ − 1 (b = 2 is C_nat). Biased (round to nearest level):
    δ = (b + 1)²/(4b). The rounding runs between the levels as the receiver decodes them
    (float32), so the output is unbiased exactly; a coordinate whose levels float32 cannot hold
    (an upper level that overflows, or subnormal levels of a non-power-of-two base whose ratio
    drifts above ``b``) is refused with a clear error. Code: a 16-bit signed smallest exponent
    ``k_min`` and a 6-bit width ``w`` (header, 22 bits), then per coordinate a sign bit and
    ``k − k_min + 1`` in ``w`` bits (0 means zero): ``22 + d(1 + w)`` bits, ``w = ⌈log2(k_max − k_min + 2)⌉``.
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
        refuse_non_finite(x, self.name)
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
        lo, hi = self._float32_levels(k), self._float32_levels(k + 1)
        self._check_levels(a, lo, hi, nz)
        p_up = torch.where(nz, (a - lo) / (hi - lo).clamp(min=1e-300), torch.zeros_like(a))
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

    def _float32_levels(self, k: Tensor) -> Tensor:
        """``b^k`` as the receiver decodes it (rounded to float32), in float64."""
        with np.errstate(over="ignore"):
            return torch.pow(self.base, k.to(torch.float64)).to(torch.float32).to(torch.float64)

    def _check_levels(self, a: Tensor, lo: Tensor, hi: Tensor, nz: Tensor) -> None:
        """Refuse coordinates whose neighbouring levels float32 cannot hold (overflow, or a ratio above b)."""
        used_hi = nz & (a > lo)
        if bool((used_hi & ~torch.isfinite(hi)).any()):
            raise ValueError(
                f"{self.name} cannot round |x| = {float(a.max()):.4g}: its upper level overflows float32; "
                "scale the update down."
            )
        ratio_ok = (lo > 0) & (hi <= lo * self.base * (1 + 2.0**-20))
        if bool((used_hi & ~ratio_ok).any()):
            tiny = float(a[used_hi & ~ratio_ok].min())
            raise ValueError(
                f"{self.name} cannot round |x| = {tiny:.4g}: float32 cannot hold its levels b^k that small to the "
                "precision its ω assumes; use a power-of-two base or scale the update up."
            )

    def read(self, reader: BitReader, numel: int) -> Tensor:
        kmin = reader.read_bits(16) - 2**15
        width = reader.read_bits(6)
        if width == 0:
            raise reader.error("the exponent width is 0; the encoder writes at least 1")
        words = reader.read_array(numel, width + 1)
        code = (words & np.uint64((1 << width) - 1)).astype(np.int64)
        neg = (words >> np.uint64(width)).astype(np.float64)
        # the encoder's own float32 levels; an exponent beyond float range is caught as non-finite in decode
        mag = self._float32_levels(torch.from_numpy(code - 1 + kmin)).numpy()
        mag = np.where(code > 0, mag, 0.0)
        return torch.from_numpy(((1 - 2 * neg) * mag).astype(np.float32))
