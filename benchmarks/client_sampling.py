"""Client-sampling runs side by side: accuracy, uplink bits (control included) and bits to a target accuracy.

Reads finished run folders (each with ``summary.json`` and ``csv/metrics.csv``) and prints a
Markdown table with one row per run::

    python benchmarks/client_sampling.py RUN_DIR [RUN_DIR ...] --target 0.95 --reference full

Each row is labelled ``<experiment> <sampler>`` (from the run's overrides); ``--reference`` is
a label (or the end of one, e.g. ``full`` or ``ocs_femnist_full uniform``) whose mean uplink
total the other rows are compared with (the "fewer bits than full participation" factor).
Bits to target is the cumulative uplink at the first evaluation whose ``val/acc`` reaches
``--target`` (``—`` if it never does).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any


def evaluations(folder: Path) -> list[tuple[float, float, float]]:
    """(round, cumulative uplink bits, val/acc) of every evaluation row of a run."""
    rows = []
    with (folder / "csv" / "metrics.csv").open() as handle:
        for row in csv.DictReader(handle):
            if row.get("val/acc") and row.get("comm/uplink_bits_total"):
                rows.append((float(row["step"]), float(row["comm/uplink_bits_total"]), float(row["val/acc"])))
    return sorted(rows)


def round_means(folder: Path, name: str) -> float:
    """Mean of a per-round metric over the run (``nan`` if it was never logged)."""
    with (folder / "csv" / "metrics.csv").open() as handle:
        values = [float(r[name]) for r in csv.DictReader(handle) if r.get(name)]
    return statistics.fmean(values) if values else math.nan


def bits_to_target(points: list[tuple[float, float, float]], target: float) -> float:
    """Cumulative uplink bits at the first evaluation reaching ``target`` (``inf`` if none does)."""
    for _, bits, acc in points:
        if acc >= target:
            return bits
    return math.inf


def describe(folder: Path, target: float) -> dict[str, Any]:
    summary = json.loads((folder / "summary.json").read_text())
    experiments = [o.split("=", 1)[1] for o in summary.get("overrides", []) if o.startswith("+experiment=")]
    return {
        "folder": folder.name,
        "label": " ".join([*experiments, summary["sampler"]]),
        "sampler": summary["sampler"],
        "seed": summary["seed"],
        "test/acc": summary["test/acc"],
        "uplink": summary["comm/uplink_bits_total"],
        "control": summary.get("comm/uplink_control_bits_total", 0),
        "uploads": summary["comm/uplink_messages"],
        "alpha": round_means(folder, "sampling/alpha"),
        "to_target": bits_to_target(evaluations(folder), target),
    }


def table(runs: list[dict[str, Any]], *, target: float, reference: str) -> str:
    ref = [r["uplink"] for r in runs if r["label"] == reference or r["label"].endswith(" " + reference)]
    ref_bits = statistics.fmean(ref) if ref else math.nan
    lines = [
        f"| run | arm | seed | test acc | uplink bits | of which control | uploads | full ÷ this | "
        f"mean α | uplink bits to val acc {target:g} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        alpha = "—" if math.isnan(r["alpha"]) else f"{r['alpha']:.3f}"
        to_target = "—" if math.isinf(r["to_target"]) else f"{r['to_target']:.3g}"
        lines.append(
            f"| {r['folder']} | {r['label']} | {r['seed']} | {r['test/acc']:.4f} | {r['uplink']:.4g} | "
            f"{r['control']:.3g} | {r['uploads']} | {ref_bits / r['uplink']:.2f}× | {alpha} | {to_target} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--reference", default="full")
    args = parser.parse_args()
    runs = [describe(folder, args.target) for folder in args.runs]
    print(table(runs, target=args.target, reference=args.reference))


if __name__ == "__main__":
    main()
