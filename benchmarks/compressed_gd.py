"""Compressed gradient descent on the thesis's small convex problems (arXiv 2207.00392, Figs. 4.5–4.8, 5.1).

Five workloads, each one command, one JSON line per run (plus a printed summary):

* ``counterexample`` (Fig. 5.1): Example 4.7.1 (``n = d = 3``), distributed CGD from
  ``x⁰ = (1, 1, 1)`` with Top-1 without error feedback, Top-1 + EF, NU Rand-1, Rand-1 and the
  induced compressor Top-1 + Rand-1 (Wangni), one common step size;
* ``quadratic`` (Fig. 4.7): single-node CGD with η = 1/L on ``xᵀAx − yᵀx``, ``d = 100``,
  ``A = QᵀDQ`` with ``D_ii ~ U(1, 10)``, ``U(1, 100)``, ``U(1, 1000)``; Top-5 vs Rand-5 in its
  biased (unscaled) form, with the adaptive bound of Theorem 4.5.3 measured along the run;
* ``regression`` (Fig. 4.8): the same on standardised least squares: scikit-learn's Diabetes
  (442 × 10) and, in place of Boston (not bundled with scikit-learn ≥ 1.2, no offline copy),
  Wine (178 × 13, the cultivar label as the target: the same 13 features' count as Boston).
* ``sparse_dithering`` (Fig. 4.5's comparison on these problems): no compression, Top-5, Rand-5
  (unbiased), natural dithering D_nat^{∞,2} and Top-5 followed by D_nat^{∞,2}, once at one common
  step (the smallest of their :func:`descent_step` values, as the thesis runs one step for all)
  and once each at its own step; suboptimality against bits;
* ``variance`` (Fig. 4.6's comparison): the empirical ``‖C(g) − g‖²/‖g‖²`` along each
  operator's own run (at its :func:`descent_step`) for the two pairs of equal communication,
  C_nat unbiased vs rounded to the nearest power of two, and Rand-(d/5) vs Top-(d/5).

    python benchmarks/compressed_gd.py counterexample --out outputs/cgd/counterexample.jsonl
    python benchmarks/compressed_gd.py quadratic --steps 3000 --out outputs/cgd/quadratic.jsonl
    python benchmarks/compressed_gd.py regression --steps 3000 --out outputs/cgd/regression.jsonl
    python benchmarks/compressed_gd.py sparse_dithering --steps 3000 --out outputs/cgd/fig45.jsonl
    python benchmarks/compressed_gd.py variance --steps 3000 --out outputs/cgd/fig46.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch import Tensor

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
from fedlightning.compression.operators import Compressor
from fedlightning.compression.theory import (
    DCGDTrace,
    Quadratic,
    UnscaledRandK,
    cgd_theory_curve,
    dcgd,
    descent_step,
    least_squares,
    random_quadratic,
    top1_counterexample,
)


def relative(trace: DCGDTrace) -> list[float]:
    """``(f(x^k) − f*)/(f(x⁰) − f*)``."""
    first = trace.suboptimality[0]
    return [s / first for s in trace.suboptimality]


def first_below(curve: list[float], level: float) -> int | None:
    """The first ``k`` with ``curve[k] ≤ level`` (``None``: never)."""
    return next((k for k, v in enumerate(curve) if v <= level), None)


def emit(out: Path, fields: dict[str, object]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(fields) + "\n")


def checkpoints(steps: int) -> list[int]:
    marks = sorted({0, *(int(steps * f) for f in (0.1, 0.25, 0.5, 0.75)), steps})
    return [k for k in marks if k <= steps]


def theory_vs_practice(name: str, problem: Quadratic, ops: dict[str, Compressor], steps: int, out: Path) -> None:
    """Single-node CGD with η = 1/L for each operator, against Theorem 4.5.3's adaptive bound."""
    L, mu = problem.smoothness(), problem.strong_convexity()
    x0 = torch.zeros(problem.dim, dtype=torch.float64)
    for op_name, op in ops.items():
        trace = dcgd(problem, op, steps=steps, lr=1.0 / L, x0=x0)
        practice = relative(trace)
        theory = cgd_theory_curve(trace.relative_errors, mu=mu, smoothness=L)
        fields = {
            "problem": name,
            "op": op_name,
            "dim": problem.dim,
            "L": L,
            "mu": mu,
            "kappa": L / mu,
            "steps": steps,
            "mean_relative_error": sum(trace.relative_errors) / len(trace.relative_errors),
            "practice": {str(k): practice[k] for k in checkpoints(steps)},
            "theory": {str(k): theory[k] for k in checkpoints(steps)},
            "practice_1e-6_at": first_below(practice, 1e-6),
            "theory_1e-6_at": first_below(theory, 1e-6),
            "bits": trace.bits,
        }
        emit(out, fields)
        print(json.dumps(fields), flush=True)


def run_quadratic(args: argparse.Namespace) -> None:
    for high in args.highs:
        problem = random_quadratic(dim=100, high=high, generator=torch.Generator().manual_seed(args.seed))
        ops: dict[str, Compressor] = {"top_5": TopK(k=5), "rand_5": UnscaledRandK(5)}
        theory_vs_practice(f"quadratic_U(1,{high:g})", problem, ops, args.steps, args.out)


def standardised(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    x = (x - x.mean(0)) / x.std(0)
    return x, (y - y.mean()) / y.std()


def run_regression(args: argparse.Namespace) -> None:
    from sklearn.datasets import load_diabetes, load_wine

    for name, loader in (("diabetes", load_diabetes), ("wine_in_place_of_boston", load_wine)):
        xs, ys = loader(return_X_y=True)
        x, y = standardised(torch.from_numpy(xs).double(), torch.from_numpy(ys).double())
        ops: dict[str, Compressor] = {"top_5": TopK(k=5), "rand_5": UnscaledRandK(5)}
        theory_vs_practice(name, least_squares(x, y), ops, args.steps, args.out)


def small_problems(seed: int) -> dict[str, Quadratic]:
    """The quadratics U(1, 10) and U(1, 100) of Fig. 4.7 and the two regressions of Fig. 4.8."""
    from sklearn.datasets import load_diabetes, load_wine

    problems = {
        f"quadratic_U(1,{high:g})": random_quadratic(dim=100, high=high, generator=torch.Generator().manual_seed(seed))
        for high in (10.0, 100.0)
    }
    for name, loader in (("diabetes", load_diabetes), ("wine_in_place_of_boston", load_wine)):
        xs, ys = loader(return_X_y=True)
        problems[name] = least_squares(*standardised(torch.from_numpy(xs).double(), torch.from_numpy(ys).double()))
    return problems


def bits_to_reach(trace: DCGDTrace, level: float) -> int | None:
    """Bits sent until the relative suboptimality first falls to ``level`` (``None``: never)."""
    k = first_below(relative(trace), level)
    return None if k is None else trace.cumulative_bits[k]


def run_sparse_dithering(args: argparse.Namespace) -> None:
    for name, problem in small_problems(args.seed).items():
        L, d = problem.smoothness(), problem.dim
        ops: dict[str, Compressor] = {
            "none": Identity(),
            "top_5": TopK(k=5),
            "rand_5": RandK(k=5),
            "natural_dithering_inf_2": NaturalDithering(p=math.inf, s=2),
            "top_5_natural_dithering_inf_2": TopKThen(NaturalDithering(p=math.inf, s=2), k=5),
        }
        own = {op_name: descent_step(op, dim=d, smoothness=L) for op_name, op in ops.items()}
        common = min(own.values())
        x0 = torch.zeros(d, dtype=torch.float64)
        for rule in ("common", "own"):
            for op_name, op in ops.items():
                lr = common if rule == "common" else own[op_name]
                trace = dcgd(problem, op, steps=args.steps, lr=lr, x0=x0, seed=args.seed)
                curve = relative(trace)
                fields = {
                    "problem": name,
                    "op": op_name,
                    "step_rule": rule,
                    "lr_times_L": lr * L,
                    "dim": d,
                    "kappa": L / problem.strong_convexity(),
                    "steps": args.steps,
                    "relative_suboptimality": {str(k): curve[k] for k in checkpoints(args.steps)},
                    "bits_per_step": trace.bits / args.steps,
                    "first_k_1e-3": first_below(curve, 1e-3),
                    "bits_to_1e-3": bits_to_reach(trace, 1e-3),
                    "first_k_1e-6": first_below(curve, 1e-6),
                    "bits_to_1e-6": bits_to_reach(trace, 1e-6),
                }
                emit(args.out, fields)
                print(json.dumps(fields), flush=True)


def run_variance(args: argparse.Namespace) -> None:
    for name, problem in small_problems(args.seed).items():
        L, d = problem.smoothness(), problem.dim
        k = TopK(fraction=0.2).k_of(d)
        ops: dict[str, Compressor] = {
            "natural": NaturalCompression(),
            "natural_deterministic": DeterministicNatural(),
            "rand_d/5": RandK(k=k),
            "rand_d/5_unscaled": UnscaledRandK(k),
            "top_d/5": TopK(k=k),
        }
        x0 = torch.zeros(d, dtype=torch.float64)
        for op_name, op in ops.items():
            lr = descent_step(op, dim=d, smoothness=L)
            trace = dcgd(problem, op, steps=args.steps, lr=lr, x0=x0, seed=args.seed)
            # stop at the float64 floor: past it the gradients are rounding noise
            live = [e for e, s in zip(trace.relative_errors, trace.suboptimality, strict=False) if s > 1e-12]
            omega = op.omega(d)
            fields = {
                "problem": name,
                "op": op_name,
                "dim": d,
                "k": k,
                "lr_times_L": lr * L,
                "steps": args.steps,
                "steps_measured": len(live),
                "mean_relative_error": sum(live) / len(live),
                "min_relative_error": min(live),
                "max_relative_error": max(live),
                "bound": omega if omega is not None else 1.0 - 1.0 / op.delta(d),
                "bound_kind": "omega" if omega is not None else "1 - 1/delta",
                "bits_per_step": trace.bits / args.steps,
                "final_relative_suboptimality": relative(trace)[-1],
            }
            emit(args.out, fields)
            print(json.dumps(fields), flush=True)


def run_counterexample(args: argparse.Namespace) -> None:
    problem = top1_counterexample()
    lr = args.lr
    if lr <= 0:  # Theorem 5.4.5's η = 1/(2 δ_n L) for the unbiased one-coordinate operators (ω = d − 1 = 2)
        L_max = 2.0 * max(float(torch.linalg.eigvalsh(a)[-1]) for a in problem.A)
        lr = 1.0 / (2.0 * (2.0 / problem.num_workers + 1.0) * L_max)
    x0 = torch.ones(3, dtype=torch.float64)
    runs: dict[str, tuple[Compressor, bool]] = {
        "top_1": (TopK(k=1), False),
        "top_1_ef": (TopK(k=1), True),
        "nu_rand_1": (NURand1(), False),
        "rand_1": (RandK(k=1), False),
        "induced_top1_wangni1": (InducedCompressor(TopK(k=1), GradientSparsification(k=1)), False),
    }
    for name, (op, ef) in runs.items():
        trace = dcgd(problem, op, steps=args.steps, lr=lr, x0=x0, error_feedback=ef, seed=args.seed)
        marks = checkpoints(args.steps)
        fields = {
            "problem": "example_4_7_1",
            "op": name,
            "error_feedback": ef,
            "lr": lr,
            "steps": args.steps,
            "suboptimality": {str(k): trace.suboptimality[k] for k in marks},
            "iterate": trace.iterate.tolist(),
            "bits": trace.bits,
            "predicted_top_1_growth": (1 + 11 * lr / 6) ** args.steps if name == "top_1" else None,
        }
        emit(args.out, fields)
        print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "workload", choices=["counterexample", "quadratic", "regression", "sparse_dithering", "variance"]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.0, help="counterexample: <= 0 means Theorem 5.4.5's step")
    parser.add_argument("--highs", type=float, nargs="+", default=[10.0, 100.0, 1000.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/cgd/results.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    runners = {
        "counterexample": run_counterexample,
        "quadratic": run_quadratic,
        "regression": run_regression,
        "sparse_dithering": run_sparse_dithering,
        "variance": run_variance,
    }
    runners[args.workload](args)


if __name__ == "__main__":
    main()
