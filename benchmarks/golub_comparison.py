"""Golub leukemia: E-FLoPS vs Fed-IHT vs FedAvg + pruning over 30 seeds, one command.

    python benchmarks/golub_comparison.py [--seeds 30] [--data-root ../shared/data] [--out benchmarks/results/eflops.md]
        [--eflops-override method.final_support=test_gate ...] [overrides for all methods ...]

Every seed draws a fresh stratified 70/30 split (50 train / 22 test) and the same 5 IID
clients for all three methods (experiment ``golub_eflops``, same density ρ), so the test
accuracies are paired by seed; the table gives mean ± sd, a two-sided Wilcoxon signed-rank
test and a paired t-test of E-FLoPS against each baseline, the mean achieved density and
uplink bits, and how often each gene was selected (with CST3 = M27891_at, MPO = M19507_at).
``--eflops-override`` applies Hydra overrides to E-FLoPS only (e.g. the old evaluated model,
``method.final_support=test_gate``).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from scipy import stats

from fedlightning.run import run

REPO = Path(__file__).resolve().parents[1]
METHODS = ("eflops", "fediht", "fedavg_prune")
MARKERS = {"M27891_at": "CST3", "M19507_at": "MPO"}


def one_run(method: str, seed: int, data_root: str, extra: list[str]) -> tuple[dict, list[dict]]:
    overrides = [
        "+experiment=golub_eflops",
        f"method={method}",
        f"seed={seed}",
        f"data.root={data_root}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "checkpoint_every=0",
        "save_partition=false",
        "eval_every=1000",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    with tempfile.TemporaryDirectory() as folder:
        summary = run(cfg, folder)
        features = json.loads((Path(folder) / "selected_features.json").read_text())["features"]
    return summary, features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "eflops.md"))
    parser.add_argument(
        "--eflops-override", action="append", default=[], help="a Hydra override for E-FLoPS only (repeatable)"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for all methods, e.g. method.density=0.01")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    started = time.time()
    acc: dict[str, list[float]] = {m: [] for m in METHODS}
    dens: dict[str, list[float]] = {m: [] for m in METHODS}
    bits: dict[str, list[float]] = {m: [] for m in METHODS}
    genes: dict[str, collections.Counter[str]] = {m: collections.Counter() for m in METHODS}
    names: dict[str, str] = {}
    for seed in range(args.seeds):
        for method in METHODS:
            extra = [*args.overrides, *(args.eflops_override if method == "eflops" else [])]
            summary, features = one_run(method, seed, args.data_root, extra)
            acc[method].append(float(summary["test/acc"]))
            dens[method].append(float(summary["model/density"]))
            bits[method].append(float(summary["comm/uplink_bits_total"]))
            for f in features:
                genes[method][f["probe_id"]] += 1
                names[f["probe_id"]] = f.get("name", "")
        print(f"seed {seed}: " + ", ".join(f"{m} {acc[m][-1]:.3f}" for m in METHODS), file=sys.stderr)
    lines = [
        "# Golub leukemia: E-FLoPS vs Fed-IHT vs FedAvg + pruning",
        "",
        "Command: `"
        + " ".join(
            [
                f"python benchmarks/golub_comparison.py --seeds {args.seeds}",
                *(f"--eflops-override {o}" for o in args.eflops_override),
                *args.overrides,
            ]
        )
        + "`",
        f"({args.seeds} seeds, fresh stratified 70/30 split per seed, 5 IID clients, experiment `golub_eflops`; "
        f"wall time {time.time() - started:.0f} s on a shared 2-core CPU.)",
        "",
        "| method | test acc (mean ± sd) | min | density (mean) | uplink bits / run (mean) |",
        "|---|---|---|---|---|",
    ]
    for m in METHODS:
        a = np.array(acc[m])
        row = f"| {m} | {a.mean():.3f} ± {a.std(ddof=1):.3f} | {a.min():.3f} | {np.mean(dens[m]):.4f}"
        lines.append(f"{row} | {np.mean(bits[m]):.3g} |")
    lines += ["", "Paired tests of E-FLoPS against each baseline (same seeds and splits):", ""]
    for m in METHODS[1:]:
        d = np.array(acc["eflops"]) - np.array(acc[m])
        t = stats.ttest_rel(acc["eflops"], acc[m])
        w = stats.wilcoxon(acc["eflops"], acc[m]) if np.any(d != 0) else None
        wp = f"{w.pvalue:.3g}" if w is not None else "n/a (all differences zero)"
        lines.append(f"- eflops − {m}: mean difference {d.mean():+.3f}; paired t p = {t.pvalue:.3g}; Wilcoxon p = {wp}")
    lines += ["", "Most often selected genes (count of seeds, top 10 per method):", ""]
    for m in METHODS:
        top = ", ".join(f"{pid} {names[pid].split(' ')[0]} ({c})" for pid, c in genes[m].most_common(10))
        lines.append(f"- {m}: {top}")
    lines += ["", "Marker genes of the paper (seeds in which the gene was selected):", ""]
    for pid, gene in MARKERS.items():
        lines.append(f"- {gene} ({pid}): " + ", ".join(f"{m} {genes[m][pid]}/{args.seeds}" for m in METHODS))
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
