"""Bits-vs-accuracy figures and tables of a sweep (``fedlightning-plot``).

``fedlightning-plot DIR... -o FIG.png`` groups the finished runs under ``DIR`` by their sweep
axes (the command-line overrides that differ across the runs, as :func:`fedlightning.sweeps.collect_runs`
reads them) except ``seed``, so runs that differ only by seed become one line: the mean over the
seeds with a ± one sample standard deviation band. The seeds of a group are aligned by round (a
round that not every seed evaluated is dropped); the bits of a point are the seeds' mean (with
a random compressor or entropy codes they may differ slightly).

* ``--x uplink|total|rounds``: cumulative uplink bits, uplink + downlink bits, or rounds
  (bits on a log axis labelled at decades, or at 1-2-5 steps when the runs span less than two);
  or a numeric sweep axis (``--x method.compression``): each group's final metric over its
  values, a line per value of the other axes;
* ``--y "validation accuracy"``: the metric, in words or as a key (``val/acc``, ``test/loss``,
  ``val/acc_sampled_mean``); a validation metric is drawn as a curve (``bits_vs_accuracy.csv``,
  else the run's ``metrics.csv``), a test metric, evaluated once, as one point per group with
  an error bar at the group's final x;
* ``--hue KEY`` / ``--style KEY``: colour and line style by a sweep axis (``compressor``,
  ``method.compression``); by default each group has its own colour;
* the Pareto frontier of the groups' final (bits or rounds, metric) points is marked;
* ``--target 0.9``: the table also gives the x at which a group's seed-mean validation curve
  first reaches the target ("not reached" when it never does).

The figure is written as PNG and PDF (``FIG.png`` and ``FIG.pdf``), the table as Markdown and CSV
(``FIG_table.md``, ``FIG_table.csv``). ``--preset`` fixes x, y, hue and the table for a paper's
figure (:data:`PRESETS`). The job folders that draw nothing (failed, killed, or without
evaluations) are listed on stderr with the reason of each.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from fedlightning.jobs import failed_or_unfinished, skipped_report

Curve = list[tuple[float, float]]

#: ``--x`` choices: (curve column / summary key, axis label).
X_AXES: dict[str, tuple[str, str]] = {
    "uplink": ("comm/uplink_bits_total", "cumulative uplink bits"),
    "total": ("comm/bits_total", "cumulative bits (uplink + downlink)"),
    "rounds": ("round", "round"),
}
SPLIT_WORDS = {"val": "validation", "test": "test", "train": "training"}
NAME_WORDS = {
    "acc": "accuracy",
    "loss": "loss",
    "r2": "R²",
    "acc_best": "best accuracy",
    "acc_sampled_mean": "accuracy of sampled networks (mean)",
}
#: Axes that never separate groups: the runs that differ only by these are pooled.
POOLED = ("seed",)


@dataclass(frozen=True)
class Preset:
    """A paper's figure: its x, y, hue and what the table shows."""

    x: str
    y: str
    hue: str
    title: str
    description: str
    target: float | None = None


PRESETS: dict[str, Preset] = {
    "zampling_tradeoff": Preset(
        x="method.compression",
        y="test/acc_sampled_mean",
        hue="method.d",
        title="Zampling: accuracy over m/n",
        description="Zampling (arXiv 2503.14246): test accuracy of sampled networks over m/n (method.compression), "
        "a line per method.d; the table per m/n with its uplink bits",
    ),
    "compressors_equal_bits": Preset(
        x="uplink",
        y="val/acc",
        hue="compressor",
        title="Compressors at equal uplink bits",
        target=0.9,
        description="uplink compressors at equal uplink bits (thesis, arXiv 2207.00392)",
    ),
    "eflops_golub": Preset(
        x="uplink",
        y="test/acc",
        hue="method",
        title="E-FLoPS and baselines on Golub",
        description="E-FLoPS and its baselines (method) on Golub: test accuracy over the seeds",
    ),
}


def metric_key(name: str) -> str:
    """The metric key for a metric named in words or as a key.

    >>> [metric_key(n) for n in ("validation accuracy", "Test loss", "val/r2", "validation R²")]
    ['val/acc', 'test/loss', 'val/r2', 'val/r2']
    """
    if "/" in name:
        return name
    words = name.strip().lower().replace("²", "2").split()
    splits = {v: k for k, v in SPLIT_WORDS.items()} | {k: k for k in SPLIT_WORDS}
    if len(words) < 2 or words[0] not in splits:
        raise ValueError(f"--y {name!r}: name a split and a metric, e.g. 'validation accuracy' or val/acc.")
    rest = " ".join(words[1:])
    names = {v.lower().replace("²", "2"): k for k, v in NAME_WORDS.items()} | {"acc": "acc"}
    return f"{splits[words[0]]}/{names.get(rest, rest.replace(' ', '_'))}"


def metric_words(key: str) -> str:
    """The metric named in words, for axis labels and table headers.

    >>> metric_words("val/acc"), metric_words("test/acc_sampled_mean"), metric_words("val/f1")
    ('validation accuracy', 'test accuracy of sampled networks (mean)', 'validation f1')
    """
    split, _, name = key.partition("/")
    return f"{SPLIT_WORDS.get(split, split)} {NAME_WORDS.get(name, name)}".strip()


def higher_is_better(key: str) -> bool:
    """Accuracy-like metrics rise, losses fall."""
    return "loss" not in key.rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- reading runs


@dataclass
class RunData:
    """One finished run: its sweep axes, its summary and its evaluated curve."""

    run_dir: str
    axes: dict[str, str]
    summary: dict[str, Any]
    rows: list[dict[str, float]] = field(default_factory=list)  # round, bits columns, metric


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


def _read_csv(path: Path) -> list[dict[str, float]]:
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
    base = _read_csv(curve_file) if curve_file.is_file() else []
    for i, row in enumerate(base, start=1):
        row.setdefault("round", float(i))
    if base and any(metric in r for r in base):
        return [r for r in base if metric in r]
    by_bits = {r["comm/bits_total"]: r["round"] for r in base if "comm/bits_total" in r}
    rows: dict[float, dict[str, float]] = {}
    for metrics_file in sorted(run_dir.rglob("metrics.csv")):
        for r in _read_csv(metrics_file):
            if metric not in r:
                continue
            rnd = r.get("round") or by_bits.get(r.get("comm/bits_total", math.nan))
            if rnd is None:
                continue
            point = {k: r[k] for k in (metric, *(c for c, _ in X_AXES.values())) if k in r}
            rows[rnd] = point | {"round": rnd}
    return [rows[k] for k in sorted(rows)]


def load_runs(dirs: Sequence[str | Path], metric: str) -> list[RunData]:
    """Every finished run (``summary.json``) under ``dirs``, with its overrides as axes and its curve."""
    from fedlightning.sweeps import collect_runs

    runs = []
    for record in collect_runs(dirs):
        summary = json.loads(Path(record["run_dir"], "summary.json").read_text())
        axes = {}
        for override in summary.get("overrides") or []:
            key, sep, value = override.lstrip("+~").partition("=")
            if sep:
                axes[key] = value
        rows = read_curve(record["run_dir"], metric) if metric.startswith("val/") else []
        runs.append(RunData(run_dir=str(record["run_dir"]), axes=axes, summary=summary, rows=rows))
    return runs


def sweep_axes(runs: Sequence[RunData], pooled: Sequence[str] = POOLED) -> list[str]:
    """The override keys whose values differ across ``runs`` (in first-seen order), ``pooled`` excepted."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.axes if k not in keys]
    return [k for k in keys if k not in pooled and len({run.axes.get(k) for run in runs}) > 1]


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
    """The runs that differ only by seed, aggregated: a curve (validation) or a final point (test)."""

    axes: dict[str, str]
    runs: list[RunData]
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
    def seeds(self) -> int:
        return len(self.runs)


def _sort_value(value: str | None) -> tuple[int, float | str]:
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
    """Aggregate ``runs`` into groups of equal sweep axes (seed pooled), sorted by their axis values.

    A validation ``metric`` gives each group the seed-mean curve over the rounds all its seeds
    evaluated (x: the seeds' mean); its final point is the last one. A test metric gives only the
    final point: the seeds' mean (± std) of the summary value at the mean final x.
    """
    x_key = X_AXES[x][0]
    final_x_key = "rounds" if x == "rounds" else x_key
    axes = sweep_axes(runs)
    by_axes: dict[tuple[str | None, ...], list[RunData]] = {}
    for run in runs:
        by_axes.setdefault(tuple(run.axes.get(k) for k in axes), []).append(run)
    groups = []
    for values in sorted(by_axes, key=lambda vs: [_sort_value(v) for v in vs]):
        members = by_axes[values]
        group = Group(
            axes={k: v if v is not None else "(default)" for k, v in zip(axes, values, strict=True)}, runs=members
        )
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
    return groups


def over_axis(groups: Sequence[Group], key: str) -> list[Group]:
    """Re-draw groups as curves over the sweep axis ``key``: one series per value of the other axes.

    Each point is a group's final metric (mean ± std over its seeds) at ``float(value of key)``,
    e.g. Zampling's accuracy over m/n (``method.compression``) with one line per ``method.d``.
    """
    series: dict[tuple[tuple[str, str], ...], list[Group]] = {}
    for g in groups:
        if key in g.axes:
            rest = tuple((k, v) for k, v in g.axes.items() if k != key)
            series.setdefault(rest, []).append(g)
    out = []
    for rest, members in series.items():
        members = sorted(members, key=lambda g: float(g.axes[key]))
        line = Group(axes=dict(rest), runs=min((g.runs for g in members), key=len))
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


# --------------------------------------------------------------------------- drawing


def _superscript(n: int) -> str:
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def bits_label(value: float, _pos: int | None = None) -> str:
    """A log-axis tick label: ``10⁶`` at decades, ``2×10⁶`` between them.

    >>> bits_label(1e6), bits_label(2e6), bits_label(5e-3), bits_label(0.0)
    ('10⁶', '2×10⁶', '5×10⁻³', '')
    """
    if value <= 0 or not math.isfinite(value):
        return ""
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10**exponent, 6)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    decade = f"10{_superscript(exponent)}"
    return decade if mantissa == 1 else f"{mantissa:g}×{decade}"


def log_ticks(low: float, high: float, *, max_ticks: int = 6) -> list[float]:
    """Labelled tick positions in [low, high] on a log axis: at least two, at most ``max_ticks``.

    Decades (every k-th when there are many), else 1-2-5 steps, else 1..9 steps, else a linear
    1-2-5 grid for a range narrower than that.

    >>> log_ticks(1e3, 1e9)
    [1000.0, 100000.0, 10000000.0, 1000000000.0]
    >>> log_ticks(1.5e6, 1.2e7), log_ticks(1.4e5, 2.6e5)
    ([2000000.0, 5000000.0, 10000000.0], [150000.0, 200000.0, 250000.0])
    """
    k0, k1 = math.floor(math.log10(low)), math.floor(math.log10(high))
    decades = [10.0**k for k in range(k0, k1 + 1) if low <= 10.0**k <= high]
    if len(decades) >= 2:
        step = math.ceil(len(decades) / max_ticks)
        return decades[::step]
    for subs in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0**k for k in range(k0, k1 + 1) for m in subs if low <= m * 10.0**k <= high]
        if 2 <= len(ticks) <= max_ticks:
            return ticks
    grid = MaxNLocator(nbins=3, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    return [float(t) for t in grid if low <= t <= high]


def readable_log_axis(ax: Axes, low: float, high: float) -> None:
    """A log x axis over the data's [low, high] whose labels never collide (:func:`log_ticks`)."""
    ax.set_xscale("log")
    pad = 2.0 if high <= low * 1.01 else 1.1
    ax.set_xlim(low / pad, high * pad)
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(low / pad, high * pad)))
    ax.xaxis.set_major_formatter(FuncFormatter(bits_label))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.xaxis.set_minor_formatter(NullFormatter())


_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _palette(values: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10" if len(values) <= 10 else "viridis")
    if len(values) <= 10:
        return {v: cmap(i) for i, v in enumerate(values)}
    return {v: cmap(i / max(len(values) - 1, 1)) for i, v in enumerate(values)}


def draw(
    groups: Sequence[Group],
    *,
    x: str = "uplink",
    metric: str = "val/acc",
    hue: str | None = None,
    style: str | None = None,
    title: str = "",
) -> Figure:
    """The figure of ``groups``: seed-mean lines with ± std bands (or final points), the Pareto frontier."""
    fig, ax = plt.subplots(figsize=(7.4, 4.2))
    hue_of: Callable[[Group], str] = (lambda g: g.axes.get(hue, "(default)")) if hue else (lambda g: g.label)
    style_of: Callable[[Group], str] = (lambda g: g.axes.get(style, "(default)")) if style else (lambda g: "")
    hues = sorted({hue_of(g) for g in groups}, key=_sort_value)
    styles = sorted({style_of(g) for g in groups}, key=_sort_value)
    colours = _palette(hues)
    cost_x = x in X_AXES  # bits or rounds: a Pareto frontier means something; a sweep axis: no
    values = [v for g in groups for v in (g.x or [g.final_x])]
    log_x = x != "rounds" and (cost_x or (min(values, default=0) > 0 and max(values) >= 10 * min(values)))
    for g in groups:
        colour = colours[hue_of(g)]
        k = styles.index(style_of(g))
        linestyle, marker = _STYLES[k % len(_STYLES)], _MARKERS[k % len(_MARKERS)]
        name = g.axes[hue] if hue and list(g.axes) == [hue] else g.label  # the legend title names the axis
        label = f"{name} (n={g.seeds})"
        if g.x:
            keep = [i for i, v in enumerate(g.x) if v > 0 or not log_x]
            xs = [g.x[i] for i in keep]
            mean = [g.mean[i] for i in keep]
            std = [g.std[i] for i in keep]
            ax.plot(xs, mean, color=colour, linestyle=linestyle, marker=marker, markersize=3, label=label)
            if g.seeds > 1:
                lower = [m - s for m, s in zip(mean, std, strict=True)]
                upper = [m + s for m, s in zip(mean, std, strict=True)]
                ax.fill_between(xs, lower, upper, color=colour, alpha=0.2, linewidth=0)
        else:
            ax.errorbar(
                [g.final_x], [g.final_mean], yerr=[g.final_std], color=colour, marker=marker, capsize=3,
                linestyle="none", label=label,
            )  # fmt: skip
    finals = [(g.final_x, g.final_mean) for g in groups]
    front = pareto_front(finals, maximise=higher_is_better(metric)) if cost_x else []
    front = [i for i in front if finals[i][0] > 0 or not log_x]
    if front:
        fx, fy = zip(*(finals[i] for i in front), strict=True)
        ax.plot(
            fx, fy, color="black", linestyle=(0, (4, 2)), linewidth=1, marker="*", markersize=11,
            markerfacecolor="none", label="Pareto frontier (final)", zorder=5,
        )  # fmt: skip
    if log_x:
        xs_all = [v for g in groups for v in (g.x or [g.final_x]) if v > 0]
        if xs_all and cost_x:
            readable_log_axis(ax, min(xs_all), max(xs_all))
        elif xs_all:  # a sweep axis such as m/n: label its own values
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs_all))))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(X_AXES[x][1] if cost_x else x)
    ax.set_ylabel(metric_words(metric))
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title)
    if groups:
        legend_title = " / ".join(k for k in (hue, style) if k) or None
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small", title=legend_title)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | Path) -> list[Path]:
    """Write ``fig`` as PNG and PDF next to each other (``path`` with either suffix); close it."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in (".png", ".pdf") else path
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, dpi in ((".png", 150), (".pdf", None)):
        out = stem.with_suffix(suffix)
        fig.savefig(out, dpi=dpi, bbox_inches="tight")
        written.append(out)
    plt.close(fig)
    return written


# --------------------------------------------------------------------------- table


def table_rows(
    groups: Sequence[Group],
    *,
    metric: str,
    x: str,
    target: float | None = None,
    curves: Sequence[Group] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-group table: final metric, final x, x to ``target``.

    ``curves`` are the groups' validation curves (the same groups when ``metric`` is a
    validation metric) on which ``target`` is read.
    """
    axes = list(groups[0].axes) if groups else []
    curves_by = {g.label: g for g in (curves if curves is not None else groups)}
    curve_metric = metric if metric.startswith("val/") else "val/" + metric.split("/", 1)[-1]
    x_words = X_AXES[x][1].replace("cumulative ", "")
    header = [*axes, "seeds", f"final {metric_words(metric)}", f"final {x_words}"]
    if target is not None:
        header.append(f"{x_words} to {metric_words(curve_metric)} {target:g}")
    rows = []
    for g in groups:
        final = f"{g.final_mean:.4f}" + (f" ± {g.final_std:.4f}" if g.seeds > 1 else "")
        row = [*g.axes.values(), str(g.seeds), final, _number(g.final_x)]
        curve = curves_by.get(g.label)
        maximise = higher_is_better(curve_metric)
        if target is not None:
            reached = first_reaching(curve.x, curve.mean, target, maximise=maximise) if curve else None
            row.append(_number(reached) if reached is not None else "not reached")
        rows.append(row)
    return header, rows


def _number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.4g}"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table.

    >>> print(markdown(["a", "b"], [["1", "2"]]))
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_table(header: Sequence[str], rows: Sequence[Sequence[str]], stem: str | Path) -> list[Path]:
    """Write ``<stem>_table.md`` and ``<stem>_table.csv``."""
    stem = Path(stem)
    md, csv_path = Path(f"{stem}_table.md"), Path(f"{stem}_table.csv")
    md.write_text(markdown(header, rows) + "\n")
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return [md, csv_path]


# --------------------------------------------------------------------------- one run, old API


def plot_curves(curves: dict[str, Curve], path: str | Path, *, title: str = "", ylabel: str = "val/acc") -> Path:
    """Plot accuracy against cumulative uplink bits, one labelled line per curve (a run's own PNG)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs_all: list[float] = []
    for label, points in curves.items():
        positive = [(b, a) for b, a in points if b > 0]
        if positive:
            xs, ys = zip(*positive, strict=True)
            xs_all += xs
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if xs_all:
        readable_log_axis(ax, min(xs_all), max(xs_all))
    ax.set_xlabel("cumulative uplink bits")
    ax.set_ylabel(metric_words(ylabel) if "/" in ylabel else ylabel)
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title)
    if len(curves) > 1:  # one run: the title names it
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
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
            values = [r.get(column) for r in _read_csv(csv_path)]
            if not any(v and v > 0 for v in values):
                left_out.append(
                    (
                        str(summary.parent),
                        f"no evaluation with {X_AXES[x][1].replace('cumulative ', '')} > 0 (the x-axis is logarithmic)",
                    )
                )
    return left_out


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> None:
    """``fedlightning-plot DIR... -o FIG.png [--x ...] [--y ...] [--hue KEY] [--target T] [--preset NAME]``."""
    parser = argparse.ArgumentParser(
        description="Seed-aggregated bits-vs-accuracy figure (PNG and PDF) and per-group table of a sweep.",
        epilog="Presets: " + "; ".join(f"{k}: {p.description}" for k, p in PRESETS.items()),
    )
    parser.add_argument("dirs", nargs="+", help="run folders or a multirun folder")
    parser.add_argument("-o", "--output", default="bits_vs_accuracy.png", help="figure (PNG; a PDF is written too)")
    parser.add_argument("--title", default="", help="figure title")
    parser.add_argument(
        "--x", default=None, help="uplink, total (bits), rounds, or a numeric sweep axis such as method.compression"
    )
    parser.add_argument("--y", default=None, help="metric in words or as a key (default: validation accuracy)")
    parser.add_argument("--hue", default=None, help="colour by this sweep axis (an override key, e.g. compressor)")
    parser.add_argument("--style", default=None, help="line style by this sweep axis")
    parser.add_argument("--target", type=float, default=None, help="table: x at which the validation curve reaches it")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a paper's figure: fixes x, y, hue")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset] if args.preset else None
    x = args.x or (preset.x if preset else "uplink")
    try:
        metric = metric_key(args.y) if args.y else (preset.y if preset else "")
    except ValueError as exc:
        parser.error(str(exc))
    target = args.target if args.target is not None else (preset.target if preset else None)
    cost_x = x if x in X_AXES else "uplink"  # the table's x: bits (or rounds)

    unfinished = failed_or_unfinished(args.dirs)
    left_out = unfinished + unplotted_runs(args.dirs, cost_x)
    if left_out:
        total = len(unfinished) + len({p.parent for top in args.dirs for p in Path(top).rglob("summary.json")})
        print(skipped_report(left_out, total), file=sys.stderr)
    dropped = {d for d, _ in left_out}
    if not metric:  # validation accuracy, or R² for a regression
        probe = [r for r in load_runs(args.dirs, "val/acc") if r.run_dir not in dropped]
        metric = "val/r2" if probe and all(not r.rows and "val/r2" in r.summary for r in probe) else "val/acc"
    runs = [r for r in load_runs(args.dirs, metric) if r.run_dir not in dropped]
    groups = group_runs(runs, metric, cost_x)
    if not groups:
        parser.exit(
            1,
            f"No finished run under {', '.join(args.dirs)} has {metric!r} ({metric_words(metric)}); "
            "point at run or multirun folders, and check --y.\n",
        )
    axes = list(groups[0].axes)
    hue = args.hue or (preset.hue if preset and preset.hue in axes else None)
    for option, key in (("--hue", hue), ("--style", args.style), ("--x", None if x in X_AXES else x)):
        if key and key not in axes:
            parser.exit(
                1, f"{option} {key}: not a sweep axis of these runs; choose one of {', '.join(axes) or '(none)'}.\n"
            )
    if x not in X_AXES and not all(_sort_value(g.axes[x])[0] == 0 for g in groups):
        parser.exit(1, f"--x {x}: its values are not all numbers; use it as --hue instead.\n")
    drawn = groups if x in X_AXES else over_axis(groups, x)
    title = args.title or (preset.title if preset else "")
    fig = draw(drawn, x=x, metric=metric, hue=hue, style=args.style, title=title)
    written = save_figure(fig, args.output)
    curves = groups
    if not metric.startswith("val/"):  # the table's target is read on the validation curve
        curve_metric = "val/" + metric.split("/", 1)[-1]
        curve_runs = [r for r in load_runs(args.dirs, curve_metric) if r.run_dir not in dropped]
        curves = group_runs(curve_runs, curve_metric, cost_x)
    header, rows = table_rows(groups, metric=metric, x=cost_x, target=target, curves=curves)
    written += write_table(header, rows, Path(args.output).with_suffix(""))
    print(markdown(header, rows))
    print(f"\nwrote {', '.join(map(str, written))}")
    print(f"{len(groups)} groups of {sum(g.seeds for g in groups)} runs; each: mean ± sample std over its seeds.")
