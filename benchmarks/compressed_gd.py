"""Compressed gradient descent on the thesis's small convex problems (arXiv 2207.00392, Figs. 4.7, 4.8, 5.1).

Three workloads, each one command, one JSON line per run (plus a printed summary):

* ``counterexample`` (Fig. 5.1): Example 4.7.1 (``n = d = 3``), distributed CGD from
  ``x⁰ = (1, 1, 1)`` with Top-1 without error feedback, Top-1 + EF, NU Rand-1, Rand-1 and the
  induced compressor Top-1 + Rand-1 (Wangni), one common step size;
* ``quadratic`` (Fig. 4.7): single-node CGD with η = 1/L on ``xᵀAx − yᵀx``, ``d = 100``,
  ``A = QᵀDQ`` with ``D_ii ~ U(1, 10)``, ``U(1, 100)``, ``U(1, 1000)``; Top-5 vs Rand-5 in its
  biased (unscaled) form, with the adaptive bound of Theorem 4.5.3 measured along the run;
* ``regression`` (Fig. 4.8): the same on standardised least squares: scikit-learn's Diabetes
  (442 × 10) and, in place of Boston (not bundled with scikit-learn ≥ 1.2, no offline copy),
  Wine (178 × 13, the cultivar label as the target: the same 13 features' count as Boston).

    python benchmarks/compressed_gd.py counterexample --out outputs/cgd/counterexample.jsonl
    python benchmarks/compressed_gd.py quadratic --steps 3000 --out outputs/cgd/quadratic.jsonl
    python benchmarks/compressed_gd.py regression --steps 3000 --out outputs/cgd/regression.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import Tensor

from fedlightning.compression import GradientSparsification, InducedCompressor, NURand1, RandK, TopK
from fedlightning.compression.operators import Compressor
from fedlightning.compression.theory import (
    DCGDTrace,
    Quadratic,
    UnscaledRandK,
    cgd_theory_curve,
    dcgd,
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
    parser.add_argument("workload", choices=["counterexample", "quadratic", "regression"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.0, help="counterexample: <= 0 means Theorem 5.4.5's step")
    parser.add_argument("--highs", type=float, nargs="+", default=[10.0, 100.0, 1000.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/cgd/results.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    {"counterexample": run_counterexample, "quadratic": run_quadratic, "regression": run_regression}[args.workload](
        args
    )


if __name__ == "__main__":
    main()
