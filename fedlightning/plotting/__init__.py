"""Figures and tables of fedlightning runs: sweeps (``fedlightning-plot``), one run's curve, client splits.

``fedlightning-plot DIR... -o FIG.png`` groups the finished runs under ``DIR`` by their sweep
axes (the command-line overrides whose values differ across the runs, compared on the resolved
config; ``data.root``, ``logger`` and the other keys of
:data:`fedlightning.sweeps.BOOKKEEPING_KEYS` never count) except ``seed``, so runs that differ only
by seed become one line: the mean over the seeds with a ± one sample standard deviation band. A
run present twice (the same config and seed under two folders) is counted once when both copies'
results agree, and refused, naming both folders, when they differ. The seeds of a group are
aligned by round (a round that not every seed evaluated is dropped); the bits of a point are the
seeds' mean (with a random compressor or entropy codes they may differ slightly).

* one panel per data set, each with its own Pareto frontier of the groups' final (bits or
  rounds, metric) points: runs of different data sets are never pooled or compared;
* ``--x uplink|total|rounds``: cumulative uplink bits, uplink + downlink bits, or rounds
  (bits on a log axis labelled at decades, or at 1-2-5 steps when the runs span less than two);
  or a numeric sweep axis (``--x method.compression``): each group's final metric over its
  values, a line per value of the other axes;
* ``--y "validation accuracy"``: the metric, in words or as a key (``val/acc``, ``test/loss``,
  ``val/acc_sampled_mean``); a validation metric is drawn as a curve (``bits_vs_accuracy.csv``,
  else the run's ``metrics.csv``), a test metric, evaluated once, as one point per group with
  an error bar at the group's final x;
* ``--hue KEY`` / ``--style KEY``: colour and line style by a sweep axis (``compressor``,
  ``method.compression``); legend entries name only the axes that vary within a panel;
* ``--target 0.9``: a labelled horizontal line, and the table's x at which a group's seed-mean
  validation curve first reaches the target ("not reached" when it never does).

The figure says in its caption what the lines and bands are, and, where seeds are pooled while
``partition.seed`` is not pinned, that each seed also drew its own client split (the bands then
mix split and initialisation variance). It is written as a 300 dpi PNG and a PDF (``FIG.png``,
``FIG.pdf``), a column wide per panel; the table as Markdown (``FIG_table.md``, ``mean ± std``)
and CSV (``FIG_table.csv``: numeric ``n``, ``mean`` and ``std`` columns). ``--preset`` fixes x,
y, hue and the table for a paper's figure (:data:`PRESETS`). The job folders that draw nothing
(failed, killed, or without evaluations) are listed on stderr with the reason of each.
"""

from __future__ import annotations

from fedlightning.plotting.cli import PRESETS, Preset, main
from fedlightning.plotting.curves import Curve, collect_curves, plot_curves, sweep_labels, unplotted_runs
from fedlightning.plotting.labels import plot_client_labels, plot_label_distribution
from fedlightning.plotting.runs import (
    POOLED,
    Group,
    RunData,
    first_reaching,
    group_runs,
    higher_is_better,
    load_runs,
    mean_std,
    over_axis,
    pareto_front,
    read_curve,
    read_runs,
    sweep_axes,
    unique_runs,
)
from fedlightning.plotting.style import (
    COLUMN_WIDTH,
    NAME_WORDS,
    PNG_DPI,
    SPLIT_WORDS,
    TEXT_WIDTH,
    X_AXES,
    bits_label,
    log_ticks,
    metric_key,
    metric_words,
    publication_style,
    readable_log_axis,
    save_figure,
    sentence,
)
from fedlightning.plotting.sweep import FRONTIER_LABEL, caption, draw, legend_label, varying_axes
from fedlightning.plotting.table import csv_rows, markdown, table, table_rows, write_table

__all__ = [
    "COLUMN_WIDTH",
    "FRONTIER_LABEL",
    "NAME_WORDS",
    "PNG_DPI",
    "POOLED",
    "PRESETS",
    "SPLIT_WORDS",
    "TEXT_WIDTH",
    "X_AXES",
    "Curve",
    "Group",
    "Preset",
    "RunData",
    "bits_label",
    "caption",
    "collect_curves",
    "csv_rows",
    "draw",
    "first_reaching",
    "group_runs",
    "higher_is_better",
    "legend_label",
    "load_runs",
    "log_ticks",
    "main",
    "markdown",
    "mean_std",
    "metric_key",
    "metric_words",
    "over_axis",
    "pareto_front",
    "plot_client_labels",
    "plot_curves",
    "plot_label_distribution",
    "publication_style",
    "read_curve",
    "read_runs",
    "readable_log_axis",
    "save_figure",
    "sentence",
    "sweep_axes",
    "sweep_labels",
    "table",
    "table_rows",
    "unique_runs",
    "unplotted_runs",
    "varying_axes",
    "write_table",
]
