"""The per-group table of a sweep: Markdown for reading, CSV with numeric columns for analysis."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlightning.plotting.runs import Group, first_reaching, higher_is_better
from fedlightning.plotting.style import X_AXES, metric_words


@dataclass(frozen=True)
class TableRow:
    """One group's line: its axes, seed count, final metric (mean, sample std), final x, x to the target."""

    data: str
    axes: dict[str, str]
    n: int
    mean: float
    std: float | None  # None for a single seed: no sample std
    final_x: float
    to_target: float | None  # None: not reached (or no target)


def _x_words(x: str) -> str:
    return X_AXES[x][1].lower().replace("uplink + downlink bits", "bits (uplink + downlink)")


def table(
    groups: Sequence[Group],
    *,
    metric: str,
    target: float | None = None,
    curves: Sequence[Group] | None = None,
) -> list[TableRow]:
    """The table's rows; ``target`` is read on ``curves``, the groups' validation curves (the same groups for a
    validation ``metric``)."""
    curves_by = {g.key: g for g in (curves if curves is not None else groups)}
    curve_metric = metric if metric.startswith("val/") else "val/" + metric.split("/", 1)[-1]
    rows = []
    for g in groups:
        reached = None
        curve = curves_by.get(g.key)
        if target is not None and curve is not None:
            reached = first_reaching(curve.x, curve.mean, target, maximise=higher_is_better(curve_metric))
        std = g.final_std if g.seeds > 1 else None
        rows.append(TableRow(g.data, dict(g.axes), g.seeds, g.final_mean, std, g.final_x, reached))
    return rows


def _header(
    rows: Sequence[TableRow], *, metric: str, x: str, target: float | None
) -> tuple[bool, list[str], list[str]]:
    """Whether a data-set column is needed, the axis columns, and the x / target column names."""
    axes = list(rows[0].axes) if rows else []
    with_data = len({r.data for r in rows}) > 1 and "data" not in axes
    curve_metric = metric if metric.startswith("val/") else "val/" + metric.split("/", 1)[-1]
    tail = [f"final {_x_words(x)}"]
    if target is not None:
        tail.append(f"{_x_words(x)} to {metric_words(curve_metric)} {target:g}")
    return with_data, axes, tail


def table_rows(
    groups: Sequence[Group],
    *,
    metric: str,
    x: str,
    target: float | None = None,
    curves: Sequence[Group] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Header and text rows of the Markdown table: final metric as ``mean ± std``, final x, x to ``target``."""
    rows = table(groups, metric=metric, target=target, curves=curves)
    with_data, axes, tail = _header(rows, metric=metric, x=x, target=target)
    header = [*(["data"] if with_data else []), *axes, "seeds", f"final {metric_words(metric)}", *tail]
    out = []
    for r in rows:
        final = f"{r.mean:.4f}" + (f" ± {r.std:.4f}" if r.std is not None else "")
        line = [*([r.data] if with_data else []), *r.axes.values(), str(r.n), final, _number(r.final_x)]
        if target is not None:
            line.append(_number(r.to_target) if r.to_target is not None else "not reached")
        out.append(line)
    return header, out


def csv_rows(
    groups: Sequence[Group],
    *,
    metric: str,
    x: str,
    target: float | None = None,
    curves: Sequence[Group] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the CSV table: ``n``, ``mean`` and ``std`` as numbers in their own columns.

    ``std`` is empty for a single seed, the x to the target empty where it is not reached; ``metric``
    names the metric the mean and std are of.
    """
    rows = table(groups, metric=metric, target=target, curves=curves)
    with_data, axes, tail = _header(rows, metric=metric, x=x, target=target)
    header = [*(["data"] if with_data else []), *axes, "metric", "n", "mean", "std", *tail]
    out = []
    for r in rows:
        line = [*([r.data] if with_data else []), *r.axes.values(), metric, str(r.n), repr(r.mean)]
        line += [_exact(r.std), _exact(r.final_x)]
        if target is not None:
            line.append(_exact(r.to_target))
        out.append(line)
    return header, out


def _exact(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else repr(float(value))


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


def write_table(
    md: tuple[Sequence[str], Sequence[Sequence[str]]],
    numeric: tuple[Sequence[str], Sequence[Sequence[str]]],
    stem: str | Path,
) -> list[Path]:
    """Write ``<stem>_table.md`` (the text table ``md``) and ``<stem>_table.csv`` (the ``numeric`` one)."""
    stem = Path(stem)
    md_path, csv_path = Path(f"{stem}_table.md"), Path(f"{stem}_table.csv")
    md_path.write_text(markdown(*md) + "\n")
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(numeric[0])
        writer.writerows(numeric[1])
    return [md_path, csv_path]
