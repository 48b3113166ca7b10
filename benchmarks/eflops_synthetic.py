"""Synthetic sparse regression: E-FLoPS vs Fed-IHT vs FedAvg + pruning vs centralised references.

    python benchmarks/eflops_synthetic.py [--ratios 0.05 0.1 0.2 0.5 1 2] [--seeds 5]
        [--heterogeneity 0 0.5] [--snr 10 2] [--rounds 50] [--tune-seeds 2] [--lrs 0.001 0.003 0.01]
        [--lambda-steps 10 100 1000] [--temperatures 0.001 10] [--variants 'eflops, T = 0' ...]
        [--variant-ratios 0.1] [--jobs 2] [--out outputs/eflops/synthetic.md]

d = 500 features (|θ| = 501), a k = 10-sparse truth, 5 clients (IID: h = 0; heterogeneous:
feature means μ_c ~ N(0, h² I)), ρ = 0.02 (m = 10), experiment ``sparse_regression_eflops``.
Tuning, the same protocol for every method and in every cell (SNR, h, N/|θ|): each grid point
(the same SGD learning rates for all; E-FLoPS also the λ step and the temperature T) runs on
seeds 100, 101, ... of that cell, and the best mean validation R² wins. A point with a diverged
tuning run is ineligible, and so is an E-FLoPS point whose expected gate density D misses ρ by
more than 10% on a tuning seed; a cell and method with no eligible point is reported as such and
not evaluated. The validation set is an independent draw of the generator
(``data.val_fraction`` of the test-set size), disjoint from the test set.
Per cell: test R², support precision |Ŝ ∩ S| / |Ŝ| and recall |Ŝ ∩ S| / k, achieved density
(non-zeros of the evaluated model; for E-FLoPS also the expected density D of the server's
gates), uplink bits. Centralised references on the same training samples: the Lasso (penalty
by 5-fold CV, its own density) and IHT at m. E-FLoPS ablations (``--variants``) run in the
cells of ``--variant-ratios`` with the cell's tuned E-FLoPS settings and are compared with the
default on the same seeds. Federated runs go to ``--jobs`` worker processes (one torch thread
each) and are cached, so an interrupted invocation resumes. Writes a markdown report and a
figure of support recall and test R² against N/|θ| (``<out>.png``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch
from eflops_common import (
    REPO,
    NoEligibleSettingError,
    TuningPoint,
    compose_cfg,
    describe_point,
    federated_run,
    iht_reference,
    lasso_reference,
    merge_overrides,
    run_all,
    score,
    split_tensors,
    tune,
)

FEDERATED = ("eflops", "fediht", "fedavg_prune")
CENTRAL = ("lasso_cv", "central_iht")
SGD = "method.client_optimizer._target_=torch.optim.SGD"
VARIANTS: dict[str, list[str]] = {
    "eflops, T = 0": ["method.temperature=0"],
    "eflops, T = 10": ["method.temperature=10"],
    "eflops, regrow": ["method.off_support_gates=regrow"],
    "eflops, λ step 1000": ["method.lambda_lr=1000"],
}
"""E-FLoPS ablations (``--variants``), run with the tuned E-FLoPS settings plus these overrides."""


def grids(lrs: list[float], lambda_steps: list[float], temperatures: list[float]) -> dict[str, list[list[str]]]:
    """Each method's tuning grid: the same SGD learning rates for all; E-FLoPS also the λ step and T."""
    return {
        "eflops": [
            [SGD, f"method.client_optimizer.lr={lr}", f"method.lambda_lr={step:g}", f"method.temperature={t:g}"]
            for lr in lrs
            for step in lambda_steps
            for t in temperatures
        ],
        "fediht": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in lrs],
        "fedavg_prune": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in lrs],
    }


def precision_recall(selected: set[int], truth: set[int]) -> tuple[float, float]:
    """(|Ŝ ∩ S| / |Ŝ|, |Ŝ ∩ S| / |S|); precision is 0 for an empty selection.

    >>> precision_recall({1, 2, 3, 4}, {2, 4, 9})
    (0.5, 0.6666666666666666)
    """
    hit = len(selected & truth)
    return (hit / len(selected) if selected else 0.0), hit / len(truth)


Cell = tuple[float, float, float]
"""(SNR, h, N/|θ|)."""


def cell_row(
    cell: dict[str, float],
    method: str,
    selected: set[int],
    truth: set[int],
    *,
    r2: float,
    density: float,
    bits: float = float("nan"),
    expected_density: float = float("nan"),
) -> dict[str, float | str]:
    """One result row: the cell (SNR, h, N/|θ|, seed), the method and its scores."""
    p, r = precision_recall(selected, truth)
    return dict(
        cell,
        method=method,
        r2=r2,
        precision=p,
        recall=r,
        density=density,
        expected_density=expected_density,
        bits=bits,
        diverged=False,
    )


def diverged_row(cell: dict[str, float], method: str) -> dict[str, float | str]:
    """The row of a run the divergence guard stopped: every score NaN, flagged."""
    scores = ("r2", "precision", "recall", "density", "expected_density", "bits")
    return {**cell, "method": method, **dict.fromkeys(scores, float("nan")), "diverged": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5, 1.0, 2.0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--heterogeneity", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--snr", type=float, nargs="+", default=[10.0, 2.0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--tune-seeds", type=int, default=2)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.001, 0.003, 0.01])
    parser.add_argument("--lambda-steps", type=float, nargs="+", default=[10.0, 100.0, 1000.0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.001, 10.0])
    parser.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS))
    parser.add_argument("--variant-ratios", type=float, nargs="*", default=[0.1])
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for the federated runs")
    parser.add_argument("--out", default=str(REPO / "outputs" / "eflops" / "synthetic.md"))
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    started = time.time()

    def base(method: str, cell: Cell) -> list[str]:
        snr, h, ratio = cell
        return [
            "+experiment=sparse_regression_eflops",
            f"method={method}",
            f"rounds={args.rounds}",
            f"data.samples_per_parameter={ratio}",
            f"data.heterogeneity={h}",
            f"data.snr={snr}",
        ]

    cells: list[Cell] = [
        (snr, h, ratio) for snr in args.snr for h in args.heterogeneity for ratio in sorted(args.ratios)
    ]
    tune_seeds = [100 + i for i in range(args.tune_seeds)]
    grid = grids(args.lrs, args.lambda_steps, args.temperatures)
    rho = float(compose_cfg(base("eflops", cells[0])).method.density)

    # 1. Tuning: every grid point of every method in every cell, on the tuning seeds.
    run_all(
        [
            [*base(method, cell), *point, f"seed={s}"]
            for cell in cells
            for method in FEDERATED
            for point in grid[method]
            for s in tune_seeds
        ],
        args.jobs,
    )
    chosen: dict[tuple[Cell, str], list[str]] = {}
    tables: dict[tuple[Cell, str], list[TuningPoint] | str] = {}
    for cell in cells:
        for method in FEDERATED:
            try:
                best, table = tune(
                    grid[method], base(method, cell), tune_seeds, "val/r2", rho=rho if method == "eflops" else None
                )
            except NoEligibleSettingError as exc:
                tables[cell, method] = str(exc)
                continue
            chosen[cell, method] = best
            tables[cell, method] = table
    print(f"tuning done after {time.time() - started:.0f} s", file=sys.stderr, flush=True)

    # 2. Evaluation: seeds 0..S-1 with each cell's chosen settings, and the E-FLoPS variants.
    def evaluation(cell: Cell, seed: int) -> list[tuple[str, list[str]]]:
        runs = [
            (method, [*base(method, cell), *chosen[cell, method], f"seed={seed}"])
            for method in FEDERATED
            if (cell, method) in chosen
        ]
        if cell[2] in args.variant_ratios and (cell, "eflops") in chosen:
            runs += [
                (
                    label,
                    merge_overrides(base("eflops", cell), chosen[cell, "eflops"], VARIANTS[label], [f"seed={seed}"]),
                )
                for label in args.variants
            ]
        return runs

    run_all([o for cell in cells for seed in range(args.seeds) for _, o in evaluation(cell, seed)], args.jobs)
    rows: list[dict] = []
    for cell in cells:
        snr, h, ratio = cell
        for seed in range(args.seeds):
            key = dict(snr=snr, h=h, ratio=ratio, seed=seed)
            data = split_tensors([*base("eflops", cell), f"seed={seed}"])
            (x, y), (xt, yt), dm = data["train"], data["test"], data["datamodule"]
            truth = {int(j) for j in dm.true_support}
            m = int(rho * (x.shape[1] + 1))
            for label, overrides in evaluation(cell, seed):
                s = federated_run(overrides)
                if s.get("diverged"):
                    rows.append(diverged_row(key, label))
                    continue
                rows.append(
                    cell_row(
                        key,
                        label,
                        {int(f["index"]) for f in s["features"]},
                        truth,
                        r2=float(s["test/r2"]),
                        density=float(s["model/density"]),
                        bits=float(s["comm/uplink_bits_total"]),
                        expected_density=float(s.get("model/expected_density", float("nan"))),
                    )
                )
            for method, coef in (
                ("lasso_cv", lasso_reference("regression", x, y, seed)),
                ("central_iht", iht_reference("regression", x, y, m)),
            ):
                rows.append(
                    cell_row(
                        key,
                        method,
                        {int(j) for j in np.flatnonzero(coef[:-1])},
                        truth,
                        r2=score("regression", coef, xt, yt),
                        density=float(np.count_nonzero(coef)) / coef.size,
                    )
                )
        Path(args.out).write_text(render(tables, chosen, rows, args, started))
        print(f"cell SNR {snr:g}, h {h:g}, N/|θ| {ratio:g} written", file=sys.stderr, flush=True)


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` over the finite values (sample sd; 0 for a single value; ``—`` for none).

    >>> mean_sd([0.1, 0.3, float("nan")])
    '0.200 ± 0.141'
    """
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "—"
    sd = float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0
    return f"{np.mean(finite):.3f} ± {sd:.3f}"


def paired_difference(a: list[float], b: list[float]) -> str:
    """``mean difference a − b; paired t p`` over the same seeds (p is n/a when every difference is 0)."""
    from scipy import stats

    d = np.asarray(a) - np.asarray(b)
    p = f"{stats.ttest_rel(a, b).pvalue:.3g}" if len(d) > 1 and np.any(d != d[0]) else "n/a"
    return f"{d.mean():+.3f} (t p = {p})"


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this report."""

    def values(xs: list[float]) -> str:
        return " ".join(f"{x:g}" for x in xs)

    cmd = (
        f"python benchmarks/eflops_synthetic.py --ratios {values(args.ratios)} --seeds {args.seeds}"
        f" --heterogeneity {values(args.heterogeneity)} --snr {values(args.snr)} --rounds {args.rounds}"
        f" --tune-seeds {args.tune_seeds} --lrs {values(args.lrs)} --lambda-steps {values(args.lambda_steps)}"
        f" --temperatures {values(args.temperatures)}"
    )
    if args.variants:
        cmd += " --variants " + " ".join(f"'{v}'" for v in args.variants)
        cmd += f" --variant-ratios {values(args.variant_ratios)}"
    return cmd + f" --jobs {args.jobs}"


def short_override(item: str) -> str:
    """``key=value`` with only the last part of a dotted key.

    >>> short_override("method.client_optimizer.lr=0.01")
    'lr=0.01'
    """
    key, value = item.split("=", 1)
    return f"{key.split('.')[-1]}={value}"


def render(
    tables: dict[tuple[Cell, str], list[TuningPoint] | str],
    chosen: dict[tuple[Cell, str], list[str]],
    rows: list[dict],
    args: argparse.Namespace,
    started: float,
) -> str:
    """The markdown report (and the figure) of the cells measured so far."""
    cells = sorted({(r["snr"], r["h"], r["ratio"]) for r in rows}, key=lambda c: (-c[0], c[1], c[2]))
    methods = [*FEDERATED, *CENTRAL, *(v for v in VARIANTS if any(r["method"] == v for r in rows))]

    def select(cell: Cell, method: str) -> list[dict]:
        return [r for r in rows if (r["snr"], r["h"], r["ratio"], r["method"]) == (*cell, method)]

    def setting(cell: Cell, method: str) -> str:
        if (cell, method) not in chosen:
            return "no eligible point"
        table = tables[cell, method]
        point = next(p for p in table if p.overrides == chosen[cell, method]) if isinstance(table, list) else None
        text = " ".join(short_override(o) for o in chosen[cell, method][1:])
        return text + (f" (val R² {point.score:.3f})" if point else "")

    seeds = ", ".join(str(100 + i) for i in range(args.tune_seeds))
    out = [
        f"## Chosen settings (each cell tuned on its own validation seeds {seeds})",
        "",
        "| SNR | h | N/\\|θ\\| | " + " | ".join(FEDERATED) + " |",
        "|---|---|---|" + "---|" * len(FEDERATED),
    ]
    for cell in cells:
        out.append(
            f"| {cell[0]:g} | {cell[1]:g} | {cell[2]:g} | " + " | ".join(setting(cell, m) for m in FEDERATED) + " |"
        )
    out += [
        "",
        f"## Results (mean ± sd over {args.seeds} seeds; {args.rounds} rounds)",
        "",
        "Density: non-zeros of the evaluated model / |θ|; D: the expected density mean_j P(z_j ≠ 0) of the",
        "server's gates after the last round (E-FLoPS only); a run stopped by the divergence guard has no",
        "scores and is counted in the last column.",
        "",
        "| SNR | h | N/\\|θ\\| | method | test R² | precision | recall | density | D | uplink bits / run | diverged |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        for method in methods:
            runs = select(cell, method)
            if not runs:
                continue
            ok = [r for r in runs if not r["diverged"]]
            bits = "—" if method in CENTRAL or not ok else f"{np.mean([r['bits'] for r in ok]):.3g}"
            dens = f"{np.mean([r['density'] for r in ok]):.4f}" if ok else "—"
            dd = f"{np.mean([r['expected_density'] for r in ok]):.4f}" if method.startswith("eflops") and ok else "—"
            stats = " | ".join(mean_sd([r[k] for r in runs]) for k in ("r2", "precision", "recall"))
            out.append(
                f"| {cell[0]:g} | {cell[1]:g} | {cell[2]:g} | {method} | {stats} | {dens} | {dd} | {bits} | "
                f"{len(runs) - len(ok)} |"
            )
    ef = [r for r in rows if str(r["method"]).startswith("eflops") and not r["diverged"]]
    if ef:
        rho = 0.02
        for key, label in (("density", "non-zero density"), ("expected_density", "expected density D")):
            v = [float(r[key]) for r in ef]
            bad = sum(abs(x - rho) > 0.1 * rho for x in v)
            out.append(
                f"\nE-FLoPS {label} over all {len(v)} runs: min {min(v):.4f}, max {max(v):.4f}; "
                f"{bad} run(s) outside ρ ± 10% = [{0.9 * rho:.3f}, {1.1 * rho:.3f}]."
            )
    out += [
        "",
        "## The claim, seed by seed: E-FLoPS' support recall against each baseline",
        "",
        "Per cell: the mean paired difference of recall (E-FLoPS − baseline) and the seeds where",
        "E-FLoPS' recall is at least the baseline's (seeds where either run diverged are left out).",
        "",
        "| SNR | h | N/\\|θ\\| | Δ recall vs fediht | ≥ fediht | Δ recall vs fedavg_prune | ≥ fedavg_prune |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        ours = {r["seed"]: r for r in select(cell, "eflops") if not r["diverged"]}
        parts = []
        for baseline in ("fediht", "fedavg_prune"):
            pairs = [(ours[r["seed"]]["recall"], r["recall"]) for r in select(cell, baseline) if r["seed"] in ours]
            pairs = [(a, b) for a, b in pairs if np.isfinite(b)]
            if not pairs:
                parts += ["—", "—"]
                continue
            a, b = [x for x, _ in pairs], [y for _, y in pairs]
            parts += [paired_difference(a, b), f"{sum(x >= y for x, y in pairs)} of {len(pairs)}"]
        out.append(f"| {cell[0]:g} | {cell[1]:g} | {cell[2]:g} | " + " | ".join(parts) + " |")
    variants = [v for v in VARIANTS if any(r["method"] == v for r in rows)]
    if variants:
        out += [
            "",
            "## E-FLoPS ablations (each against the tuned default on the same cells and seeds)",
            "",
            "| SNR | h | N/\\|θ\\| | variant | recall | Δ recall vs default | R² | Δ R² vs default |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for cell in cells:
            ref = sorted(select(cell, "eflops"), key=lambda r: r["seed"])
            for variant in variants:
                runs = sorted(select(cell, variant), key=lambda r: r["seed"])
                if not runs or len(runs) != len(ref) or any(r["diverged"] for r in [*runs, *ref]):
                    continue
                rec, r2 = [r["recall"] for r in runs], [r["r2"] for r in runs]
                out.append(
                    f"| {cell[0]:g} | {cell[1]:g} | {cell[2]:g} | {variant} | {mean_sd(rec)} | "
                    f"{paired_difference(rec, [r['recall'] for r in ref])} | {mean_sd(r2)} | "
                    f"{paired_difference(r2, [r['r2'] for r in ref])} |"
                )
    out += ["", "## Every tuning grid point (mean validation R² over the tuning seeds)", ""]
    for cell in cells:
        for method in FEDERATED:
            table = tables.get((cell, method))
            detail = table if isinstance(table, str) else "; ".join(describe_point(p) for p in table or [])
            out.append(f"- SNR {cell[0]:g}, h {cell[1]:g}, N/|θ| {cell[2]:g}, {method}: {detail}")
    figure = draw(rows, methods, args)
    head = [
        "# Synthetic sparse regression (d = 500, |θ| = 501, k = 10, 5 clients, ρ = 0.02, m = 10)",
        "",
        f"Command: `{command_line(args)}`; {time.strftime('%Y-%m-%d', time.gmtime())}; wall time "
        f"{time.time() - started:.0f} s (runs read from the benchmark cache are not timed again). "
        f"Figure: `{figure.name}`.",
        "",
    ]
    return "\n".join(head + out) + "\n"


def draw(rows: list[dict], methods: list[str], args: argparse.Namespace) -> Path:
    """Support recall (top) and test R² (bottom) against N/|θ|, one column per (SNR, h); ``<out>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(snr, h) for snr in args.snr for h in args.heterogeneity]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.4), squeeze=False)
    for col, (snr, h) in enumerate(panels):
        for method in methods:
            if method in VARIANTS:
                continue
            for row, key in enumerate(("recall", "r2")):
                ratios, means = [], []
                for q in sorted(args.ratios):
                    vals = [
                        r[key]
                        for r in rows
                        if (r["snr"], r["h"], r["ratio"], r["method"]) == (snr, h, q, method) and not r["diverged"]
                    ]
                    if vals:
                        ratios.append(q)
                        means.append(float(np.mean(vals)))
                axes[row][col].plot(ratios, means, marker="o", label=method)
        for row, label in enumerate(("support recall", "test R²")):
            axes[row][col].set_xscale("log")
            axes[row][col].set_xlabel("N / |θ|")
            axes[row][col].set_ylabel(label)
            axes[row][col].set_title(f"SNR {snr:g}, h = {h:g}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    figure = Path(args.out).with_suffix(".png")
    fig.savefig(figure, dpi=110)
    plt.close(fig)
    return figure


if __name__ == "__main__":
    main()
