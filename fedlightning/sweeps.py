"""Tables of a Hydra multirun: one metric of ``summary.json``, pivoted over two sweep axes.

``fedlightning-table DIR --rows method.d --cols method.compression --value test/acc_sampled_mean``
reads every ``summary.json`` under ``DIR``, takes each axis from the run's command-line
overrides (``method.d=10``) or, failing that, from the summary itself (``seed``), and prints
a Markdown table whose cells are the mean ± standard deviation over the runs that share a
row and a column (typically the seeds), with the number of runs when they differ. The job
folders left out of the table (failed, killed, or lacking an axis or the value) are listed on
stderr with the reason of each.

A run present twice (the same config and seed under two of the folders, e.g. two sweeps over the
same seeds) is counted once when the two copies' results agree, and said so on stderr; when they
differ the command refuses, naming both folders (:func:`deduplicate_runs`): a mean and standard
deviation over a repeated seed would count it twice.

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
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fedlightning.errors import FedLightningError
from fedlightning.jobs import failed_or_unfinished, skipped_report

__all__ = [
    "BOOKKEEPING_KEYS",
    "DuplicateRunError",
    "collect_runs",
    "deduplicate_runs",
    "is_bookkeeping",
    "markdown_table",
    "override_values",
    "pivot",
    "result_values",
    "run_identity",
    "split_follows_seed",
    "unique_runs",
]

Cells = dict[tuple[str, str], list[float]]
R = TypeVar("R")

#: Config keys that say where or how a run was recorded, not what it computed: they neither
#: separate the groups of a sweep nor make two runs of one (config, seed) different.
BOOKKEEPING_KEYS = (
    "data.root",
    "logger",
    "hydra",
    "print_config",
    "threads",
    "ckpt_path",
    "checkpoint_every",
    "save_partition",
    "client_state_memory_mb",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
)
#: Summary keys that record how a run was executed, not what it computed (left out when two copies are compared).
NOT_RESULTS = ("config", "overrides", "status", "processes", "torch_threads", "resumed_from_round", "data_notice")


class DuplicateRunError(FedLightningError, ValueError):
    """The same (config, seed) ran twice with different results; the message names both folders."""


def is_bookkeeping(key: str) -> bool:
    """Whether the config key ``key`` (or a key under it) only records where or how a run was kept.

    >>> is_bookkeeping("data.root"), is_bookkeeping("logger.wandb.project"), is_bookkeeping("data.num_clients")
    (True, True, False)
    """
    return any(key == k or key.startswith(k + ".") for k in BOOKKEEPING_KEYS)


def override_values(overrides: Iterable[str] | None) -> dict[str, str]:
    """``key=value`` command-line overrides as a mapping (``+``, ``++`` and ``~`` prefixes dropped).

    >>> override_values(["+experiment=x", "seed=1", "method.d=10"])
    {'experiment': 'x', 'seed': '1', 'method.d': '10'}
    """
    values = {}
    for override in overrides or []:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep:
            values[key] = value
    return values


def _without_bookkeeping(node: Any, prefix: str = "") -> Any:
    if not isinstance(node, Mapping):
        return node
    return {k: _without_bookkeeping(v, f"{prefix}{k}.") for k, v in node.items() if not is_bookkeeping(f"{prefix}{k}")}


def run_identity(summary: Mapping[str, Any]) -> str:
    """The (config, seed) that a run's ``summary.json`` records, as a canonical string.

    Two runs with equal identities computed the same thing: their resolved configs, their
    overrides and their seeds agree, the keys of :data:`BOOKKEEPING_KEYS` (where the data and
    the logs live) left aside.

    >>> a = {"seed": 1, "overrides": ["seed=1", "data.root=/a"], "config": {"seed": 1, "data": {"root": "/a"}}}
    >>> b = {"seed": 1, "overrides": ["data.root=/b", "seed=1"], "config": {"seed": 1, "data": {"root": "/b"}}}
    >>> run_identity(a) == run_identity(b), run_identity(a) == run_identity({**a, "seed": 2})
    (True, False)
    """
    overrides = {k: v for k, v in override_values(summary.get("overrides")).items() if not is_bookkeeping(k)}
    identity = {
        "config": _without_bookkeeping(summary.get("config") or {}),
        "overrides": overrides,
        "seed": summary.get("seed"),
        "data": summary.get("data"),
    }
    return json.dumps(identity, sort_keys=True, default=str)


def result_values(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A summary's results, to compare two copies of one run: every key but timings and :data:`NOT_RESULTS`.

    >>> result_values({"val/acc": 0.5, "time/wall_s": 3.0, "rounds": 10, "processes": 2, "acc": 0.4})
    {'val/acc': 0.5, 'rounds': 10, 'acc': 0.4}
    """
    return {k: v for k, v in summary.items() if k not in NOT_RESULTS and not k.startswith("time/")}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            return f"{key} only in {'the first' if key in a else 'the second'}"
        if not _same(a[key], b[key]):
            return f"{key}: {a[key]!r} vs {b[key]!r}"
    return None


def deduplicate_runs(
    runs: Sequence[R],
    *,
    identity: Callable[[R], str],
    results: Callable[[R], Mapping[str, Any]],
    folder: Callable[[R], str],
) -> tuple[list[R], list[str]]:
    """Keep one run of each (config, seed): the first copy, when every copy's results agree.

    Returns the kept runs (in their order) and one sentence per run left out as a copy. A run
    counted twice would enter a seed mean twice and shrink its standard deviation.

    Raises:
        DuplicateRunError: two copies of one (config, seed) whose results differ, naming both folders.

    Example:
        >>> runs = [("a/0", "s0", 0.5), ("a/1", "s1", 0.7), ("b/0", "s0", 0.5)]
        >>> kept, notes = deduplicate_runs(runs, identity=lambda r: r[1], results=lambda r: {"acc": r[2]},
        ...                                folder=lambda r: r[0])
        >>> [r[0] for r in kept], notes
        (['a/0', 'a/1'], ['b/0 repeats a/0 (same config and seed, same results): counted once'])
    """
    first: dict[str, R] = {}
    kept: list[R] = []
    notes: list[str] = []
    for run in runs:
        key = identity(run)
        if key not in first:
            first[key] = run
            kept.append(run)
            continue
        original = first[key]
        difference = _first_difference(results(original), results(run))
        if difference is not None:
            raise DuplicateRunError(
                f"{folder(original)} and {folder(run)} are the same config and seed with different results "
                f"({difference}); a statistic over both would count that seed twice: pass the folders of only "
                "one of them."
            )
        notes.append(f"{folder(run)} repeats {folder(original)} (same config and seed, same results): counted once")
    return kept, notes


#: Said wherever seeds are pooled while the client split follows the seed.
SPLIT_CAVEAT = (
    "the seed also draws the client split (partition.seed not pinned): the spread over seeds mixes "
    "split and initialisation variance"
)


def split_follows_seed(summaries: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``summaries`` span several seeds and some run drew its client split from its seed.

    A run's partitioner takes the run's ``seed`` unless ``partition.seed`` pins it
    (``fedlightning.datamodules.partition``); a summary without the resolved config counts as unpinned.

    >>> pinned = {"config": {"partition": {"seed": 0}}}
    >>> split_follows_seed([{**pinned, "seed": 0}, {**pinned, "seed": 1}])
    False
    >>> split_follows_seed([{"seed": 0, "config": {"partition": {"seed": None}}}, {"seed": 1}])
    True
    """
    seeds, unpinned = set(), False
    for summary in summaries:
        seeds.add(summary.get("seed", override_values(summary.get("overrides")).get("seed")))
        partition = (summary.get("config") or {}).get("partition")
        unpinned |= not isinstance(partition, Mapping) or partition.get("seed") is None
    return len(seeds) > 1 and unpinned


def _read_summaries(dirs: Sequence[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path.parent, json.loads(path.read_text())) for top in dirs for path in sorted(Path(top).rglob("summary.json"))
    ]


def _record(run_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    record = {k: v for k, v in summary.items() if k not in ("config", "overrides")}
    record.update(override_values(summary.get("overrides")))
    record["run_dir"] = str(run_dir)
    return record


def collect_runs(dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One flat record per ``summary.json`` under ``dirs``: its keys plus its overrides (``key=value``).

    Every ``summary.json`` gives a record, repeated runs included: :func:`unique_runs` keeps one per
    (config, seed).
    """
    return [_record(run_dir, summary) for run_dir, summary in _read_summaries(dirs)]


def unique_runs(dirs: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`collect_runs` with each (config, seed) once (:func:`deduplicate_runs`), and the notes of the copies."""
    kept, notes = deduplicate_runs(
        _read_summaries(dirs),
        identity=lambda item: run_identity(item[1]),
        results=lambda item: result_values(item[1]),
        folder=lambda item: str(item[0]),
    )
    return [_record(run_dir, summary) for run_dir, summary in kept], notes


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
    try:
        runs, repeated = unique_runs(args.dirs)
    except DuplicateRunError as exc:
        parser.exit(1, f"{exc}\n")
    for note in repeated:
        print(note, file=sys.stderr)
    cells = pivot(runs, rows=args.rows, cols=args.cols, value=args.value)
    unfinished = failed_or_unfinished(args.dirs)
    left_out = unfinished + [
        (str(run["run_dir"]), reason)
        for run in runs
        if (reason := why_left_out(run, rows=args.rows, cols=args.cols, value=args.value))
    ]
    if left_out:
        print(skipped_report(left_out, len(runs) + len(unfinished)), file=sys.stderr)
    pooled = "seed" not in (args.rows, args.cols)
    used_dirs = {
        str(r["run_dir"]) for r in runs if why_left_out(r, rows=args.rows, cols=args.cols, value=args.value) is None
    }
    if pooled and split_follows_seed(json.loads(Path(d, "summary.json").read_text()) for d in used_dirs):
        print(f"note: {SPLIT_CAVEAT}.", file=sys.stderr)
    if not cells:
        parser.exit(
            1,
            f"No summary.json under {', '.join(args.dirs)} has {args.rows!r}, {args.cols!r} and a numeric "
            f"{args.value!r}; check the folder and the key names (summary keys or override names).\n",
        )
    used = sum(len(v) for v in cells.values())
    print(markdown_table(cells, rows=args.rows, cols=args.cols, digits=args.digits))
    repeats = f" ({len(repeated)} repeated runs counted once)" if repeated else ""
    print(
        f"\n{used} of {len(runs)} runs{repeats}; each cell: mean ± sample std over the runs sharing its row and column."
    )
