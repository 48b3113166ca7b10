"""Compressed gradient descent on quadratics: the thesis's small convex experiments (arXiv 2207.00392).

* :class:`Quadratic`: ``n`` workers with ``f_i(x) = xᵀA_i x − b_iᵀx + c_i`` and ``f = (1/n) Σ f_i``;
  the builders give the problems of Figs. 4.7 and 4.8 (:func:`random_quadratic`,
  :func:`least_squares`) and Example 4.7.1, the Top-1 counterexample of Fig. 5.1
  (:func:`top1_counterexample`).
* :func:`dcgd`: distributed compressed gradient descent ``x ← x − (η/n) Σ_i C(∇f_i(x))``
  (Algorithm 5), or with error feedback ``C(e_i + η∇f_i(x))`` (Algorithm 4/6), through the
  operators of :mod:`fedlightning.compression` (their messages, their bits).
* :func:`descent_step`: the step size for which the descent lemma guarantees progress in
  expectation with a given operator (the per-operator steps of the Fig. 4.5 and 4.6 runs).
* :func:`cgd_theory_curve`: the adaptive form of Theorem 4.5.3 the thesis draws in Figs. 4.7
  and 4.8, ``Π_{i≤k} (1 − μ/(L δ_i))`` with ``1 − 1/δ_i = ‖C(g_i) − g_i‖²/‖g_i‖²`` measured
  along the run.

Arithmetic is float64; the operators see float32 vectors (their wire format).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedlightning.compression.operators import Compressor
from fedlightning.compression.sparse import RandK, TopKThen

__all__ = [
    "DCGDTrace",
    "Quadratic",
    "UnscaledRandK",
    "cgd_theory_curve",
    "dcgd",
    "descent_step",
    "least_squares",
    "random_quadratic",
    "top1_counterexample",
]


class UnscaledRandK(RandK):
    """``(k/d)·Rand-k``: ``x_i`` on a uniform ``k``-subset, not rescaled; biased, δ = d/k (Lemma 4.4.7, k-nice set).

    The form of Rand-k that belongs to B³(d/k), so that CGD with η = 1/L applies (Figs. 4.7, 4.8).
    """

    unbiased = False

    def __init__(self, k: int) -> None:
        super().__init__(k=k)
        self.name = f"rand_k_unscaled(k={k})"
        self.unbiased = False

    def omega(self, d: int) -> None:
        return None

    def delta(self, d: int) -> float:
        return d / self.k_of(d)

    def select(self, x: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        positions = torch.randperm(x.numel(), generator=generator)[: self.k_of(x.numel())].sort().values
        return positions, x[positions]


@dataclass(frozen=True)
class Quadratic:
    """``f_i(x) = xᵀA_i x − b_iᵀx + c_i`` for ``i < n``; ``A`` is ``(n, d, d)`` symmetric PSD, float64."""

    A: Tensor
    b: Tensor
    c: Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.float64))

    @property
    def num_workers(self) -> int:
        return int(self.A.shape[0])

    @property
    def dim(self) -> int:
        return int(self.A.shape[1])

    def gradients(self, x: Tensor) -> Tensor:
        """``(n, d)``: ``∇f_i(x) = 2A_i x − b_i``."""
        return 2.0 * torch.einsum("nij,j->ni", self.A, x) - self.b

    def value(self, x: Tensor) -> float:
        """``f(x) = (1/n) Σ_i f_i(x)``."""
        return float((torch.einsum("i,nij,j->n", x, self.A, x) - self.b @ x + self.c).mean())

    def smoothness(self) -> float:
        """``L`` of ``f``: ``2 λ_max(Ā)``."""
        return 2.0 * float(torch.linalg.eigvalsh(self.A.mean(0))[-1])

    def strong_convexity(self) -> float:
        """``μ`` of ``f``: ``2 λ_min(Ā)``."""
        return 2.0 * float(torch.linalg.eigvalsh(self.A.mean(0))[0])

    def minimiser(self) -> Tensor:
        """``x*`` solving ``2Āx = b̄``."""
        return torch.linalg.solve(2.0 * self.A.mean(0), self.b.mean(0))


def random_quadratic(*, dim: int, high: float, generator: torch.Generator) -> Quadratic:
    """Fig. 4.7's problem ``xᵀAx − yᵀx`` on one node.

    ``A = QᵀDQ`` with ``D_ii ~ U(1, high)`` and ``Q`` from the QR decomposition of a Gaussian
    matrix; ``y ~ U(0, 1)^d``.
    """
    diag = 1.0 + (high - 1.0) * torch.rand(dim, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    a = q.T @ torch.diag(diag) @ q
    y = torch.rand(dim, generator=generator, dtype=torch.float64)
    return Quadratic(A=((a + a.T) / 2).unsqueeze(0), b=y.unsqueeze(0))


def least_squares(features: Tensor, targets: Tensor) -> Quadratic:
    """``(1/2m)‖Xw − y‖² = wᵀ(XᵀX/2m)w − (Xᵀy/m)ᵀw + ‖y‖²/2m`` on one node (Fig. 4.8)."""
    x, y = features.double(), targets.double()
    m = len(y)
    return Quadratic(A=(x.T @ x / (2 * m)).unsqueeze(0), b=(x.T @ y / m).unsqueeze(0), c=(y @ y / (2 * m)).reshape(1))


def top1_counterexample() -> Quadratic:
    """Example 4.7.1: ``n = d = 3``, ``f_i(x) = ⟨a_i, x⟩² + ¼‖x‖²``, ``a_1 = (−3, 2, 2)`` and its cyclic shifts.

    From ``x⁰ = (t, t, t)``, DCGD with Top-1 gives ``x^k = (1 + 11η/6)^k x⁰`` although ``x* = 0``.
    """
    a = torch.tensor([[-3.0, 2.0, 2.0], [2.0, -3.0, 2.0], [2.0, 2.0, -3.0]], dtype=torch.float64)
    A = torch.einsum("ni,nj->nij", a, a) + 0.25 * torch.eye(3, dtype=torch.float64)
    return Quadratic(A=A, b=torch.zeros(3, 3, dtype=torch.float64))


@dataclass
class DCGDTrace:
    """One run of :func:`dcgd`: ``f(x^k) − f*`` for ``k = 0..steps``, the relative errors, the bits."""

    suboptimality: list[float]
    relative_errors: list[float]
    """``‖C(g) − g‖²/‖g‖²`` of each step's compressed vector(s), averaged over workers."""
    bits: int
    iterate: Tensor
    cumulative_bits: list[int] = field(default_factory=list)
    """Bits sent by all workers up to ``x^k`` for ``k = 0..`` (``cumulative_bits[0] = 0``)."""


def dcgd(
    problem: Quadratic,
    compressor: Compressor,
    *,
    steps: int,
    lr: float,
    x0: Tensor,
    error_feedback: bool = False,
    seed: int = 0,
) -> DCGDTrace:
    """Distributed compressed GD on ``problem`` (Algorithm 5; Algorithm 4/6 with ``error_feedback``).

    Every worker sends ``C(η∇f_i(x))`` (or ``C(e_i + η∇f_i(x))``); the master averages the
    decoded vectors and every node steps by that average. A non-finite iterate ends the run
    (the remaining suboptimalities are ``inf``).
    """
    n = problem.num_workers
    f_star = problem.value(problem.minimiser())
    x = x0.double().clone()
    memory = torch.zeros(n, problem.dim, dtype=torch.float64)
    generators = [torch.Generator().manual_seed(seed * 1000 + i) for i in range(n)]
    subopt = [problem.value(x) - f_star]
    errors: list[float] = []
    bits = 0
    cumulative = [0]
    for _ in range(steps):
        total = torch.zeros(problem.dim, dtype=torch.float64)
        err = 0.0
        for i, g in enumerate(problem.gradients(x)):
            v = memory[i] + lr * g if error_feedback else lr * g
            message = compressor.compress(v.float(), generators[i])
            bits += message.num_bits
            sent = message.decode().double()
            total += sent
            if error_feedback:
                memory[i] = v - sent
            norm = float(v @ v)
            err += float((sent - v) @ (sent - v)) / norm if norm > 0 else 0.0
        errors.append(err / n)
        cumulative.append(bits)
        x = x - total / n
        if not bool(torch.isfinite(x).all()):
            subopt.extend([math.inf] * (steps + 1 - len(subopt)))
            break
        subopt.append(problem.value(x) - f_star)
    return DCGDTrace(suboptimality=subopt, relative_errors=errors, bits=bits, iterate=x, cumulative_bits=cumulative)


def descent_step(compressor: Compressor, *, dim: int, smoothness: float) -> float:
    """The step ``η`` that makes ``x − ηC(∇f(x))`` decrease an ``L``-smooth ``f`` in expectation.

    From ``E f(x − ηC(g)) ≤ f(x) − η⟨g, E C(g)⟩ + (Lη²/2) E‖C(g)‖²`` (arXiv 2207.00392, ch. 4):

    * unbiased ``C`` with variance ω: ``E C(g) = g``, ``E‖C(g)‖² ≤ (1 + ω)‖g‖²``, so ``η = 1/(L(1 + ω))``;
    * Top-k followed by an unbiased ``U`` with ω_U(k): ``⟨g, Top-k(g)⟩ = ‖Top-k(g)‖²`` and
      ``E‖U(Top-k(g))‖² ≤ (1 + ω_U(k))‖Top-k(g)‖²``, so ``η = 1/(L(1 + ω_U(k)))``;
    * any other (biased, B³) operator: ``η = 1/L``, the step of Theorem 4.5.3.

    >>> from fedlightning.compression import RandK
    >>> descent_step(RandK(k=5), dim=100, smoothness=2.0)
    0.025
    """
    if compressor.unbiased:
        omega = compressor.omega(dim)
        if omega is None:
            raise ValueError(f"{compressor.name} is unbiased but declares no ω in dimension {dim}")
        return 1.0 / (smoothness * (1.0 + omega))
    if isinstance(compressor, TopKThen) and compressor.inner.unbiased:
        inner = compressor.inner.omega(compressor.top.k_of(dim))
        return 1.0 / (smoothness * (1.0 + (inner or 0.0)))
    return 1.0 / smoothness


def cgd_theory_curve(relative_errors: Sequence[float], *, mu: float, smoothness: float) -> list[float]:
    """``Π_{i≤k} (1 − μ/(L δ_i))`` for ``k = 0..len``, with ``1/δ_i = 1 − ε_i`` (Theorem 4.5.3, η = 1/L).

    >>> cgd_theory_curve([0.0, 0.5], mu=1.0, smoothness=4.0)
    [1.0, 0.75, 0.65625]
    """
    curve = [1.0]
    for eps in relative_errors:
        curve.append(curve[-1] * (1.0 - mu * (1.0 - min(max(eps, 0.0), 1.0)) / smoothness))
    return curve
