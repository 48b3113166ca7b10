"""Bits-vs-accuracy figures, for one run or overlaid across a sweep (``fedlightning-plot``).

The job folders that draw no curve (failed, killed, or without evaluations) are listed on
stderr with the reason of each.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedlightning.jobs import failed_or_unfinished, skipped_report

Curve = list[tuple[float, float]]


def plot_curves(curves: dict[str, Curve], path: str | Path, *, title: str = "", ylabel: str = "val/acc") -> Path:
    """Plot accuracy against cumulative uplink bits, one labelled line per curve."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves.items():
        positive = [(b, a) for b, a in points if b > 0]
        if positive:
            xs, ys = zip(*positive, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative uplink bits")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title)
    if curves:
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _run_overrides(run_dir: Path) -> list[str] | None:
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    return list(summary.get("overrides") or []) or [f"{summary.get('method', '?')} on {summary.get('data', '?')}"]


def sweep_labels(overrides: list[list[str] | None], names: list[str]) -> list[str]:
    """Label each run by the overrides that differ across the runs (a sweep's own axes).

    >>> sweep_labels([["seed=0", "rounds=5"], ["seed=1", "rounds=5"]], ["0", "1"])
    ['seed=0', 'seed=1']
    """
    known = [set(o) for o in overrides if o is not None]
    common = set.intersection(*known) if len(known) > 1 else set()
    labels = []
    for over, name in zip(overrides, names, strict=True):
        kept = [o for o in over or [] if o not in common]
        labels.append(" ".join(kept) if kept else name)
    return labels


def collect_curves(dirs: Sequence[str | Path]) -> dict[str, Curve]:
    """Every finished run folder (``bits_vs_accuracy.csv`` next to ``summary.json``) under ``dirs``.

    A failed or killed job may have written part of its curve but no ``summary.json``: it is
    left out (and listed by :func:`main`).
    """
    paths = [
        p
        for top in dirs
        for p in sorted(Path(top).rglob("bits_vs_accuracy.csv"))
        if (p.parent / "summary.json").is_file()
    ]
    labels = sweep_labels([_run_overrides(p.parent) for p in paths], [p.parent.name for p in paths])
    curves: dict[str, Curve] = {}
    for csv_path, label in zip(paths, labels, strict=True):
        with csv_path.open() as handle:
            rows = list(csv.DictReader(handle))
        score = next((k for k in ("val/acc", "val/r2") if rows and k in rows[0]), "val/acc")
        points = [
            (float(r["comm/uplink_bits_total"]), float(r[score])) for r in rows if r.get("comm/uplink_bits_total")
        ]
        while label in curves:
            label += "'"
        curves[label] = points
    return curves


def unplotted_runs(dirs: Sequence[str | Path]) -> list[tuple[str, str]]:
    """(folder, reason) for each finished run (a ``summary.json``) that draws no curve."""
    left_out = []
    for top in dirs:
        for summary in sorted(Path(top).rglob("summary.json")):
            csv_path = summary.parent / "bits_vs_accuracy.csv"
            if not csv_path.is_file():
                left_out.append((str(summary.parent), "no bits_vs_accuracy.csv"))
                continue
            with csv_path.open() as handle:
                bits = [r.get("comm/uplink_bits_total") for r in csv.DictReader(handle)]
            if not any(b and float(b) > 0 for b in bits):
                left_out.append((str(summary.parent), "no evaluation with uplink bits > 0 (the x-axis is logarithmic)"))
    return left_out


def main(argv: Sequence[str] | None = None) -> None:
    """``fedlightning-plot DIR... -o FILE.png``: overlay runs (a multirun folder too)."""
    parser = argparse.ArgumentParser(description="Overlay accuracy against cumulative uplink bits for many runs.")
    parser.add_argument("dirs", nargs="+", help="run folders or a multirun folder")
    parser.add_argument("-o", "--output", default="bits_vs_accuracy.png", help="PNG file to write")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    curves = collect_curves(args.dirs)
    unfinished = failed_or_unfinished(args.dirs)
    left_out = unfinished + unplotted_runs(args.dirs)
    if left_out:
        total = len(unfinished) + len({p.parent for top in args.dirs for p in Path(top).rglob("summary.json")})
        print(skipped_report(left_out, total), file=sys.stderr)
    if not curves:
        parser.exit(
            1, f"No bits_vs_accuracy.csv found under {', '.join(args.dirs)}; point at run or multirun folders.\n"
        )
    out = plot_curves(curves, args.output, title=args.title)
    print(f"wrote {out} with {len(curves)} runs")
