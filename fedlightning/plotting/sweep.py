"""The figure of a sweep: seed-mean curves with ± one-std bands, a panel and a Pareto frontier per data set."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from fedlightning.plotting.runs import Group, higher_is_better, pareto_front, sort_value
from fedlightning.plotting.style import (
    COLUMN_WIDTH,
    X_AXES,
    metric_words,
    publication_style,
    readable_log_axis,
    sentence,
    x_label,
)
from fedlightning.sweeps import SPLIT_CAVEAT, split_follows_seed

_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: Height in inches of one panel.
PANEL_HEIGHT = 2.4
FRONTIER_LABEL = "Pareto frontier (final points)"


def _palette(values: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10" if len(values) <= 10 else "viridis")
    if len(values) <= 10:
        return {v: cmap(i) for i, v in enumerate(values)}
    return {v: cmap(i / max(len(values) - 1, 1)) for i, v in enumerate(values)}


def varying_axes(groups: Sequence[Group]) -> list[str]:
    """The axes whose values differ among ``groups`` (those that tell its lines apart).

    >>> a = Group(axes={"compressor": "qsgd", "rounds": "50"}, runs=[])
    >>> varying_axes([a, Group(axes={"compressor": "none", "rounds": "50"}, runs=[])])
    ['compressor']
    """
    keys = list(groups[0].axes) if groups else []
    return [k for k in keys if len({g.axes.get(k) for g in groups}) > 1]


def legend_label(group: Group, keys: Sequence[str], hue: str | None = None) -> str:
    """A line's legend entry: its values of the axes ``keys`` (only the value when the legend title names it).

    >>> g = Group(axes={"compressor": "qsgd", "rounds": "50"}, runs=[])
    >>> legend_label(g, ["compressor"], hue="compressor"), legend_label(g, ["compressor", "rounds"])
    ('qsgd (n=0)', 'compressor=qsgd rounds=50 (n=0)')
    """
    if hue and list(keys) == [hue]:
        name = group.axes[hue]
    else:
        name = " ".join(f"{k}={group.axes[k]}" for k in keys) or "all runs"
    return f"{name} (n={group.seeds})"


def caption(groups: Sequence[Group]) -> str:
    """What the lines and bands are, said in the figure; and that seeds redraw the split when they do."""
    pooled = [g for g in groups if g.seeds > 1]
    if not pooled:
        return "One run per line (n=1): no spread over seeds is drawn."
    text = "Lines: mean over the n seeds in the legend; " + (
        "bands: ±1 sample standard deviation." if any(g.x for g in pooled) else "bars: ±1 sample standard deviation."
    )
    if any(split_follows_seed(r.summary for r in g.runs) for g in pooled):
        text += f" Note: {sentence(SPLIT_CAVEAT)}."
    return text


def draw(
    groups: Sequence[Group],
    *,
    x: str = "uplink",
    metric: str = "val/acc",
    hue: str | None = None,
    style: str | None = None,
    title: str = "",
    target: float | None = None,
) -> Figure:
    """The figure of ``groups``: a panel per data set with seed-mean lines, ± std bands and its Pareto frontier.

    Legend entries name only the axes that vary within a panel; a ``target`` is drawn as a
    labelled horizontal line; the figure's caption says what the bands are (:func:`caption`).
    """
    datasets = sorted({g.data for g in groups})
    ncols = min(len(datasets), 2) or 1
    nrows = max(math.ceil(len(datasets) / ncols), 1)
    with publication_style():
        fig, axs = plt.subplots(
            nrows,
            ncols,
            figsize=(COLUMN_WIDTH * ncols, PANEL_HEIGHT * nrows + 0.6),
            layout="constrained",
            squeeze=False,
        )
        hue_of = (lambda g: g.axes.get(hue, "(default)")) if hue else None
        labels = {}
        for data in datasets:
            panel = [g for g in groups if g.data == data]
            keys = varying_axes(panel)
            for g in panel:
                labels[g.key] = legend_label(g, keys, hue)
        colour_keys = (
            sorted({hue_of(g) for g in groups}, key=sort_value) if hue_of else list(dict.fromkeys(labels.values()))
        )
        colours = _palette(colour_keys)
        styles = sorted({g.axes.get(style, "(default)") for g in groups}, key=sort_value) if style else [""]
        handles: dict[str, Any] = {}  # legend entry -> its line, error bars or frontier
        for i, ax in enumerate(axs.flat):
            if i >= len(datasets):
                ax.set_visible(False)
                continue
            panel = [g for g in groups if g.data == datasets[i]]
            for g in panel:
                k = styles.index(g.axes.get(style, "(default)")) if style else 0
                colour = colours[hue_of(g) if hue_of else labels[g.key]]
                artist = _draw_group(ax, g, label=labels[g.key], colour=colour, k=k, x=x)
                handles.setdefault(labels[g.key], artist)
            front = _draw_frontier(ax, panel, x=x, metric=metric)
            if front is not None:
                handles.setdefault(FRONTIER_LABEL, front)
            if target is not None:
                curve_metric = "val/" + metric.split("/", 1)[-1]
                line = ax.axhline(target, color="0.3", linestyle=":", linewidth=1)
                handles.setdefault(f"Target: {metric_words(curve_metric)} {target:g}", line)
            _axes_scales(ax, panel, x=x)
            ax.set_xlabel(x_label(x))
            ax.set_ylabel(sentence(metric_words(metric)))
            ax.grid(True, which="major", alpha=0.3)
            if len(datasets) > 1 or (datasets[i] and not title):
                ax.set_title(_panel_title(datasets[i], panel, width_chars=_chars(COLUMN_WIDTH)))
        width = COLUMN_WIDTH * ncols
        if title:
            fig.suptitle(textwrap.fill(title, _chars(width)))
        bottom = 0.0  # figure coordinates: the legend and the caption hang below the panels
        if handles:
            legend_cols = 2 if max(len(k) for k in handles) <= _chars(width / 2 - 0.4) else 1
            names = [textwrap.fill(k, _chars(width / legend_cols - 0.4)) for k in handles]
            legend_title = " / ".join(k for k in (hue, style) if k) or None
            legend = fig.legend(
                list(handles.values()), names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=legend_cols,
                title=legend_title, frameon=False,
            )  # fmt: skip
            fig.canvas.draw()  # lays the panels out and measures the legend
            bottom = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
        fig.text(0.5, bottom, textwrap.fill(caption(groups), _chars(width)), ha="center", va="top", fontsize=7)
    return fig


def _panel_title(data: str, panel: Sequence[Group], *, width_chars: int) -> str:
    """A panel's data set, and the axes that differ across the figure but not within the panel."""
    fixed = [k for k in panel[0].axes if k != "data" and k not in varying_axes(panel)]
    text = ", ".join([data or "(data set not recorded)", *(f"{k}={panel[0].axes[k]}" for k in fixed)])
    return textwrap.fill(text, width_chars)


def _chars(inches: float) -> int:
    """How many characters of 7 pt text fit in ``inches`` (wrapped legend entries and captions keep the width)."""
    return max(int(inches * 16), 12)


def _draw_group(ax: Axes, g: Group, *, label: str, colour: Any, k: int, x: str) -> Artist | ErrorbarContainer:
    linestyle, marker = _STYLES[k % len(_STYLES)], _MARKERS[k % len(_MARKERS)]
    log_x = _log_x(x, [g])
    if g.x:
        keep = [i for i, v in enumerate(g.x) if v > 0 or not log_x]
        xs = [g.x[i] for i in keep]
        mean = [g.mean[i] for i in keep]
        std = [g.std[i] for i in keep]
        (line,) = ax.plot(xs, mean, color=colour, linestyle=linestyle, marker=marker, label=label)
        if g.seeds > 1:
            lower = [m - s for m, s in zip(mean, std, strict=True)]
            upper = [m + s for m, s in zip(mean, std, strict=True)]
            ax.fill_between(xs, lower, upper, color=colour, alpha=0.2, linewidth=0)
        return line
    bars = ax.errorbar(
        [g.final_x], [g.final_mean], yerr=[g.final_std], color=colour, marker=marker, capsize=3, linestyle="none",
        label=label,
    )  # fmt: skip
    return bars


def _log_x(x: str, groups: Sequence[Group]) -> bool:
    if x == "rounds":
        return False
    if x in X_AXES:
        return True
    values = [v for g in groups for v in (g.x or [g.final_x])]
    return min(values, default=0) > 0 and max(values) >= 10 * min(values)


def _draw_frontier(ax: Axes, panel: Sequence[Group], *, x: str, metric: str) -> Artist | None:
    """The Pareto frontier of one data set's final (bits or rounds, metric) points; none over a sweep axis."""
    if x not in X_AXES:
        return None
    finals = [(g.final_x, g.final_mean) for g in panel]
    log_x = _log_x(x, panel)
    front = [i for i in pareto_front(finals, maximise=higher_is_better(metric)) if finals[i][0] > 0 or not log_x]
    if not front:
        return None
    fx, fy = zip(*(finals[i] for i in front), strict=True)
    (line,) = ax.plot(
        fx, fy, color="black", linestyle=(0, (4, 2)), linewidth=1, marker="*", markersize=8, markerfacecolor="none",
        label=FRONTIER_LABEL, zorder=5,
    )  # fmt: skip
    return line


def _axes_scales(ax: Axes, panel: Sequence[Group], *, x: str) -> None:
    if not _log_x(x, panel):
        return
    xs_all = [v for g in panel for v in (g.x or [g.final_x]) if v > 0]
    if xs_all and x in X_AXES:
        readable_log_axis(ax, min(xs_all), max(xs_all))
    elif xs_all:  # a sweep axis such as m/n: label its own values
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs_all))))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
