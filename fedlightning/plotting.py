"""Bits-vs-accuracy figures, for one run or overlaid across a sweep (``fedlightning-plot``)."""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    """Every run folder (one holding ``bits_vs_accuracy.csv``) under the given folders."""
    paths = [p for top in dirs for p in sorted(Path(top).rglob("bits_vs_accuracy.csv"))]
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


def main(argv: Sequence[str] | None = None) -> None:
    """``fedlightning-plot DIR... -o FILE.png``: overlay runs (a multirun folder too)."""
    parser = argparse.ArgumentParser(description="Overlay accuracy against cumulative uplink bits for many runs.")
    parser.add_argument("dirs", nargs="+", help="run folders or a multirun folder")
    parser.add_argument("-o", "--output", default="bits_vs_accuracy.png", help="PNG file to write")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    curves = collect_curves(args.dirs)
    if not curves:
        parser.exit(
            1, f"No bits_vs_accuracy.csv found under {', '.join(args.dirs)}; point at run or multirun folders.\n"
        )
    out = plot_curves(curves, args.output, title=args.title)
    print(f"wrote {out} with {len(curves)} runs")
