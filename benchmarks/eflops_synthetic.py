"""Synthetic sparse regression: E-FLoPS vs Fed-IHT vs FedAvg + pruning vs centralised references.

    python benchmarks/eflops_synthetic.py [--ratios 0.05 0.1 0.2 0.5 1 2] [--seeds 5]
        [--heterogeneity 0 0.5] [--snr 10 2] [--rounds 50] [--lrs 0.001 0.003 0.01]
        [--lambda-steps 10 100 1000] [--variants 'eflops, T = 0' ...] [--variant-ratios 0.1]
        [--out benchmarks/results/eflops_synthetic.md]

d = 500 features (|θ| = 501), a k = 10-sparse truth, 5 clients (IID: h = 0; heterogeneous:
feature means μ_c ~ N(0, h² I)), ρ = 0.02 (m = 10), experiment ``sparse_regression_eflops``.
Tuning, the same protocol for every method: each grid point (the same SGD learning rates for
all; E-FLoPS also the λ step) runs at N/|θ| = 0.1, the first heterogeneity and SNR, on seeds
100, 101, ...; the best mean validation R² wins. An E-FLoPS point whose expected gate density D
misses ρ by more than 10% on a tuning seed is ineligible (listed with its D); if none is
eligible the script writes the tuning table and stops. The validation set is an independent draw of
the generator (``data.val_fraction`` of the test-set size), disjoint from the test set.
Per cell: test R², support precision |Ŝ ∩ S| / |Ŝ| and recall |Ŝ ∩ S| / k, achieved density
(non-zeros of the evaluated model; for E-FLoPS also the expected density D of the server's
gates), uplink bits. Centralised references on the same training samples: the Lasso (penalty
by 5-fold CV, its own density) and IHT at m. E-FLoPS ablations (``--variants``) run in the
cells of ``--variant-ratios`` and are compared with the default on the same seeds. Writes a
markdown table and a figure of recall against N/|θ| (``<out>.png``).
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
    compose_cfg,
    describe_point,
    federated_run,
    iht_reference,
    lasso_reference,
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


def grids(lrs: list[float], lambda_steps: list[float]) -> dict[str, list[list[str]]]:
    """Each method's tuning grid: the same SGD learning rates for all; E-FLoPS also the λ step (T = 0.001)."""
    return {
        "eflops": [
            [SGD, f"method.client_optimizer.lr={lr}", f"method.lambda_lr={step:g}", "method.temperature=0.001"]
            for lr in lrs
            for step in lambda_steps
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
    )


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
    parser.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS))
    parser.add_argument("--variant-ratios", type=float, nargs="*", default=[0.1])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "eflops_synthetic.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    started = time.time()

    def base(method: str, ratio: float, h: float, snr: float) -> list[str]:
        return [
            "+experiment=sparse_regression_eflops",
            f"method={method}",
            f"rounds={args.rounds}",
            f"data.samples_per_parameter={ratio}",
            f"data.heterogeneity={h}",
            f"data.snr={snr}",
        ]

    out = [f"## Tuning (N/|θ| = 0.1, h = {args.heterogeneity[0]:g}, SNR {args.snr[0]:g}; validation R²)", ""]
    chosen: dict[str, list[str]] = {}
    tune_seeds = [100 + i for i in range(args.tune_seeds)]
    grid = grids(args.lrs, args.lambda_steps)
    rows: list[dict] = []

    def write(text: str) -> None:
        Path(args.out).write_text(text)

    for method in FEDERATED:
        tuning_base = base(method, 0.1, args.heterogeneity[0], args.snr[0])
        rho = float(compose_cfg(tuning_base).method.density) if method == "eflops" else None
        try:
            best, table = tune(grid[method], tuning_base, tune_seeds, "val/r2", rho=rho)
        except NoEligibleSettingError as exc:
            out.append(f"- {method}: stopped: {exc}")
            write(render(out, rows, args, started))
            raise SystemExit(f"eflops_synthetic: {exc}") from None
        chosen[method] = best
        out.append(f"- {method}: " + "; ".join(describe_point(p) for p in table))
        out.append(f"  chosen: `{' '.join(best)}`")
        print(out[-2], file=sys.stderr, flush=True)

    for snr in args.snr:
        for ratio in args.ratios:  # the data-poor cells first: an interrupted run still has them
            for h in args.heterogeneity:
                for seed in range(args.seeds):
                    cell = dict(snr=snr, h=h, ratio=ratio, seed=seed)
                    data = split_tensors([*base("eflops", ratio, h, snr), f"seed={seed}"])
                    (x, y), (xt, yt), dm = data["train"], data["test"], data["datamodule"]
                    truth = {int(j) for j in dm.true_support}
                    m = int(0.02 * (x.shape[1] + 1))
                    runs: list[tuple[str, str, list[str]]] = [(method, method, []) for method in FEDERATED]
                    if ratio in args.variant_ratios:
                        runs += [(label, "eflops", VARIANTS[label]) for label in args.variants]
                    for label, method, extra in runs:
                        s = federated_run([*base(method, ratio, h, snr), *chosen[method], *extra, f"seed={seed}"])
                        rows.append(
                            cell_row(
                                cell,
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
                                cell,
                                method,
                                {int(j) for j in np.flatnonzero(coef[:-1])},
                                truth,
                                r2=score("regression", coef, xt, yt),
                                density=float(np.count_nonzero(coef)) / coef.size,
                            )
                        )
                    done = [r for r in rows if all(r[k] == v for k, v in cell.items())]
                    print(
                        f"snr {snr} h {h} ratio {ratio} seed {seed}: "
                        + ", ".join(f"{r['method']} R2 {r['r2']:.2f} rec {r['recall']:.1f}" for r in done),
                        file=sys.stderr,
                        flush=True,
                    )
                write(render(out, rows, args, started))
    write(render(out, rows, args, started))


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` (sample sd; 0 for a single value)."""
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.3f} ± {sd:.3f}"


def paired_difference(a: list[float], b: list[float]) -> str:
    """``mean difference a − b; paired t p`` over the same seeds (p is n/a when every difference is 0)."""
    from scipy import stats

    d = np.asarray(a) - np.asarray(b)
    p = f"{stats.ttest_rel(a, b).pvalue:.3g}" if len(d) > 1 and np.any(d != d[0]) else "n/a"
    return f"{d.mean():+.3f} (t p = {p})"


def render(out: list[str], rows: list[dict], args: argparse.Namespace, started: float) -> str:
    """The markdown report (and the figure) of the cells measured so far."""
    out = list(out)
    out += [
        "",
        f"## Results (mean ± sd over {args.seeds} seeds; {args.rounds} rounds)",
        "",
        "Density: non-zeros of the evaluated model / |θ|; D: the expected density mean_j P(z_j ≠ 0) of the",
        "server's gates after the last round (E-FLoPS only).",
        "",
        "| SNR | h | N/\\|θ\\| | method | test R² | precision | recall | density | D | uplink bits / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    methods = [*FEDERATED, *CENTRAL, *(v for v in VARIANTS if any(r["method"] == v for r in rows))]

    def select(snr: float, h: float, ratio: float, method: str) -> list[dict]:
        return [r for r in rows if (r["snr"], r["h"], r["ratio"], r["method"]) == (snr, h, ratio, method)]

    for snr in args.snr:
        for h in sorted(args.heterogeneity):
            for ratio in sorted(args.ratios):
                for method in methods:
                    cell = select(snr, h, ratio, method)
                    if not cell:
                        continue
                    bits = "—" if method in CENTRAL else f"{np.mean([r['bits'] for r in cell]):.3g}"
                    dens = f"{np.mean([r['density'] for r in cell]):.4f}"
                    d = [r["expected_density"] for r in cell]
                    dd = f"{np.mean(d):.4f}" if method.startswith("eflops") else "—"
                    stats = " | ".join(mean_sd([r[k] for r in cell]) for k in ("r2", "precision", "recall"))
                    out.append(f"| {snr:g} | {h:g} | {ratio:g} | {method} | {stats} | {dens} | {dd} | {bits} |")
    ef = [r for r in rows if str(r["method"]).startswith("eflops")]
    if ef:
        rho = 0.02
        for key, label in (("density", "non-zero density"), ("expected_density", "expected density D")):
            v = [float(r[key]) for r in ef]
            bad = sum(abs(x - rho) > 0.1 * rho for x in v)
            out.append(
                f"\nE-FLoPS {label} over all {len(v)} runs: min {min(v):.4f}, max {max(v):.4f}; "
                f"{bad} run(s) outside ρ ± 10% = [{0.9 * rho:.3f}, {1.1 * rho:.3f}]."
            )
    variants = [v for v in VARIANTS if any(r["method"] == v for r in rows)]
    if variants:
        out += [
            "",
            "## E-FLoPS ablations (each against the tuned default on the same cells and seeds)",
            "",
            "| SNR | h | N/\\|θ\\| | variant | recall | Δ recall vs default | R² | Δ R² vs default |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for snr in args.snr:
            for h in sorted(args.heterogeneity):
                for ratio in sorted(args.ratios):
                    ref = sorted(select(snr, h, ratio, "eflops"), key=lambda r: r["seed"])
                    for variant in variants:
                        cell = sorted(select(snr, h, ratio, variant), key=lambda r: r["seed"])
                        if not cell or len(cell) != len(ref):
                            continue
                        rec, r2 = [r["recall"] for r in cell], [r["r2"] for r in cell]
                        out.append(
                            f"| {snr:g} | {h:g} | {ratio:g} | {variant} | {mean_sd(rec)} | "
                            f"{paired_difference(rec, [r['recall'] for r in ref])} | {mean_sd(r2)} | "
                            f"{paired_difference(r2, [r['r2'] for r in ref])} |"
                        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(snr, h) for snr in args.snr for h in args.heterogeneity]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (snr, h) in zip(axes[0], panels, strict=True):
        for method in methods:
            if method in VARIANTS:
                continue
            done = [
                q
                for q in args.ratios
                if any((r["snr"], r["h"], r["ratio"], r["method"]) == (snr, h, q, method) for r in rows)
            ]
            mean = [
                np.mean(
                    [r["recall"] for r in rows if (r["snr"], r["h"], r["ratio"], r["method"]) == (snr, h, q, method)]
                )
                for q in done
            ]
            ax.plot(done, mean, marker="o", label=method)
        ax.set_xscale("log")
        ax.set_xlabel("N / |θ|")
        ax.set_ylabel("support recall")
        ax.set_title(f"SNR {snr:g}, h = {h:g}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    figure = Path(args.out).with_suffix(".png")
    fig.savefig(figure, dpi=120)
    plt.close(fig)
    cmd = (
        "python benchmarks/eflops_synthetic.py --ratios "
        + " ".join(f"{r:g}" for r in args.ratios)
        + f" --seeds {args.seeds} --heterogeneity "
        + " ".join(f"{h:g}" for h in args.heterogeneity)
        + " --snr "
        + " ".join(f"{s:g}" for s in args.snr)
        + f" --rounds {args.rounds} --tune-seeds {args.tune_seeds} --lrs "
        + " ".join(f"{x:g}" for x in args.lrs)
        + " --lambda-steps "
        + " ".join(f"{x:g}" for x in args.lambda_steps)
        + (" --variants " + " ".join(f"'{v}'" for v in args.variants) if args.variants else "")
        + (" --variant-ratios " + " ".join(f"{x:g}" for x in args.variant_ratios) if args.variants else "")
    )
    head = [
        "# Synthetic sparse regression (d = 500, |θ| = 501, k = 10, 5 clients, ρ = 0.02, m = 10)",
        "",
        f"Command: `{cmd}`; {time.strftime('%Y-%m-%d', time.gmtime())}; wall time {time.time() - started:.0f} s on a "
        f"shared 2-core CPU (times inflated by other jobs). Figure: `{figure.name}`.",
        "",
    ]
    return "\n".join(head + out) + "\n"


if __name__ == "__main__":
    main()
