"""Golub leukemia: E-FLoPS vs Fed-IHT vs FedAvg + pruning vs centralised references, one command.

    python benchmarks/golub_comparison.py [--seeds 30] [--ablation-seeds 10] [--tune-seeds 2]
        [--data-root ../shared/data] [--out outputs/eflops/golub.md]

1. Tuning, the same protocol for every method: each point of the method's grid (the same SGD
   learning rates for all; E-FLoPS also the λ step and T) runs on the tuning seeds (100, 101, ...)
   with 20% of the training split held out for validation; the best mean validation accuracy
   wins among the eligible points (E-FLoPS: expected gate density D within 10% of ρ on every
   tuning seed; the script stops if none is). The test sets are not read.
2. Evaluation: seeds 0..S−1, each a fresh stratified 70/30 split (50 train / 22 test), 5 IID
   clients, the one-output logistic model (|θ| = 3,572), ρ = 0.02 (m = 71), the chosen settings.
   The centralised references see the same 50 training samples: L1-logistic regression (penalty
   by 5-fold CV on the training split, its own density) and IHT at m.
3. Ablations of E-FLoPS on the first seeds, each against the default on the same seeds.

Reports accuracy (mean ± sd, paired t and Wilcoxon tests), achieved density, uplink bits, the
genes selected (probe id, gene name; AFFX control probes flagged with their weights), the
CST3 (M27891_at) and MPO (M19507_at) counts, and the mean pairwise Jaccard index of the
selected sets across seeds.
"""

from __future__ import annotations

import argparse
import collections
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
    jaccard_stability,
    lasso_reference,
    score,
    split_tensors,
    tune,
)
from scipy import stats

FEDERATED = ("eflops", "fediht", "fedavg_prune")
CENTRAL = ("lasso_cv", "central_iht")
MARKERS = {"M27891_at": "CST3", "M19507_at": "MPO"}
SGD = "method.client_optimizer._target_=torch.optim.SGD"
LRS = (0.01, 0.03)
GRIDS: dict[str, list[list[str]]] = {
    "eflops": [
        [SGD, f"method.client_optimizer.lr={lr}", f"method.lambda_lr={step}", "method.temperature=0.001"]
        for lr in LRS
        for step in (10, 100, 1000)
    ],
    "fediht": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in LRS],
    "fedavg_prune": [[SGD, f"method.client_optimizer.lr={lr}"] for lr in LRS],
}
ABLATIONS: dict[str, tuple[str, list[str]]] = {
    "resume": (
        "off-support gates resumed from a per-tensor mean (previous default)",
        ["method.off_support_gates=resume"],
    ),
    "regrow": ("closed coordinates regrow by their SGD-predicted weight", ["method.off_support_gates=regrow"]),
    "T0": ("no entropy term (T = 0)", ["method.temperature=0"]),
    "expected_gate": (
        "D = mean E[z] by quadrature instead of mean P(z ≠ 0)",
        ["method.density_estimator=expected_gate"],
    ),
    "uniform_prior": ("KL to Bernoulli(1/2) instead of Bernoulli(ρ)", ["method.prior=uniform"]),
    "T10": ("strong entropy term (T = 10)", ["method.temperature=10"]),
    "T100": ("strong entropy term (T = 100)", ["method.temperature=100"]),
    "log_mu1": (
        "log-scale constraint + augmented Lagrangian μ = 1 (previous defaults)",
        ["method.constraint_scale=log", "method.penalty=1.0", "method.lambda_lr=0.0005"],
    ),
    "log": ("log-scale constraint alone (μ = 0, λ step 10 ρ)", ["method.constraint_scale=log", "method.lambda_lr=0.2"]),
    "adam": (
        "Adam (lr 0.01, log α lr 0.3) instead of SGD",
        [
            "method.client_optimizer._target_=torch.optim.Adam",
            "method.client_optimizer.lr=0.01",
            "method.log_alpha_lr=0.3",
        ],
    ),
}
"""E-FLoPS ablations by name (``--ablations``): a label and the overrides on top of the tuned default."""


def base(method: str, data_root: str) -> list[str]:
    return ["+experiment=golub_eflops", f"method={method}", f"data.root={data_root}"]


def features_of(coef: np.ndarray, probe_ids: tuple[str, ...], names: tuple[str, ...]) -> list[dict]:
    return [
        {"probe_id": probe_ids[j], "name": names[j], "weights": [float(coef[j])]} for j in np.flatnonzero(coef[:-1])
    ]


def gate_columns(runs: list[dict], selected: list[set[str]]) -> str:
    """``| D | pull | Jaccard |`` of E-FLoPS runs: the server's expected density, the median KL/constraint pull."""
    d = np.nanmean([float(r.get("model/expected_density", np.nan)) for r in runs])
    pull = np.nanmedian([float(r.get("model/kl_pull_ratio", np.nan)) for r in runs])
    return f"| {d:.4f} | {pull:.2g} | {jaccard_stability(selected):.3f} |"


def paired(a: list[float], b: list[float]) -> str:
    d = np.array(a) - np.array(b)
    t = stats.ttest_rel(a, b).pvalue if np.any(d != 0) else float("nan")
    w = f"{stats.wilcoxon(a, b).pvalue:.3g}" if np.any(d != 0) else "n/a (all differences zero)"
    return f"mean difference {d.mean():+.3f}; paired t p = {t:.3g}; Wilcoxon p = {w}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--ablation-seeds", type=int, default=10)
    parser.add_argument("--tune-seeds", type=int, default=2)
    parser.add_argument("--ablations", nargs="*", default=list(ABLATIONS), choices=list(ABLATIONS))
    parser.add_argument("--ablations-only", action="store_true", help="tuning and ablations, no evaluation")
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--out", default=str(REPO / "outputs" / "eflops" / "golub.md"))
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    started = time.time()
    out: list[str] = []

    def write(lines: list[str]) -> None:
        Path(args.out).write_text("\n".join(_header(args, started) + lines) + "\n")

    tune_seeds = [100 + i for i in range(args.tune_seeds)]
    chosen: dict[str, list[str]] = {}
    out += [
        "## Tuning (validation split: 20% of the training split; seeds " + ", ".join(map(str, tune_seeds)) + ")",
        "",
    ]
    for method in FEDERATED:
        tuning_base = [*base(method, args.data_root), "data.val_fraction=0.2"]
        rho = float(compose_cfg(tuning_base).method.density) if method == "eflops" else None
        try:
            best, table = tune(GRIDS[method], tuning_base, tune_seeds, "val/acc", rho=rho)
        except NoEligibleSettingError as exc:
            out.append(f"- {method}: stopped: {exc}")
            write(out)
            raise SystemExit(f"golub_comparison: {exc}") from None
        chosen[method] = best
        out.append(f"- {method}: " + "; ".join(describe_point(p) for p in table))
        out.append(f"  chosen: `{' '.join(best)}`")
        print(out[-2], file=sys.stderr, flush=True)
    acc: dict[str, list[float]] = {m: [] for m in (*FEDERATED, *CENTRAL)}
    dens: dict[str, list[float]] = {m: [] for m in acc}
    bits: dict[str, list[float]] = {m: [] for m in FEDERATED}
    selected: dict[str, list[set[str]]] = {m: [] for m in acc}
    controls: dict[str, list[str]] = {m: [] for m in acc}
    names: dict[str, str] = {}

    def evaluation() -> list[str]:
        out: list[str] = []
        n = len(acc["eflops"])
        out += [
            "",
            f"## Evaluation ({n} seeds; test split never used for any choice)",
            "",
            "| method | test acc (mean ± sd) | min | density (mean) | uplink bits / run (mean) | Jaccard stability |",
            "|---|---|---|---|---|---|",
        ]
        for m, a in acc.items():
            b = f"{np.mean(bits[m]):.3g}" if m in bits else "— (centralised)"
            out.append(
                f"| {m} | {np.mean(a):.3f} ± {np.std(a, ddof=1):.3f} | {np.min(a):.3f} | {np.mean(dens[m]):.4f} "
                f"| {b} | {jaccard_stability(selected[m]):.3f} |"
            )
        out += ["", "Paired tests of E-FLoPS against each other method (same seeds and splits):", ""]
        out += [f"- eflops − {m}: {paired(acc['eflops'], acc[m])}" for m in acc if m != "eflops"]
        out += ["", "Marker genes of the paper (seeds in which the probe was selected):", ""]
        for pid, gene in MARKERS.items():
            out.append(f"- {gene} ({pid}): " + ", ".join(f"{m} {sum(pid in s for s in selected[m])}/{n}" for m in acc))
        out += ["", "Most often selected probes (seeds; AFFX-* control probes marked [control]):", ""]
        for m in acc:
            counts = collections.Counter(p for s in selected[m] for p in s)
            top = ", ".join(
                f"{pid}{' [control]' if pid.startswith('AFFX') else ''} {names.get(pid, '')[:30]} ({c})"
                for pid, c in counts.most_common(10)
            )
            out.append(f"- {m}: {top}")
        out += ["", "AFFX control probes in a selected set (with their weight in the evaluated model):", ""]
        for m in acc:
            out.append(
                f"- {m}: " + ("none" if not controls[m] else f"{len(controls[m])}: " + ", ".join(controls[m][:8]))
            )

        return out

    # Ablations first (on the first seeds), so that an interrupted run still has them.
    abl: list[str] = []
    k = min(args.ablation_seeds, args.seeds)
    if k:
        abl += ["", f"## E-FLoPS ablations (seeds 0..{k - 1}, each against the tuned default on the same seeds)", ""]
        abl += [
            "| variant | test acc (mean ± sd) | vs default | CST3 | MPO | D (mean) | KL/constraint pull (median) "
            "| Jaccard stability |",
            "|---|---|---|---|---|---|---|---|",
        ]
        runs = [federated_run([*base("eflops", args.data_root), *chosen["eflops"], f"seed={s}"]) for s in range(k)]
        ref = [float(s["test/acc"]) for s in runs]
        ref_sel = [{f["probe_id"] for f in s["features"]} for s in runs]
        abl.append(
            f"| default (tuned) | {np.mean(ref):.3f} ± {np.std(ref, ddof=1):.3f} | — "
            + "".join(f"| {sum(p in s for s in ref_sel)}/{k} " for p in MARKERS)
            + gate_columns(runs, ref_sel)
        )
        for label, extra in (ABLATIONS[name] for name in args.ablations):
            a, sel, variant_runs = [], [], []
            for seed in range(k):
                s = federated_run([*base("eflops", args.data_root), *chosen["eflops"], *extra, f"seed={seed}"])
                a.append(float(s["test/acc"]))
                sel.append({f["probe_id"] for f in s["features"]})
                variant_runs.append(s)
            abl.append(
                f"| {label} (`{' '.join(extra)}`) | {np.mean(a):.3f} ± {np.std(a, ddof=1):.3f} | {paired(a, ref)} "
                + "".join(f"| {sum(p in s for s in sel)}/{k} " for p in MARKERS)
                + gate_columns(variant_runs, sel)
            )
            print(abl[-1], file=sys.stderr, flush=True)
            write(out + abl)
    for seed in range(0 if args.ablations_only else args.seeds):
        for method in FEDERATED:
            s = federated_run([*base(method, args.data_root), *chosen[method], f"seed={seed}"])
            acc[method].append(float(s["test/acc"]))
            dens[method].append(float(s["model/density"]))
            bits[method].append(float(s["comm/uplink_bits_total"]))
            feats = s["features"]
            selected[method].append({f["probe_id"] for f in feats})
            for f in feats:
                names[f["probe_id"]] = f.get("name", "")
                if f["probe_id"].startswith("AFFX"):
                    controls[method].append(f"{f['probe_id']} (seed {seed}, w = {f['weights'][0]:.3g})")
        data = split_tensors([*base("eflops", args.data_root), f"seed={seed}"])
        (x, y), (xt, yt), dm = data["train"], data["test"], data["datamodule"]
        m = int(0.02 * (x.shape[1] + 1))
        for method, coef in (
            ("lasso_cv", lasso_reference("classification", x, y, seed)),
            ("central_iht", iht_reference("classification", x, y, m)),
        ):
            acc[method].append(score("classification", coef, xt, yt))
            dens[method].append(float(np.count_nonzero(coef)) / coef.size)
            feats = features_of(coef, dm.probe_ids, dm.gene_names)
            selected[method].append({f["probe_id"] for f in feats})
            for f in feats:
                names[f["probe_id"]] = f["name"]
                if f["probe_id"].startswith("AFFX"):
                    controls[method].append(f"{f['probe_id']} (seed {seed}, w = {f['weights'][0]:.3g})")
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in acc.items()), file=sys.stderr, flush=True)
        if seed > 0:
            write(out + evaluation() + abl)
    if not args.ablations_only:
        out += evaluation()
    write(out + abl)


def _header(args: argparse.Namespace, started: float) -> list[str]:
    cmd = (
        f"python benchmarks/golub_comparison.py --seeds {args.seeds} --ablation-seeds {args.ablation_seeds} "
        f"--tune-seeds {args.tune_seeds} --ablations {' '.join(args.ablations)}"
        + (" --ablations-only" if args.ablations_only else "")
    )
    head = [
        "# Golub leukemia (72 × 3,571): E-FLoPS vs Fed-IHT vs FedAvg + pruning vs centralised references",
        "",
        f"Command: `{cmd}`; {time.strftime('%Y-%m-%d', time.gmtime())}; wall time {time.time() - started:.0f} s "
        "on a shared 2-core CPU (load from other jobs: times are inflated).",
        "",
    ]
    return head


if __name__ == "__main__":
    main()
