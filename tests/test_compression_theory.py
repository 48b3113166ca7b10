"""Compressed gradient descent on the thesis's small convex problems: Example 4.7.1 and Theorem 4.5.3's bound."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.compression import (
    DeterministicNatural,
    GradientSparsification,
    Identity,
    InducedCompressor,
    NaturalCompression,
    NaturalDithering,
    NURand1,
    RandK,
    TopK,
    TopKThen,
)
from fedlightning.compression.theory import (
    UnscaledRandK,
    cgd_theory_curve,
    dcgd,
    descent_step,
    least_squares,
    random_quadratic,
    top1_counterexample,
)


def test_example_4_7_1_gradients_are_the_hand_computed_ones() -> None:
    problem = top1_counterexample()
    g = problem.gradients(torch.ones(3, dtype=torch.float64))
    assert torch.equal(g, 0.5 * torch.tensor([[-11.0, 9, 9], [9, -11, 9], [9, 9, -11]], dtype=torch.float64))
    assert torch.equal(problem.minimiser(), torch.zeros(3, dtype=torch.float64))


def test_top_1_without_error_feedback_grows_by_exactly_1_plus_11_eta_over_6_per_step() -> None:
    lr, steps = 0.01, 20
    trace = dcgd(top1_counterexample(), TopK(k=1), steps=steps, lr=lr, x0=torch.ones(3, dtype=torch.float64))
    expected = (1 + 11 * lr / 6) ** steps
    # the operator sends float32 values: one rounding of η·g per step
    assert trace.iterate.tolist() == pytest.approx([expected] * 3, rel=1e-6)
    assert trace.suboptimality[-1] > trace.suboptimality[0] * expected**2 * 0.999  # f is quadratic in x
    assert trace.bits > 0


@pytest.mark.parametrize(
    ("name", "op", "ef"),
    [
        ("top_1_ef", TopK(k=1), True),
        ("nu_rand_1", NURand1(), False),
        ("rand_1", RandK(k=1), False),
        ("induced", InducedCompressor(TopK(k=1), GradientSparsification(k=1)), False),
    ],
)
def test_error_feedback_and_unbiased_operators_converge_on_example_4_7_1(name: str, op, ef: bool) -> None:  # type: ignore[no-untyped-def]
    # D = 0 here (every ∇f_i(x*) = 0) and the gradients are exact, so the unbiased DCGD and EF converge to x* = 0
    # (uncompressed GD at this step contracts f − f* by about 2ημ = 0.02 a step: 200 steps give about 0.02)
    trace = dcgd(
        top1_counterexample(), op, steps=200, lr=0.0087, x0=torch.ones(3, dtype=torch.float64), error_feedback=ef
    )
    assert trace.suboptimality[-1] < 0.05 * trace.suboptimality[0], name


def test_random_quadratic_has_its_spectrum_in_the_drawn_range() -> None:
    problem = random_quadratic(dim=50, high=100.0, generator=torch.Generator().manual_seed(0))
    eig = torch.linalg.eigvalsh(problem.A[0])
    assert float(eig[0]) >= 1.0 and float(eig[-1]) <= 100.0
    assert problem.smoothness() == pytest.approx(2 * float(eig[-1]))
    assert problem.strong_convexity() == pytest.approx(2 * float(eig[0]))
    x = problem.minimiser()
    assert float(problem.gradients(x).norm()) < 1e-10


def test_least_squares_value_is_half_the_mean_squared_residual() -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 4, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    problem = least_squares(x, y)
    w = torch.randn(4, generator=g, dtype=torch.float64)
    assert problem.value(w) == pytest.approx(float(((x @ w - y) ** 2).mean() / 2), rel=1e-12)


@pytest.mark.parametrize("op", [TopK(k=5), UnscaledRandK(5)], ids=["top_5", "rand_5_unscaled"])
def test_cgd_with_step_1_over_l_stays_below_the_adaptive_bound_of_theorem_4_5_3(op) -> None:  # type: ignore[no-untyped-def]
    problem = random_quadratic(dim=40, high=10.0, generator=torch.Generator().manual_seed(2))
    L, mu = problem.smoothness(), problem.strong_convexity()
    trace = dcgd(problem, op, steps=300, lr=1.0 / L, x0=torch.zeros(40, dtype=torch.float64))
    practice = [s / trace.suboptimality[0] for s in trace.suboptimality]
    theory = cgd_theory_curve(trace.relative_errors, mu=mu, smoothness=L)
    # f(x − C(g)/L) ≤ f(x) − ‖C(g)‖²/(2L) for a coordinate selection, and PL: each step contracts by 1 − μ(1 − ε)/L
    assert all(p <= t * (1 + 1e-6) + 1e-12 for p, t in zip(practice, theory, strict=True))
    assert practice[-1] < 0.5
    assert UnscaledRandK(5).delta(40) == 8.0 and not UnscaledRandK(5).unbiased


def test_unscaled_rand_k_keeps_k_coordinates_unchanged() -> None:
    x = torch.arange(1.0, 11.0)
    y = UnscaledRandK(3)(x, torch.Generator().manual_seed(0))
    kept = y != 0
    assert int(kept.sum()) == 3 and torch.equal(y[kept], x[kept])


def test_cgd_theory_curve_clips_the_relative_error_to_the_unit_interval() -> None:
    assert cgd_theory_curve([1.5, -0.5], mu=1.0, smoothness=2.0) == [1.0, 1.0, 0.5]


def test_descent_step_of_an_unbiased_operator_is_one_over_l_times_one_plus_omega() -> None:
    assert descent_step(RandK(k=5), dim=100, smoothness=2.0) == 1.0 / (2.0 * 20.0)  # ω = d/k − 1 = 19
    assert descent_step(NaturalCompression(), dim=7, smoothness=1.0) == 1.0 / 1.125  # ω = 1/8
    assert descent_step(Identity(), dim=7, smoothness=4.0) == 0.25


def test_descent_step_of_top_k_then_dithering_uses_the_inner_omega_at_k() -> None:
    # D_nat^{∞,2} on k = 5 coordinates: ω = 1/8 + √5·2^{−1}·min(1, √5·2^{−1}) = 1/8 + √5/2 (Theorem 2.5.2)
    op = TopKThen(NaturalDithering(p=math.inf, s=2), k=5)
    assert descent_step(op, dim=100, smoothness=1.0) == pytest.approx(1.0 / (1.0 + 0.125 + math.sqrt(5) / 2), rel=1e-12)


def test_descent_step_of_a_biased_contractive_operator_is_one_over_l() -> None:
    assert descent_step(TopK(k=5), dim=100, smoothness=4.0) == 0.25
    assert descent_step(DeterministicNatural(), dim=100, smoothness=4.0) == 0.25


def test_cumulative_bits_count_every_worker_message_of_every_step() -> None:
    # Identity sends 32 bits per coordinate: 3 workers × 3 coordinates × 32 = 288 bits a step
    trace = dcgd(top1_counterexample(), Identity(), steps=4, lr=0.01, x0=torch.ones(3, dtype=torch.float64))
    assert trace.cumulative_bits == [0, 288, 576, 864, 1152]
    assert trace.bits == 1152
