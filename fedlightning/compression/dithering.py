"""Random dithering: standard (QSGD, TernGrad), natural and general exponential (Def 2.5.1, (4.12)).

``C(x)_i = ‖x‖_p · sign(x_i) · ξ(|x_i|/‖x‖_p)`` where ξ rounds ``y ∈ [0, 1]`` unbiasedly to
one of two neighbouring levels:

* standard dithering, ``s`` levels: ``{0, 1/s, …, 1}`` (QSGD = p 2; TernGrad = p ∞, s 1);
* exponential dithering, base ``b``, ``s`` levels: ``{0, b^{1−s}, …, b^{−1}, 1}``
  (natural dithering is ``b = 2``).

Code: the norm as a positive float32 without its sign bit (31 bits), the support of the
non-zero levels by index coding (:func:`~fedlightning.compression.index_coding.write_positions`,
which switches to a bitmap when the output is dense), one sign bit per non-zero, and the
level of each non-zero: fixed width ``⌈log2 s⌉`` bits (natural dithering's default) or
Elias gamma of the level index (``level_code="elias"``, what QSGD does). Declared header:
the 31-bit norm and the position header.

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
from fedlightning.compression.operators import Compressor

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
        if levels == "exponential" and base <= 1:
            raise ValueError(f"Exponential dithering needs base > 1 (got {base}).")
        self.finite_output = True
        self.p, self.s, self.levels, self.base, self.level_code = p, int(s), levels, float(base), level_code
        self.name = name or f"dithering({levels},p={p:g},s={s})"

    # ------------------------------------------------------------------ metadata
    def omega(self, d: int) -> float:
        r = min(self.p, 2.0)
        dr = d ** (1.0 / r)
        if self.levels == "exponential":
            b, s = self.base, self.s
            t = dr * b ** (1 - s)
            return 0.25 * (b + 1 / b + 2) - 1 + t * min(1.0, t)
        return dr / self.s * min(1.0, dr / (4 * self.s))

    def analytic_bits(self, d: int) -> float:
        if self.levels == "exponential":
            return 31 + d * (2 + math.log2(self.s))
        return 31 + d * (3 + math.log2(self.s))

    def level_values(self) -> np.ndarray:
        """Level ``L`` in ``0..s`` → its value in ``[0, 1]``."""
        idx = np.arange(self.s + 1, dtype=np.float64)
        if self.levels == "standard":
            return idx / self.s
        vals = np.power(self.base, idx - self.s)
        vals[0] = 0.0
        return vals

    # ------------------------------------------------------------------ rounding
    def _levels(self, y: Tensor, generator: torch.Generator) -> Tensor:
        """Random level index (0..s) of each ``y`` in [0, 1], unbiased: E[value(L)] = y."""
        u = torch.rand(y.shape, generator=generator, dtype=torch.float64)
        if self.levels == "standard":
            t = y * self.s
            j = torch.floor(t).clamp(max=self.s)
            return (j + (u < t - j).to(torch.float64)).clamp(max=self.s).to(torch.int64)
        b, s = self.base, self.s
        lmin = b ** (1 - s)
        L = torch.zeros(y.shape, dtype=torch.int64)
        low = y < lmin
        L[low] = (u[low] < y[low] / lmin).to(torch.int64)
        hi_mask = ~low
        yh = y[hi_mask]
        k = torch.floor(torch.log(yh) / math.log(b)).clamp(min=1 - s, max=0)
        lo = torch.pow(b, k)
        k = torch.where(lo > yh, k - 1, k).clamp(min=1 - s)
        lo = torch.pow(b, k)
        k = torch.where((lo * b <= yh) & (k < 0), k + 1, k)
        lo = torch.pow(b, k)
        p_up = ((yh - lo) / (lo * b - lo)).clamp(0, 1)
        Lh = (k + s).to(torch.int64) + (u[hi_mask] < p_up).to(torch.int64)
        L[hi_mask] = Lh.clamp(max=s)
        return L

    # ------------------------------------------------------------------ stream
    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        if not torch.isfinite(x).all():
            raise ValueError(f"{self.name} received inf or NaN.")
        norm = np.float32(_p_norm(x, self.p))
        writer.write_bits(int(np.array([norm], dtype=np.float32).view(np.uint32)[0]) & 0x7FFFFFFF, 31)
        if norm == 0:
            return 31 + write_positions(writer, np.zeros(0, dtype=np.int64), x.numel())
        y = (x.to(torch.float64).abs() / float(norm)).clamp(max=1.0)
        L = self._levels(y, generator)
        positions = torch.nonzero(L, as_tuple=True)[0]
        header = 31 + write_positions(writer, positions, x.numel())
        writer.write_bitarray((x[positions] < 0).numpy().astype(np.uint8))
        nz_levels = L[positions].numpy().astype(np.uint64)
        if self.level_code == "elias":
            writer.write_elias_gamma_array(nz_levels)
        else:
            writer.write_array(nz_levels - np.uint64(1), max(0, (self.s - 1).bit_length()))
        return header

    def read(self, reader: BitReader, numel: int) -> Tensor:
        norm = np.array([reader.read_bits(31)], dtype=np.uint32).view(np.float32)[0]
        positions = read_positions(reader, numel)
        out = np.zeros(numel, dtype=np.float32)
        if positions.size == 0:
            return torch.from_numpy(out)
        neg = reader.read_bitarray(positions.size).astype(np.float64)
        if self.level_code == "elias":
            L = reader.read_elias_gamma_array(positions.size).astype(np.int64)
        else:
            L = reader.read_array(positions.size, max(0, (self.s - 1).bit_length())).astype(np.int64) + 1
        if L.max() > self.s:
            raise reader.error(f"a level decodes to {L.max()}, above s={self.s}")
        out[positions] = ((1 - 2 * neg) * float(norm) * self.level_values()[L]).astype(np.float32)
        return torch.from_numpy(out)


class StandardDithering(Dithering):
    """Standard random dithering D_sta^{p,s} (linear levels ``j/s``)."""

    def __init__(self, p: float = 2.0, s: int = 1, level_code: str = "fixed") -> None:
        super().__init__(
            p, s, levels="standard", level_code=level_code, name=f"standard_dithering(p={float(p):g},s={s})"
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

    def __init__(self, p: float = math.inf, s: int = 2, base: float = 2.0) -> None:
        super().__init__(
            p,
            s,
            levels="exponential",
            base=base,
            level_code="fixed",
            name=f"natural_dithering(p={float(p):g},s={s})"
            if base == 2
            else f"exp_dithering(b={base:g},p={float(p):g},s={s})",
        )
