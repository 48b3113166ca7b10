"""Tables of a Hydra multirun: one metric of ``summary.json``, pivoted over two sweep axes.

``fedlightning-table DIR --rows method.d --cols method.compression --value test/acc_sampled_mean``
reads every ``summary.json`` under ``DIR``, takes each axis from the run's command-line
overrides (``method.d=10``) or, failing that, from the summary itself (``seed``), and prints
a Markdown table whose cells are the mean ± standard deviation over the runs that share a
row and a column (typically the seeds), with the number of runs when they differ. The job
folders left out of the table (failed, killed, or lacking an axis or the value) are listed on
stderr with the reason of each.

Example:
    >>> runs = [{"d": "1", "c": "8", "acc": 0.5}, {"d": "1", "c": "8", "acc": 0.7}, {"d": "10", "c": "8", "acc": 0.9}]
    >>> cells = pivot(runs, rows="d", cols="c", value="acc")
    >>> cells[("1", "8")]
    [0.5, 0.7]
    >>> print(markdown_table(cells, rows="d", cols="c", digits=2))
    | d \\ c | 8 |
    |---|---|
    | 1 | 0.60 ± 0.14 (n=2) |
    | 10 | 0.90 (n=1) |
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedlightning.jobs import failed_or_unfinished, skipped_report

__all__ = ["collect_runs", "markdown_table", "pivot"]

Cells = dict[tuple[str, str], list[float]]


def collect_runs(dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One flat record per ``summary.json`` under ``dirs``: its keys plus its overrides (``key=value``)."""
    runs = []
    for top in dirs:
        for path in sorted(Path(top).rglob("summary.json")):
            summary = json.loads(path.read_text())
            record = {k: v for k, v in summary.items() if k not in ("config", "overrides")}
            for override in summary.get("overrides") or []:
                key, sep, value = override.lstrip("+~").partition("=")
                if sep:
                    record[key] = value
            record["run_dir"] = str(path.parent)
            runs.append(record)
    return runs


def _sort_key(label: str) -> tuple[int, float | str]:
    try:
        return (0, float(label))
    except ValueError:
        return (1, label)


def pivot(runs: Iterable[dict[str, Any]], *, rows: str, cols: str, value: str) -> Cells:
    """(row, column) → the values of ``value`` of the runs in that cell (runs lacking a key are skipped)."""
    cells: Cells = {}
    for run in runs:
        if rows in run and cols in run and isinstance(run.get(value), int | float):
            cells.setdefault((str(run[rows]), str(run[cols])), []).append(float(run[value]))
    return cells


def why_left_out(run: dict[str, Any], *, rows: str, cols: str, value: str) -> str | None:
    """Why :func:`pivot` leaves ``run`` out of the table, or None when it is in.

    >>> why_left_out({"seed": 0, "acc": None}, rows="seed", cols="method.d", value="acc")
    "lacks 'method.d' and has no numeric 'acc' (None)"
    """
    reasons = []
    missing = [key for key in (rows, cols) if key not in run]
    if missing:
        reasons.append("lacks " + " and ".join(repr(key) for key in missing))
    if not isinstance(run.get(value), int | float):
        reasons.append(f"has no numeric {value!r} ({run.get(value)!r})")
    return " and ".join(reasons) or None


def _cell(values: list[float], digits: int, counts_differ: bool) -> str:
    if not values:
        return "–"
    text = f"{statistics.fmean(values):.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):.{digits}f}"
    if counts_differ:
        text += f" (n={len(values)})"
    return text


def markdown_table(cells: Cells, *, rows: str, cols: str, digits: int = 4) -> str:
    """A Markdown table of mean ± sample std per cell; "–" where no run finished."""
    row_labels = sorted({r for r, _ in cells}, key=_sort_key)
    col_labels = sorted({c for _, c in cells}, key=_sort_key)
    counts_differ = len({len(v) for v in cells.values()}) > 1
    lines = [f"| {rows} \\ {cols} | " + " | ".join(col_labels) + " |", "|---" * (len(col_labels) + 1) + "|"]
    for r in row_labels:
        row = [_cell(cells.get((r, c), []), digits, counts_differ) for c in col_labels]
        lines.append(f"| {r} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``fedlightning-table DIR... --rows KEY --cols KEY --value METRIC``."""
    parser = argparse.ArgumentParser(description="Pivot one summary.json metric of a sweep over two of its axes.")
    parser.add_argument("dirs", nargs="+", help="multirun or run folders")
    parser.add_argument("--rows", required=True, help="axis of the rows, e.g. method.d")
    parser.add_argument("--cols", required=True, help="axis of the columns, e.g. method.compression")
    parser.add_argument("--value", default="test/acc", help="summary.json metric, e.g. test/acc_sampled_mean")
    parser.add_argument("--digits", type=int, default=4)
    args = parser.parse_args(argv)
    runs = collect_runs(args.dirs)
    cells = pivot(runs, rows=args.rows, cols=args.cols, value=args.value)
    unfinished = failed_or_unfinished(args.dirs)
    left_out = unfinished + [
        (str(run["run_dir"]), reason)
        for run in runs
        if (reason := why_left_out(run, rows=args.rows, cols=args.cols, value=args.value))
    ]
    if left_out:
        print(skipped_report(left_out, len(runs) + len(unfinished)), file=sys.stderr)
    if not cells:
        parser.exit(
            1,
            f"No summary.json under {', '.join(args.dirs)} has {args.rows!r}, {args.cols!r} and a numeric "
            f"{args.value!r}; check the folder and the key names (summary keys or override names).\n",
        )
    used = sum(len(v) for v in cells.values())
    print(markdown_table(cells, rows=args.rows, cols=args.cols, digits=args.digits))
    print(f"\n{used} of {len(runs)} runs; each cell: mean ± sample std over the runs sharing its row and column.")
