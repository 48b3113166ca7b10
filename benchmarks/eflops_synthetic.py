"""Synthetic sparse regression: E-FLoPS vs Fed-IHT vs FedAvg + pruning vs centralised references.

    python benchmarks/eflops_synthetic.py [--ratios 0.05 0.1 0.2 0.5 1 2] [--seeds 5]
        [--heterogeneity 0 0.5] [--snr 10] [--rounds 50] [--out benchmarks/results/eflops_synthetic.md]

d = 500 features (|θ| = 501), a k = 10-sparse truth, 5 clients (IID: h = 0; heterogeneous:
feature means μ_c ~ N(0, h² I)), ρ = 0.02 (m = 10), experiment ``sparse_regression_eflops``.
Tuning, the same protocol for every method: each grid point (the same SGD learning rates for
all; E-FLoPS also the λ step and T) runs at N/|θ| = 0.1, the first heterogeneity and SNR, on
seeds 100, 101; the best mean validation R² wins. The validation set is an independent draw
of the generator (``data.val_fraction`` of the test-set size), disjoint from the test set.
Per cell: test R², support precision |Ŝ ∩ S| / |Ŝ| and recall |Ŝ ∩ S| / k, achieved density,
uplink bits. Centralised references on the same training samples: the Lasso (penalty by
5-fold CV, its own density) and IHT at m. Writes a markdown table and a figure of recall
against N/|θ| (``<out>.png``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch
from eflops_common import REPO, federated_run, iht_reference, lasso_reference, score, split_tensors, tune

FEDERATED = ("eflops", "fediht", "fedavg_prune")
CENTRAL = ("lasso_cv", "central_iht")
SGD = "method.client_optimizer._target_=torch.optim.SGD"
LRS = (0.001, 0.003)
GRIDS: dict[str, list[list[str]]] = {
    "eflops": [
        [SGD, f"method.client_optimizer.lr={lr}", "method.lambda_lr=10", f"method.temperature={t}"]
        for lr in LRS
        for t in (0.001, 0.1)
    ],
    "fediht": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in LRS],
    "fedavg_prune": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in LRS],
}


def precision_recall(selected: set[int], truth: set[int]) -> tuple[float, float]:
    """(|Ŝ ∩ S| / |Ŝ|, |Ŝ ∩ S| / |S|); precision is 0 for an empty selection.

    >>> precision_recall({1, 2, 3, 4}, {2, 4, 9})
    (0.5, 0.6666666666666666)
    """
    hit = len(selected & truth)
    return (hit / len(selected) if selected else 0.0), hit / len(truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5, 1.0, 2.0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--heterogeneity", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--snr", type=float, nargs="+", default=[10.0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--tune-seeds", type=int, default=2)
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
    for method in FEDERATED:
        best, table = tune(GRIDS[method], base(method, 0.1, args.heterogeneity[0], args.snr[0]), tune_seeds, "val/r2")
        chosen[method] = best
        out.append(f"- {method}: " + "; ".join(f"`{' '.join(p[1:])}` {v:.3f}" for p, v in table))
        out.append(f"  chosen: `{' '.join(best)}`")
        print(out[-2], file=sys.stderr, flush=True)
    rows: list[dict] = []

    def write(text: str) -> None:
        Path(args.out).write_text(text)

    for snr in args.snr:
        for ratio in args.ratios:  # the data-poor cells first: an interrupted run still has them
            for h in args.heterogeneity:
                for seed in range(args.seeds):
                    data = split_tensors([*base("eflops", ratio, h, snr), f"seed={seed}"])
                    (x, y), (xt, yt), dm = data["train"], data["test"], data["datamodule"]
                    truth = {int(j) for j in dm.true_support}
                    m = int(0.02 * (x.shape[1] + 1))
                    for method in FEDERATED:
                        s = federated_run([*base(method, ratio, h, snr), *chosen[method], f"seed={seed}"])
                        p, r = precision_recall({int(f["index"]) for f in s["features"]}, truth)
                        rows.append(
                            dict(
                                snr=snr,
                                h=h,
                                ratio=ratio,
                                seed=seed,
                                method=method,
                                r2=float(s["test/r2"]),
                                precision=p,
                                recall=r,
                                density=float(s["model/density"]),
                                bits=float(s["comm/uplink_bits_total"]),
                            )
                        )
                    for method, coef in (
                        ("lasso_cv", lasso_reference("regression", x, y, seed)),
                        ("central_iht", iht_reference("regression", x, y, m)),
                    ):
                        p, r = precision_recall({int(j) for j in np.flatnonzero(coef[:-1])}, truth)
                        rows.append(
                            dict(
                                snr=snr,
                                h=h,
                                ratio=ratio,
                                seed=seed,
                                method=method,
                                r2=score("regression", coef, xt, yt),
                                precision=p,
                                recall=r,
                                density=float(np.count_nonzero(coef)) / coef.size,
                                bits=float("nan"),
                            )
                        )
                    print(
                        f"snr {snr} h {h} ratio {ratio} seed {seed}: "
                        + ", ".join(f"{r['method']} R2 {r['r2']:.2f} rec {r['recall']:.1f}" for r in rows[-5:]),
                        file=sys.stderr,
                        flush=True,
                    )
                write(render(out, rows, args, started))
    write(render(out, rows, args, started))


def mean_sd(values: list[float]) -> str:
    """``mean ± sd`` (sample sd; 0 for a single value)."""
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.3f} ± {sd:.3f}"


def render(out: list[str], rows: list[dict], args: argparse.Namespace, started: float) -> str:
    """The markdown report (and the figure) of the cells measured so far."""
    out = list(out)
    out += [
        "",
        f"## Results (mean ± sd over {args.seeds} seeds; {args.rounds} rounds)",
        "",
        "| SNR | h | N/\\|θ\\| | method | test R² | precision | recall | density | uplink bits / run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    methods = (*FEDERATED, *CENTRAL)
    for snr in args.snr:
        for h in sorted(args.heterogeneity):
            for ratio in sorted(args.ratios):
                for method in methods:
                    cell = [r for r in rows if (r["snr"], r["h"], r["ratio"], r["method"]) == (snr, h, ratio, method)]
                    if not cell:
                        continue
                    bits = "—" if method in CENTRAL else f"{np.mean([r['bits'] for r in cell]):.3g}"
                    dens = f"{np.mean([r['density'] for r in cell]):.4f}"
                    stats = " | ".join(mean_sd([r[k] for r in cell]) for k in ("r2", "precision", "recall"))
                    out.append(f"| {snr:g} | {h:g} | {ratio:g} | {method} | {stats} | {dens} | {bits} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(snr, h) for snr in args.snr for h in args.heterogeneity]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (snr, h) in zip(axes[0], panels, strict=True):
        for method in methods:
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
        + f" --rounds {args.rounds} --tune-seeds {args.tune_seeds}"
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
