"""Sparsifiers (thesis Table 4.3 (a)–(d), NU Rand-1, Wangni gradient sparsification).

Every sparsifier's message is the index-coded support
(:func:`~fedlightning.compression.index_coding.write_positions`, near ``log2 C(d, k)`` bits)
followed by the kept values in a value code: ``float32`` (default), ``float16`` (scaled by
a float32 ``max|v|``), ``bfloat16``, ``int8`` (8-bit linear with a float32 scale) or
``natural`` (the values are first passed through C_nat, unbiasedly, then sent in 9 bits:
the composition ``C_nat ∘ C`` of Theorem 2.4.4, ω' = 9ω/8 + 1/8).

The float16, bfloat16 and int8 codes round deterministically, so an operator sending them is
biased (use it with error feedback); its δ follows from the code's ε
(:meth:`~fedlightning.compression.values.ValueCodec.relative_error`, ``‖Q(v) − v‖² ≤ ε‖v‖²``):
for the unscaled selections ``‖C(x) − x‖² = ‖x − S(x)‖² + ‖Q(v) − v‖²`` gives
``δ = δ_S/(1 − ε)``; for the rescaled ones (Rand-k, NU Rand-1, gradient sparsification,
variance ω) ``E‖C(x) − x‖² ≤ (√ω + √(ε(ω + 1)))²‖x‖²`` [DERIVED], a finite δ only when this
is below ‖x‖² (Rand-k at fraction 1). Values a code cannot carry within ε, and rescaled
values ``(d/k)·x_i`` that overflow float32, are refused in one sentence.

``k`` is given directly or as a density ``fraction`` (``k = max(1, ⌊d·fraction⌋)``, the
authors' convention), evaluated on each block when applied layer-wise.

>>> import torch
>>> x = torch.tensor([0.1, -3.0, 0.2, 2.0])
>>> TopK(k=2)(x).tolist()
[0.0, -3.0, 0.0, 2.0]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedlightning.compression.bitstream import BitReader, BitWriter
from fedlightning.compression.index_coding import log2_binomial, read_positions, write_positions
from fedlightning.compression.natural import natural_round
from fedlightning.compression.operators import Compressor, refuse_non_finite
from fedlightning.compression.values import ScaledFloat16Values, ValueCodec, check_value_loss, value_codec

LOSSY_VALUES = frozenset({"float16", "bfloat16", "int8", "8bit"})
"""Value codes that round deterministically (operators sending them are biased)."""

__all__ = [
    "LOSSY_VALUES",
    "AdaptiveRandomSparsification",
    "BiasedRandomSparsification",
    "GradientSparsification",
    "NURand1",
    "RandK",
    "Sparsifier",
    "TopK",
    "TopKThen",
]


class Sparsifier(Compressor):
    """Base of the sparsifiers: ``select`` chooses positions and values; the rest is coding."""

    finite_output = True

    def __init__(self, *, k: int | None = None, fraction: float | None = None, values: str = "float32") -> None:
        if (k is None) == (fraction is None):
            raise ValueError(
                f"Give exactly one of k (kept coordinates) or fraction (their share), the other null (got k={k}, "
                f"fraction={fraction}); set e.g. fraction=0.01 with k=null."
            )
        if k is not None and k < 1:
            raise ValueError(f"k must be at least 1 (got {k}); set e.g. k=100.")
        if fraction is not None and not 0 < fraction <= 1:  # nan included
            raise ValueError(
                f"fraction must lie in (0, 1] (got {fraction}); set e.g. fraction=0.01 (1% of the coordinates)."
            )
        self.k_fixed = k
        self.fraction = fraction
        self.values_name = values
        self.values: ValueCodec = ScaledFloat16Values() if values == "float16" else value_codec(values)
        self.lossy_values = values in LOSSY_VALUES

    def k_of(self, d: int) -> int:
        """Kept coordinates in dimension ``d``."""
        if self.k_fixed is not None:
            return min(self.k_fixed, d)
        assert self.fraction is not None
        return max(1, min(d, math.floor(d * self.fraction)))

    def _kdesc(self) -> str:
        return f"k={self.k_fixed}" if self.k_fixed is not None else f"{self.fraction:g}"

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Sorted positions and the values to send there (before value coding)."""
        raise NotImplementedError

    def _value_omega(self, omega: float) -> float:
        return 9 * omega / 8 + 1 / 8 if self.values_name == "natural" else omega

    def _rescaled_delta(self, omega: float, d: int) -> float:
        """δ of a rescaled (unbiased before value coding) sparsifier sending lossy values."""
        if not self.lossy_values:
            return omega + 1.0
        eps = self.values.relative_error(d)
        t = (math.sqrt(omega) + math.sqrt(eps * (omega + 1.0))) ** 2
        return 1.0 / (1.0 - t) if t < 1 else math.inf

    def _selection_delta(self, delta: float, count: int) -> float:
        """δ of an unscaled selection with selection δ ``delta`` sending ``count`` lossy values."""
        eps = self.values.relative_error(count) if self.lossy_values else 0.0
        return delta / (1.0 - eps) if eps < 1 else math.inf

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        refuse_non_finite(x, self.name)
        positions, vals = self.select(x, generator)
        vals = vals.to(torch.float32)
        if not bool(torch.isfinite(vals).all()):
            raise ValueError(
                f"{self.name}: the rescaled values overflow float32 (|x_i| up to {float(x.abs().max()):.4g}); "
                "scale the update down or keep more coordinates."
            )
        if self.values_name == "natural":
            vals = natural_round(vals.contiguous(), generator)
        header = write_positions(writer, positions, x.numel())
        v = vals.numpy()
        check_value_loss(self.values, v, self.name)
        self.values.write(writer, v)
        return header + (self.values.header_bits if v.size else 0)

    def read(self, reader: BitReader, numel: int) -> Tensor:
        positions = read_positions(reader, numel)
        v = self.values.read(reader, positions.size)
        out = torch.zeros(numel, dtype=torch.float32)
        out[torch.from_numpy(positions)] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
        return out

    def bound_bits(self, d: int, k: int) -> float:
        """``log2 C(d, k)`` + value bits: the information bound for ``k`` kept coordinates."""
        return log2_binomial(d, k) + self.values.bits(k)

    def analytic_bits(self, d: int) -> float:
        """Thesis convention (Table 2.1): per kept coordinate value bits + 1 + log2 d."""
        k = self.k_of(d)
        return k * (self.values.bits_per_value + 1 + math.log2(d)) + self.values.header_bits


class RandK(Sparsifier):
    """Unbiased random sparsification: ``(d/k)·x_i`` on a uniform ``k``-subset; ω = d/k − 1."""

    def __init__(self, k: int | None = None, fraction: float | None = None, values: str = "float32") -> None:
        super().__init__(k=k, fraction=fraction, values=values)
        self.name = f"rand_k({self._kdesc()},{values})"
        self.unbiased = not self.lossy_values

    def omega(self, d: int) -> float | None:
        return None if self.lossy_values else self._value_omega(d / self.k_of(d) - 1)

    def delta(self, d: int) -> float:
        return self._rescaled_delta(self._value_omega(d / self.k_of(d) - 1), d)

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        d = x.numel()
        k = self.k_of(d)
        positions = torch.randperm(d, generator=generator)[:k].sort().values
        return positions, (x[positions].to(torch.float64) * (d / k)).to(torch.float32)


class TopK(Sparsifier):
    """Top-k: the ``k`` largest magnitudes, unscaled; biased, δ = d/k (Lemma 4.4.9).

    With ``values="natural"`` the kept values go through C_nat (second moment 9/8), so
    δ = d/((2 − 9/8)k) [DERIVED, Theorem 4.4.5 route]; with a lossy value code of error ε,
    δ = d/((1 − ε)k) (the dropped and the rounded coordinates are disjoint).
    """

    unbiased = False
    deterministic = True

    def __init__(self, k: int | None = None, fraction: float | None = None, values: str = "float32") -> None:
        super().__init__(k=k, fraction=fraction, values=values)
        self.name = f"top_k({self._kdesc()},{values})"
        if values == "natural":
            self.deterministic = False

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        base = d / self.k_of(d)
        if self.values_name == "natural":
            return base / (2 - 9 / 8)
        return self._selection_delta(base, self.k_of(d))

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        k = self.k_of(x.numel())
        positions = torch.topk(x.abs(), k, sorted=False).indices.sort().values
        return positions, x[positions]


class BiasedRandomSparsification(Sparsifier):
    """Keep each coordinate independently w.p. ``q``, unscaled (4.7): δ = 1/q (Lemma 4.4.7)."""

    unbiased = False

    def __init__(self, q: float = 0.1, values: str = "float32") -> None:
        super().__init__(fraction=q, values=values)
        self.q = float(q)
        self.name = f"biased_rand(q={q:g},{values})"

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        return self._selection_delta(1.0 / self.q, d)

    def analytic_bits(self, d: int) -> float:
        return self.q * d * (self.values.bits_per_value + 1 + math.log2(d))

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        keep = torch.rand(x.shape, generator=generator, dtype=torch.float64) < self.q
        positions = torch.nonzero(keep, as_tuple=True)[0]
        return positions, x[positions]


class AdaptiveRandomSparsification(Sparsifier):
    """One coordinate ``x_i e_i`` w.p. ``|x_i|/‖x‖₁``, unscaled (4.8): δ = d (Lemma 4.4.8)."""

    unbiased = False

    def __init__(self, values: str = "float32") -> None:
        super().__init__(k=1, values=values)
        self.name = f"adaptive_rand({values})"

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        return self._selection_delta(float(d), 1)

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a = x.abs().to(torch.float64)
        if a.sum() == 0:
            return torch.zeros(0, dtype=torch.int64), x[:0]
        i = torch.multinomial(a / a.sum(), 1, generator=generator)
        return i, x[i]


class NURand1(Sparsifier):
    """Unbiased sibling of adaptive sparsification: ``sign(x_i)‖x‖₁ e_i`` w.p. ``|x_i|/‖x‖₁``.

    ``E‖C(x)‖² = ‖x‖₁²`` so ω(x) = ‖x‖₁²/‖x‖² − 1 ≤ d − 1 (metadata: the worst case d − 1).
    """

    def __init__(self, values: str = "float32") -> None:
        super().__init__(k=1, values=values)
        self.name = f"nu_rand_1({values})"
        self.unbiased = not self.lossy_values

    def omega(self, d: int) -> float | None:
        return None if self.lossy_values else self._value_omega(d - 1.0)

    def delta(self, d: int) -> float:
        return self._rescaled_delta(self._value_omega(d - 1.0), d)

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        a = x.abs().to(torch.float64)
        l1 = a.sum()
        if l1 == 0:
            return torch.zeros(0, dtype=torch.int64), x[:0]
        i = torch.multinomial(a / l1, 1, generator=generator)
        return i, (torch.sign(x[i]).to(torch.float64) * l1).to(torch.float32)


class GradientSparsification(Sparsifier):
    """Wangni et al. (2018) gradient sparsification, the authors' greedy calibration (arXiv 1710.09854).

    Budget ``r = k`` (or ``⌊d·fraction⌋``): ``p = min(r|x|/‖x‖₁, 1)``, then up to 4 passes
    ``c = (r − d + #{p<1}) / Σ_{p<1} p``, ``p ← min(c p, 1)`` until ``c ≤ 1``; keep
    ``x_i/p_i`` w.p. ``p_i`` (always rescaled: unbiased). ω ≤ d/r − 1 [DERIVED].
    """

    def __init__(
        self, k: int | None = None, fraction: float | None = None, values: str = "float32", max_iter: int = 4
    ) -> None:
        super().__init__(k=k, fraction=fraction, values=values)
        self.max_iter = max_iter
        self.name = f"grad_spars({self._kdesc()},{values})"
        self.unbiased = not self.lossy_values

    def omega(self, d: int) -> float | None:
        return None if self.lossy_values else self._value_omega(d / self.k_of(d) - 1)

    def delta(self, d: int) -> float:
        return self._rescaled_delta(self._value_omega(d / self.k_of(d) - 1), d)

    def probabilities(self, x: Tensor) -> Tensor:
        """Keep probabilities ``p_i`` (float64)."""
        d = x.numel()
        r = self.k_of(d)
        a = x.abs().to(torch.float64)
        l1 = a.sum()
        if l1 == 0:
            return torch.zeros_like(a)
        p = (r * a / l1).clamp(max=1.0)
        for _ in range(self.max_iter):
            unsat = p < 1
            denom = p[unsat].sum()
            if denom <= 0:
                break
            c = (r - d + int(unsat.sum())) / float(denom)
            p = torch.where(unsat, (c * p).clamp(max=1.0), p)
            if c <= 1:
                break
        return p

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        p = self.probabilities(x)
        keep = (torch.rand(x.shape, generator=generator, dtype=torch.float64) < p) & (p > 0)
        positions = torch.nonzero(keep, as_tuple=True)[0]
        return positions, (x[positions].to(torch.float64) / p[positions]).to(torch.float32)


class TopKThen(Compressor):
    """Top-k followed by another compressor on the kept values (e.g. natural dithering, (4.14)).

    Message: index-coded support, then ``inner``'s code of the ``k``-vector. Biased; with
    ``ζ = ω_inner(k) + 1 < 2`` the unscaled operator has δ = d/((2 − ζ)k) (derived from the
    composition rules of Table 4.3 of the thesis, arXiv 2207.00392).
    """

    unbiased = False

    def __init__(self, inner: Compressor, k: int | None = None, fraction: float | None = None) -> None:
        self.top = TopK(k=k, fraction=fraction)
        self.inner = inner
        self.finite_output = inner.finite_output
        self.name = f"top_k({self.top._kdesc()})+{inner.name}"

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        k = self.top.k_of(d)
        zeta = (self.inner.omega(k) or 0.0) + 1.0
        return d / ((2 - zeta) * k) if zeta < 2 else math.inf

    def write(self, writer: BitWriter, x: Tensor, generator: torch.Generator) -> int:
        positions, vals = self.top.select(x, generator)
        header = write_positions(writer, positions, x.numel())
        return header + self.inner.write(writer, vals.contiguous(), generator)

    def read(self, reader: BitReader, numel: int) -> Tensor:
        positions = read_positions(reader, numel)
        out = torch.zeros(numel, dtype=torch.float32)
        vals = self.inner.read(reader, positions.size)
        out[torch.from_numpy(positions)] = vals
        return out
