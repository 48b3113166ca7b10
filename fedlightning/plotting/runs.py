"""Finished runs of a sweep, read once per (config, seed) and grouped over their seeds.

A run's sweep axes are its command-line overrides; an axis separates groups only where the runs'
values of it differ (compared on the resolved config where every summary records it, so
``logger=csv`` on one run and the default on another do not split them), and never for the
bookkeeping keys of :data:`fedlightning.sweeps.BOOKKEEPING_KEYS` (``data.root``, ``logger``) or
``seed``, which is pooled. Runs of different data sets are never pooled or compared: a group
belongs to one data set (:attr:`Group.data`).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlightning.plotting.style import X_AXES
from fedlightning.sweeps import (
    deduplicate_runs,
    is_bookkeeping,
    override_values,
    result_values,
    run_identity,
)

#: Axes that never separate groups: the runs that differ only by these are pooled.
POOLED = ("seed",)


@dataclass
class RunData:
    """One finished run: its sweep axes, its summary and its evaluated curve."""

    run_dir: str
    axes: dict[str, str]
    summary: dict[str, Any]
    rows: list[dict[str, float]] = field(default_factory=list)  # round, bits columns, metric

    @property
    def data(self) -> str:
        """The run's data set: the summary's ``data``, else its ``data`` override, else ""."""
        return str(self.summary.get("data") or self.axes.get("data") or "")


def _floats(row: dict[str, str]) -> dict[str, float]:
    out = {}
    for key, value in row.items():
        if key is None or value in (None, ""):
            continue
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def read_csv(path: Path) -> list[dict[str, float]]:
    """The numeric cells of a CSV file, one dict per row."""
    with path.open() as handle:
        return [_floats(r) for r in csv.DictReader(handle)]


def read_curve(run_dir: str | Path, metric: str) -> list[dict[str, float]]:
    """The evaluations of ``metric`` in one run folder, by round, with their cumulative bits.

    From ``bits_vs_accuracy.csv`` when it has the metric, else from the run's Lightning
    ``metrics.csv`` (its evaluation rows; their round is the round of the same cumulative bits in
    ``bits_vs_accuracy.csv`` when the row has none). Columns are read by name; a file without a
    ``round`` column numbers its rows from 1.
    """
    run_dir = Path(run_dir)
    curve_file = run_dir / "bits_vs_accuracy.csv"
    base = read_csv(curve_file) if curve_file.is_file() else []
    for i, row in enumerate(base, start=1):
        row.setdefault("round", float(i))
    if base and any(metric in r for r in base):
        return [r for r in base if metric in r]
    by_bits = {r["comm/bits_total"]: r["round"] for r in base if "comm/bits_total" in r}
    rows: dict[float, dict[str, float]] = {}
    for metrics_file in sorted(run_dir.rglob("metrics.csv")):
        for r in read_csv(metrics_file):
            if metric not in r:
                continue
            rnd = r.get("round") or by_bits.get(r.get("comm/bits_total", math.nan))
            if rnd is None:
                continue
            point = {k: r[k] for k in (metric, *(c for c, _ in X_AXES.values())) if k in r}
            rows[rnd] = point | {"round": rnd}
    return [rows[k] for k in sorted(rows)]


def read_runs(dirs: Sequence[str | Path], metric: str) -> list[RunData]:
    """Every finished run (``summary.json``) under ``dirs``, repeated runs included."""
    runs = []
    for top in dirs:
        for path in sorted(Path(top).rglob("summary.json")):
            summary = json.loads(path.read_text())
            rows = read_curve(path.parent, metric) if metric.startswith("val/") else []
            axes = override_values(summary.get("overrides"))
            runs.append(RunData(run_dir=str(path.parent), axes=axes, summary=summary, rows=rows))
    return runs


def unique_runs(runs: Sequence[RunData]) -> tuple[list[RunData], list[str]]:
    """``runs`` with each (config, seed) once, and a sentence per copy left out.

    Two copies agree when their summaries' results and their curves do
    (:func:`fedlightning.sweeps.deduplicate_runs`); copies that differ raise
    :class:`fedlightning.sweeps.DuplicateRunError` naming both folders.
    """
    return deduplicate_runs(
        runs,
        identity=lambda run: run_identity(run.summary),
        results=lambda run: {**result_values(run.summary), "curve": [sorted(r.items()) for r in run.rows]},
        folder=lambda run: run.run_dir,
    )


def load_runs(dirs: Sequence[str | Path], metric: str) -> list[RunData]:
    """Every finished run under ``dirs``, each (config, seed) once (:func:`unique_runs`), with its curve."""
    return unique_runs(read_runs(dirs, metric))[0]


def _config_node(summary: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = summary.get("config")
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _axis_values(runs: Sequence[RunData], key: str) -> list[str | None]:
    """What tells the runs apart on ``key``: the resolved config where every run records it, else the override."""
    nodes = [_config_node(run.summary, key) for run in runs]
    if all(found for found, _ in nodes):
        return [json.dumps(node, sort_keys=True, default=str) for _, node in nodes]
    return [run.axes.get(key) for run in runs]


def _shown(members: Sequence[RunData], key: str) -> str:
    """A group's value of ``key`` in words: an override, else the config's scalar, else the summary's
    (``method``, ``partition``: the config-group choices a run records), else "(default)"."""
    for run in members:
        if key in run.axes:
            return run.axes[key]
    found, node = _config_node(members[0].summary, key)
    if found and isinstance(node, str | int | float | bool):
        return str(node)
    recorded = members[0].summary.get(key)
    return str(recorded) if isinstance(recorded, str | int | float) and not isinstance(recorded, bool) else "(default)"


def sweep_axes(runs: Sequence[RunData], pooled: Sequence[str] = POOLED) -> list[str]:
    """The override keys whose values differ across ``runs`` (in first-seen order).

    ``pooled`` keys and bookkeeping keys (:func:`fedlightning.sweeps.is_bookkeeping`) excepted;
    a key is compared on the resolved config where every run's summary records it.
    """
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.axes if k not in keys and k not in pooled and not is_bookkeeping(k)]
    return [k for k in keys if len(set(_axis_values(runs, k))) > 1]


# --------------------------------------------------------------------------- aggregation


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value).

    >>> mean_std([0.5, 0.7])
    (0.6, 0.14142135623730948)
    """
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


@dataclass
class Group:
    """The runs of one data set that differ only by seed, aggregated: a curve (validation) or a final point (test)."""

    axes: dict[str, str]
    runs: list[RunData]
    data: str = ""
    rounds: list[float] = field(default_factory=list)
    x: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    final_x: float = math.nan
    final_mean: float = math.nan
    final_std: float = math.nan

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.axes.items()) or "all runs"

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What identifies the group: its data set and its axis values."""
        return self.data, tuple(self.axes.items())

    @property
    def seeds(self) -> int:
        return len(self.runs)


def sort_value(value: str | None) -> tuple[int, float | str]:
    """Sort key of an axis value: numbers by value, then words, then missing."""
    if value is None:
        return (2, "")
    try:
        return (0, float(value))
    except ValueError:
        return (1, value)


def _number_or_nan(value: object) -> float:
    """``value`` as a float, NaN where a summary lacks it (a recorded 0 stays 0)."""
    return float(value) if isinstance(value, int | float) else math.nan


def group_runs(runs: Sequence[RunData], metric: str, x: str) -> list[Group]:
    """Aggregate ``runs`` into groups of one data set and equal sweep axes (seed pooled), sorted.

    A validation ``metric`` gives each group the seed-mean curve over the rounds all its seeds
    evaluated (x: the seeds' mean); its final point is the last one. A test metric gives only the
    final point: the seeds' mean (± std) of the summary value at the mean final x.
    """
    x_key = X_AXES[x][0]
    final_x_key = "rounds" if x == "rounds" else x_key
    axes = sweep_axes(runs)
    values = {k: _axis_values(runs, k) for k in axes}
    by_key: dict[tuple[str, tuple[str | None, ...]], list[RunData]] = {}
    for i, run in enumerate(runs):
        by_key.setdefault((run.data, tuple(values[k][i] for k in axes)), []).append(run)
    groups = []
    for key, members in by_key.items():
        group = Group(axes={k: _shown(members, k) for k in axes}, runs=members, data=key[0])
        if metric.startswith("val/"):
            per_run = [{r["round"]: r for r in run.rows if x_key in r and metric in r} for run in members]
            common = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
            for rnd in common:
                group.rounds.append(rnd)
                group.x.append(statistics.fmean(p[rnd][x_key] for p in per_run))
                mean, std = mean_std([p[rnd][metric] for p in per_run])
                group.mean.append(mean)
                group.std.append(std)
            if group.rounds:
                group.final_x, group.final_mean, group.final_std = group.x[-1], group.mean[-1], group.std[-1]
        else:
            finals = [run for run in members if isinstance(run.summary.get(metric), int | float)]
            if finals:
                group.final_x = statistics.fmean(_number_or_nan(run.summary.get(final_x_key)) for run in finals)
                group.final_mean, group.final_std = mean_std([float(run.summary[metric]) for run in finals])
                group.runs = finals
        if not math.isnan(group.final_mean):
            groups.append(group)
    return sorted(groups, key=lambda g: (g.data, [sort_value(v) for v in g.axes.values()]))


def over_axis(groups: Sequence[Group], key: str) -> list[Group]:
    """Re-draw groups as curves over the sweep axis ``key``: one series per data set and value of the other axes.

    Each point is a group's final metric (mean ± std over its seeds) at ``float(value of key)``,
    e.g. Zampling's accuracy over m/n (``method.compression``) with one line per ``method.d``.
    """
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[Group]] = {}
    for g in groups:
        if key in g.axes:
            rest = tuple((k, v) for k, v in g.axes.items() if k != key)
            series.setdefault((g.data, rest), []).append(g)
    out = []
    for (data, rest), members in series.items():
        members = sorted(members, key=lambda g: float(g.axes[key]))
        line = Group(axes=dict(rest), runs=min((g.runs for g in members), key=len), data=data)
        line.x = [float(g.axes[key]) for g in members]
        line.mean = [g.final_mean for g in members]
        line.std = [g.final_std for g in members]
        line.rounds = [float("nan")] * len(members)
        line.final_x, line.final_mean, line.final_std = line.x[-1], line.mean[-1], line.std[-1]
        out.append(line)
    return out


def pareto_front(points: Sequence[tuple[float, float]], *, maximise: bool = True) -> list[int]:
    """Indices of the points no other point beats on both x (fewer) and y, sorted by x.

    >>> pareto_front([(1, 0.5), (2, 0.4), (3, 0.9), (4, 0.9)])
    [0, 2]
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1] if maximise else points[i][1]))
    front, best = [], -math.inf
    for i in order:
        y = points[i][1] if maximise else -points[i][1]
        if y > best:
            front.append(i)
            best = y
    return front


def first_reaching(xs: Sequence[float], ys: Sequence[float], target: float, *, maximise: bool = True) -> float | None:
    """The first x at which ``ys`` reaches ``target`` (≥, or ≤ for a loss); None when it never does.

    >>> first_reaching([10, 20, 30], [0.5, 0.9, 0.95], 0.9), first_reaching([10], [0.5], 0.9)
    (20, None)
    >>> first_reaching([10, 20], [2.5, 2.0], 2.0, maximise=False)
    20
    """
    for x, y in zip(xs, ys, strict=True):
        if (y >= target) if maximise else (y <= target):
            return x
    return None


def higher_is_better(key: str) -> bool:
    """Accuracy-like metrics rise, losses fall."""
    return "loss" not in key.rsplit("/", 1)[-1]
