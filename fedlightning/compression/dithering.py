"""Random dithering: standard (QSGD, TernGrad), natural and general exponential (Def 2.5.1, (4.12)).

``C(x)_i = ‖x‖_p · sign(x_i) · ξ(|x_i|/‖x‖_p)`` where ξ rounds ``y ∈ [0, 1]`` unbiasedly to
one of two neighbouring levels:

* standard dithering, ``s`` levels: ``{0, 1/s, …, 1}`` (QSGD = p 2; TernGrad = p ∞, s 1);
* exponential dithering, base ``b``, ``s`` levels: ``{0, b^{1−s}, …, b^{−1}, 1}``
  (natural dithering is ``b = 2``).

Code: the norm as a positive float32 without its sign bit (31 bits; rounded *up* to float32
so every ``|x_i|/norm ≤ 1``; a norm that overflows float32 is refused with a clear error, use
``p=inf``), or with ``norm_code="natural"`` the norm through C_nat (Definition 2.5.1 allows
compressing it; 9 bits, ω' = 9ω/8 + 1/8), then the support of the
non-zero levels by index coding (:func:`~fedlightning.compression.index_coding.write_positions`,
which switches to a bitmap when the output is dense), one sign bit per non-zero, and the
level of each non-zero: fixed width ``⌈log2 s⌉`` bits (natural dithering's default) or
Elias gamma of the level index (``level_code="elias"``, what QSGD does). Declared header:
the norm and the position header. Each coordinate is rounded between the two neighbouring
levels *as the receiver decodes them* (norm × level in float32), so the output is unbiased
exactly, subnormal magnitudes included.

Variance (ω, r = min(p, 2)):

* exponential, Lemma 4.4.13 / Theorem 2.5.2: ``¼(b + 1/b + 2) − 1 + d^{1/r} b^{1−s} min(1, d^{1/r} b^{1−s})``;
* standard [DERIVED from the per-coordinate variance ``‖x‖_p² min(y/s, 1/(4s²))`` and
  ``‖x‖_p‖x‖₁ ≤ d^{1/r}‖x‖²``]: ``(d^{1/r}/s) · min(1, d^{1/r}/(4s))``.

Thesis bit counts (Table 2.1): natural ``31 + d(2 + log2 s)``; standard with ``u`` levels
``31 + d(3 + log2 u)``.

>>> import torch
>>> c = NaturalDithering(p=float("inf"), s=2)
>>> out = c(torch.tensor([1.0, -0.3, 0.0, 0.6]), torch.Generator().manual_seed(0))
>>> set(abs(v) for v in out.tolist()) <= {0.0, 0.5, 1.0}
True
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.index_coding import read_positions, write_positions
from fedlightning.compression.natural import natural_round, read_natural_codes, write_natural_codes
from fedlightning.compression.operators import Compressor, refuse_non_finite

__all__ = ["QSGD", "Dithering", "NaturalDithering", "StandardDithering", "TernGrad"]


def _p_norm(x: Tensor, p: float) -> float:
    if math.isinf(p):
        return float(x.abs().max()) if x.numel() else 0.0
    return float(torch.linalg.vector_norm(x.to(torch.float64), ord=p))


class Dithering(Compressor):
    """General random dithering w.r.t. the ℓ_p norm with ``s`` levels (refuses inf/NaN input).

    Args:
        p: norm (``1``, ``2``, ``inf`` or any ``p >= 1``).
        s: number of non-zero levels.
        levels: ``"standard"`` (linear) or ``"exponential"`` (base ``base``).
        base: base of exponential levels (2 = natural dithering).
        level_code: ``"fixed"`` (``⌈log2 s⌉`` bits per non-zero) or ``"elias"`` (Elias gamma).
    """

    def __init__(
        self,
        p: float = 2.0,
        s: int = 1,
        *,
        levels: str = "standard",
        base: float = 2.0,
        level_code: str = "fixed",
        norm_code: str = "float32",
        name: str | None = None,
    ) -> None:
        p = float(p)
        if p < 1:
            raise ValueError(f"Dithering needs a norm p >= 1 (got {p}).")
        if s < 1:
            raise ValueError(f"Dithering needs at least one level (got s={s}).")
        if levels not in {"standard", "exponential"}:
            raise ValueError(f"levels must be 'standard' or 'exponential' (got {levels!r}).")
        if level_code not in {"fixed", "elias"}:
            raise ValueError(f"level_code must be 'fixed' or 'elias' (got {level_code!r}).")
        if norm_code not in {"float32", "natural"}:
            raise ValueError(f"norm_code must be 'float32' or 'natural' (got {norm_code!r}).")
        if levels == "exponential" and base <= 1:
            raise ValueError(f"Exponential dithering needs base > 1 (got {base}).")
        self.finite_output = True
        self.p, self.s, self.levels, self.base, self.level_code = p, int(s), levels, float(base), level_code
        self.norm_code = norm_code
        suffix = ",norm=natural" if norm_code == "natural" else ""
        self.name = (name or f"dithering({levels},p={p:g},s={s})") + suffix

    # ------------------------------------------------------------------ metadata
    def omega(self, d: int) -> float:
        return self._norm_omega(self._levels_omega(d))

    def _levels_omega(self, d: int) -> float:
        r = min(self.p, 2.0)
        dr = d ** (1.0 / r)
        if self.levels == "exponential":
            b, s = self.base, self.s
            t = dr * b ** (1 - s)
            return 0.25 * (b + 1 / b + 2) - 1 + t * min(1.0, t)
        return dr / self.s * min(1.0, dr / (4 * self.s))

    def _norm_omega(self, omega: float) -> float:
        """With the norm through C_nat (independent of the levels), ω' = 9ω/8 + 1/8 (Theorem 2.4.4)."""
        return 9 * omega / 8 + 1 / 8 if self.norm_code == "natural" else omega

    def analytic_bits(self, d: int) -> float:
        norm = 9 if self.norm_code == "natural" else 31
        if self.levels == "exponential":
            return norm + d * (2 + math.log2(self.s))
        return norm + d * (3 + math.log2(self.s))

    def level_values(self) -> np.ndarray:
        """Level ``L`` in ``0..s`` → its value in ``[0, 1]``."""
        idx = np.arange(self.s + 1, dtype=np.float64)
        if self.levels == "standard":
            return idx / self.s
        vals = np.power(self.base, idx - self.s)
        vals[0] = 0.0
        return vals

    # ------------------------------------------------------------------ rounding
    def _levels(self, t: Tensor, values: np.ndarray, generator: torch.Generator) -> Tensor:
        """Random level index (0..s) of each magnitude ``t``, unbiased for the decoded ``values``.

        ``values[j]`` is level ``j`` as the receiver decodes it (float32, increasing, the last
        one ``>= max t``); ``t`` rounds to one of its two neighbouring values with the
        probabilities that make ``E[values[L]] = t`` exactly.
        """
        u = torch.rand(t.shape, generator=generator, dtype=torch.float64)
        v = torch.from_numpy(values)
        gaps = v[1:] - v[:-1]
        # hi − lo per interval; +inf where two levels decode equal, so that P(up) = (t − lo)/inf = 0 there
        divisors = torch.where(gaps > 0, gaps, torch.full_like(gaps, math.inf))
        # in place from here: fresh temporaries this size cost the CPU more than the arithmetic
        j = torch.searchsorted(v, t, right=True).sub_(1).clamp_(0, self.s - 1)
        lo = v.index_select(0, j)
        p_up = torch.sub(t, lo, out=lo).div_(divisors.index_select(0, j))
        return j.add_(u < p_up)

    def _decoded_values(self, scale: float) -> np.ndarray:
        """The levels times the decoded norm, rounded to float32 as the receiver does (float64)."""
        return (np.float64(scale) * self.level_values()).astype(np.float32).astype(np.float64)

    def _send_norm(self, x: Tensor) -> np.float32:
        """‖x‖_p as a float32 no smaller than it (rounded up), or a clear error when it overflows."""
        exact = _p_norm(x, self.p)
        top = float(np.finfo(np.float32).max)
        if exact > top:
            raise ValueError(
                f"{self.name}: ‖x‖_{self.p:g} = {exact:.4g} overflows float32, so its levels cannot be sent; "
                "use p=inf (the norm is then max|x_i|) or scale the update down."
            )
        norm = np.float32(exact)
        if float(norm) < exact:
            norm = np.nextafter(norm, np.float32(np.inf))
            if not np.isfinite(norm):
                raise ValueError(f"{self.name}: ‖x‖_{self.p:g} = {exact:.4g} rounds up past float32's maximum.")
        return np.float32(norm)

    # ------------------------------------------------------------------ stream
    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        refuse_non_finite(x, self.name)
        norm = self._send_norm(x)
        scale = norm
        if self.norm_code == "natural":  # Definition 2.5.1's C(‖x‖_p) with C = C_nat: 9 bits (14 if subnormal)
            start = writer.num_bits
            scale = natural_round(torch.tensor([norm]), generator).numpy()[0]
            write_natural_codes(writer, np.array([scale], dtype=np.float32))
            norm_bits = writer.num_bits - start
        else:
            writer.write_bits(int(np.array([norm], dtype=np.float32).view(np.uint32)[0]) & 0x7FFFFFFF, 31)
            norm_bits = 31
        if norm == 0 or scale == 0:
            return norm_bits + write_positions(writer, np.zeros(0, dtype=np.int64), x.numel())
        # magnitudes in units of the sent norm: |x_i|·(scale/‖x‖), unbiased over the norm's own rounding
        t = x.to(torch.float64).abs_().mul_(float(scale) / float(norm))
        L = self._levels(t, self._decoded_values(float(scale)), generator).numpy()
        positions = np.flatnonzero(L)
        header = norm_bits + write_positions(writer, positions, x.numel())
        writer.write_bitarray((x.numpy()[positions] < 0).astype(np.uint8))
        nz_levels = L[positions].astype(np.uint64)
        if self.level_code == "elias":
            writer.write_elias_gamma_array(nz_levels)
        else:
            writer.write_array(nz_levels - np.uint64(1), max(0, (self.s - 1).bit_length()))
        return header

    def read(self, reader: BitReader, numel: int) -> Tensor:
        if self.norm_code == "natural":
            norm = read_natural_codes(reader, 1)[0]
            if norm < 0:
                raise reader.error("the dithering norm decodes negative, which the encoder never sends")
        else:
            norm = np.array([reader.read_bits(31)], dtype=np.uint32).view(np.float32)[0]
        positions = read_positions(reader, numel)
        out = np.zeros(numel, dtype=np.float32)
        if positions.size == 0:
            return torch.from_numpy(out)
        neg = reader.read_bitarray(positions.size).astype(np.float64)
        if self.level_code == "elias":
            levels = reader.read_elias_gamma_array(positions.size)
        else:
            levels = reader.read_array(positions.size, max(0, (self.s - 1).bit_length())) + np.uint64(1)
        top = int(levels.max())  # compared as uint64: a 64-bit level must not wrap to a negative index
        if top > self.s:
            raise reader.error(f"a level decodes to {top}, above s={self.s}")
        L = levels.astype(np.int64)
        with np.errstate(over="ignore"):  # a corrupted norm is caught as non-finite in decode
            out[positions] = ((1 - 2 * neg) * self._decoded_values(float(norm))[L]).astype(np.float32)
        return torch.from_numpy(out)


class StandardDithering(Dithering):
    """Standard random dithering D_sta^{p,s} (linear levels ``j/s``)."""

    def __init__(self, p: float = 2.0, s: int = 1, level_code: str = "fixed", norm_code: str = "float32") -> None:
        super().__init__(
            p,
            s,
            levels="standard",
            level_code=level_code,
            norm_code=norm_code,
            name=f"standard_dithering(p={float(p):g},s={s})",
        )


class QSGD(Dithering):
    """QSGD (Alistarh et al. 2017) = standard dithering, ℓ2 norm, Elias-coded levels."""

    def __init__(self, s: int = 16, p: float = 2.0) -> None:
        super().__init__(p, s, levels="standard", level_code="elias", name=f"qsgd(p={float(p):g},s={s})")


class TernGrad(Dithering):
    """TernGrad = standard dithering with the ℓ∞ norm and one level: outputs in {−M, 0, M}."""

    def __init__(self) -> None:
        super().__init__(math.inf, 1, levels="standard", name="terngrad")


class NaturalDithering(Dithering):
    """Natural dithering D_nat^{p,s}: levels ``{0, 2^{1−s}, …, 1/2, 1}`` (Theorem 2.5.2)."""

    def __init__(self, p: float = math.inf, s: int = 2, base: float = 2.0, norm_code: str = "float32") -> None:
        super().__init__(
            p,
            s,
            levels="exponential",
            base=base,
            level_code="fixed",
            norm_code=norm_code,
            name=f"natural_dithering(p={float(p):g},s={s})"
            if base == 2
            else f"exp_dithering(b={base:g},p={float(p):g},s={s})",
        )
