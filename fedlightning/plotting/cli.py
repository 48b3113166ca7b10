"""``fedlightning-plot``: the figure (PNG and PDF) and table (Markdown and CSV) of a sweep."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlightning.jobs import failed_or_unfinished, skipped_report
from fedlightning.plotting.curves import unplotted_runs
from fedlightning.plotting.runs import RunData, group_runs, over_axis, read_runs, sort_value, unique_runs
from fedlightning.plotting.style import X_AXES, metric_key, metric_words, save_figure
from fedlightning.plotting.sweep import draw
from fedlightning.plotting.table import csv_rows, markdown, table_rows, write_table
from fedlightning.sweeps import SPLIT_CAVEAT, DuplicateRunError, split_follows_seed


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


def _runs(parser: argparse.ArgumentParser, dirs: Sequence[str], metric: str, dropped: set[str]) -> list[RunData]:
    try:
        runs, _ = unique_runs([r for r in read_runs(dirs, metric) if r.run_dir not in dropped])
    except DuplicateRunError as exc:
        parser.exit(1, f"{exc}\n")
    return runs


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
    parser.add_argument(
        "--target", type=float, default=None, help="drawn as a line; table: x at which the validation curve reaches it"
    )
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
        probe = [r for r in read_runs(args.dirs, "val/acc") if r.run_dir not in dropped]
        metric = "val/r2" if probe and all(not r.rows and "val/r2" in r.summary for r in probe) else "val/acc"
    try:
        runs, repeated = unique_runs([r for r in read_runs(args.dirs, metric) if r.run_dir not in dropped])
    except DuplicateRunError as exc:
        parser.exit(1, f"{exc}\n")
    for note in repeated:
        print(note, file=sys.stderr)
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
    if x not in X_AXES and not all(sort_value(g.axes[x])[0] == 0 for g in groups):
        parser.exit(1, f"--x {x}: its values are not all numbers; use it as --hue instead.\n")
    drawn = groups if x in X_AXES else over_axis(groups, x)
    title = args.title or (preset.title if preset else "")
    fig = draw(drawn, x=x, metric=metric, hue=hue, style=args.style, title=title, target=target)
    written = save_figure(fig, args.output)
    curves = groups
    if not metric.startswith("val/"):  # the table's target is read on the validation curve
        curve_metric = "val/" + metric.split("/", 1)[-1]
        curves = group_runs(_runs(parser, args.dirs, curve_metric, dropped), curve_metric, cost_x)
    md = table_rows(groups, metric=metric, x=cost_x, target=target, curves=curves)
    numeric = csv_rows(groups, metric=metric, x=cost_x, target=target, curves=curves)
    written += write_table(md, numeric, Path(args.output).with_suffix(""))
    print(markdown(*md))
    print(f"\nwrote {', '.join(map(str, written))}")
    datasets = len({g.data for g in groups})
    print(
        f"{len(groups)} groups of {sum(g.seeds for g in groups)} runs"
        + (f" over {datasets} data sets (a panel and a Pareto frontier each)" if datasets > 1 else "")
        + (f" ({len(repeated)} repeated runs counted once)" if repeated else "")
        + "; each: mean ± sample std over its seeds."
    )
    if any(g.seeds > 1 and split_follows_seed(r.summary for r in g.runs) for g in groups):
        print(f"note: {SPLIT_CAVEAT}.", file=sys.stderr)
