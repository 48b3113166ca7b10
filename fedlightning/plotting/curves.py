"""One curve per run: a run's own ``bits_vs_accuracy.png`` and the overlay of a few saved runs."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from fedlightning.plotting.runs import read_csv
from fedlightning.plotting.style import (
    COLUMN_WIDTH,
    PNG_DPI,
    X_AXES,
    metric_words,
    publication_style,
    readable_log_axis,
    save_figure,
    sentence,
)

Curve = list[tuple[float, float]]


def shared_key(labels: Sequence[str]) -> str | None:
    """The one override key that every label sets (``compressor`` of ``compressor=qsgd``), if any.

    >>> shared_key(["compressor=none", "compressor=qsgd"]), shared_key(["seed=0 rounds=5", "seed=1"])
    ('compressor', None)
    """
    keys = {label.partition("=")[0] for label in labels if "=" in label and " " not in label}
    return keys.pop() if len(keys) == 1 and all("=" in label and " " not in label for label in labels) else None


def plot_curves(
    curves: dict[str, Curve], path: str | Path, *, title: str = "", ylabel: str = "val/acc", pdf: bool = False
) -> Path:
    """Plot accuracy against cumulative uplink bits, one labelled line per curve (a run's own PNG).

    Labels of one shared override (``compressor=qsgd``) are shown as values under a legend titled by
    the key. The figure is a column wide; ``pdf`` also writes it as a PDF next to the PNG.
    Returns the PNG's path.
    """
    with publication_style():
        height = 2.6 + (0.15 * -(-len(curves) // 3) + 0.2 if len(curves) > 1 else 0.0)  # room for the legend below
        fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, height), layout="constrained")
        key = shared_key(list(curves)) if len(curves) > 1 else None
        xs_all: list[float] = []
        for label, points in curves.items():
            positive = [(b, a) for b, a in points if b > 0]
            if positive:
                xs, ys = zip(*positive, strict=True)
                xs_all += xs
                ax.plot(xs, ys, marker="o", label=label.partition("=")[2] if key else label)
        if xs_all:
            readable_log_axis(ax, min(xs_all), max(xs_all))
        ax.set_xlabel(X_AXES["uplink"][1])
        ax.set_ylabel(sentence(metric_words(ylabel)) if "/" in ylabel else ylabel)
        if title:
            ax.set_title(title)
        if len(curves) > 1:  # one run: the title names it
            fig.legend(loc="outside lower center", ncols=min(len(curves), 3), title=key, frameon=False)
    path = Path(path)
    if pdf:
        return save_figure(fig, path)[0]
    try:
        fig.savefig(path, dpi=PNG_DPI, bbox_inches="tight")
    finally:
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
    """Every finished run's (uplink bits, validation score) curve under ``dirs``, one per run.

    A failed or killed job may have written part of its curve but no ``summary.json``: it is
    left out (and listed by :func:`fedlightning.plotting.main`).
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


def unplotted_runs(dirs: Sequence[str | Path], x: str = "uplink") -> list[tuple[str, str]]:
    """(folder, reason) for each finished run (a ``summary.json``) that draws no curve."""
    left_out = []
    column = X_AXES[x][0]
    for top in dirs:
        for summary in sorted(Path(top).rglob("summary.json")):
            csv_path = summary.parent / "bits_vs_accuracy.csv"
            if not csv_path.is_file():
                left_out.append((str(summary.parent), "no bits_vs_accuracy.csv"))
                continue
            if x == "rounds":
                continue
            values = [r.get(column) for r in read_csv(csv_path)]
            if not any(v and v > 0 for v in values):
                words = X_AXES[x][1].lower().replace("uplink + downlink bits", "bits (uplink + downlink)")
                left_out.append((str(summary.parent), f"no evaluation with {words} > 0 (the x-axis is logarithmic)"))
    return left_out
