"""Sweep tables: summaries of a multirun pivoted over two axes (fedlightning-table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedlightning.sweeps import collect_runs, main, markdown_table, pivot


def _write(run_dir: Path, overrides: list[str], **metrics: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"seed": 0, "overrides": overrides, "config": {}, **metrics}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    grid = [("1", "8", "0", 0.80), ("1", "8", "1", 0.84), ("10", "8", "0", 0.90), ("10", "32", "0", 0.70)]
    for i, (d, c, seed, acc) in enumerate(grid):
        overrides = ["+experiment=x", f"method.d={d}", f"method.compression={c}", f"seed={seed}"]
        _write(tmp_path / str(i), overrides, acc=acc)
    _write(tmp_path / "other", ["+experiment=x"], acc=0.1)  # no sweep axes: left out of the table
    return tmp_path


def test_collect_and_pivot_group_by_the_overrides(sweep: Path) -> None:
    runs = collect_runs([sweep])
    assert len(runs) == 5 and {r["experiment"] for r in runs} == {"x"}
    cells = pivot(runs, rows="method.d", cols="method.compression", value="acc")
    assert cells == {("1", "8"): [0.80, 0.84], ("10", "8"): [0.90], ("10", "32"): [0.70]}


def test_markdown_table_sorts_numerically_and_reports_mean_std_and_counts(sweep: Path) -> None:
    cells = pivot(collect_runs([sweep]), rows="method.d", cols="method.compression", value="acc")
    table = markdown_table(cells, rows="method.d", cols="method.compression", digits=3)
    # 0.82 ± 0.028 = mean and sample std of (0.80, 0.84); counts shown because they differ by cell
    assert table.splitlines() == [
        "| method.d \\ method.compression | 8 | 32 |",
        "|---|---|---|",
        "| 1 | 0.820 ± 0.028 (n=2) | – |",
        "| 10 | 0.900 (n=1) | 0.700 (n=1) |",
    ]


def test_cli_prints_the_table_and_fails_clearly_on_unknown_keys(sweep: Path, capsys: pytest.CaptureFixture) -> None:
    main([str(sweep), "--rows", "method.d", "--cols", "seed", "--value", "acc", "--digits", "2"])
    out = capsys.readouterr().out
    assert "| method.d \\ seed | 0 | 1 |" in out and "| 1 | 0.80 (n=1) | 0.84 (n=1) |" in out
    assert "| 10 | 0.80 ± 0.14 (n=2) | – |" in out  # d = 10 pools m/n = 8 and 32 (0.9, 0.7) by seed
    with pytest.raises(SystemExit) as stop:
        main([str(sweep), "--rows", "method.dd", "--cols", "seed"])
    assert stop.value.code == 1
    assert "'method.dd'" in capsys.readouterr().err


AXES = ["--rows", "method.d", "--cols", "method.compression", "--value", "acc"]


def test_table_counts_a_run_present_in_two_sweeps_once(
    sweep: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture
) -> None:
    import shutil

    again = tmp_path_factory.mktemp("again")
    shutil.copytree(sweep / "0", again / "0")  # d=1, m/n=8, seed 0 ran a second time
    main([str(sweep), str(again), *AXES])
    captured = capsys.readouterr()
    assert "| 1 | 0.8200 ± 0.0283 (n=2) | – |" in captured.out  # seeds 0 and 1 once each, not n=3
    assert f"{again / '0'} repeats {sweep / '0'}" in captured.err
    assert "(1 repeated runs counted once)" in captured.out


def test_table_refuses_two_copies_of_a_run_with_different_results(
    sweep: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture
) -> None:
    again = tmp_path_factory.mktemp("again")
    _write(again / "0", ["+experiment=x", "method.d=1", "method.compression=8", "seed=0"], acc=0.5)
    with pytest.raises(SystemExit) as stop:
        main([str(sweep), str(again), *AXES])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert f"{sweep / '0'} and {again / '0'} are the same config and seed with different results" in err
    assert "acc: 0.8 vs 0.5" in err
