"""Failed jobs stay on record: status and error files, tables and plots that list them, W&B state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from omegaconf import DictConfig

from fedlightning.errors import ConfigError
from fedlightning.jobs import error_sentence, failed_or_unfinished, read_status, record_failure, record_success
from fedlightning.plotting import collect_curves
from fedlightning.plotting import main as plot_main
from fedlightning.run import run
from fedlightning.sweeps import main as table_main


def _completed(folder: Path, overrides: list[str], acc: float, bits: list[int]) -> None:
    folder.mkdir(parents=True)
    summary = {"status": "completed", "overrides": overrides, "config": {}, "test/acc": acc}
    (folder / "summary.json").write_text(json.dumps(summary))
    record_success(folder, overrides=overrides)
    rows = "".join(f"{b},{acc}\n" for b in bits)
    (folder / "bits_vs_accuracy.csv").write_text("comm/uplink_bits_total,val/acc\n" + rows)


def _failed(folder: Path, overrides: list[str], message: str) -> None:
    try:
        raise ConfigError(message)
    except ConfigError as exc:
        record_failure(folder, exc, overrides=overrides, log_file="cli.log")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    _completed(tmp_path / "0", ["seed=0", "method.lr=0.1"], 0.8, [100, 200])
    _completed(tmp_path / "1", ["seed=1", "method.lr=0.1"], 0.9, [0])  # no point with bits > 0
    _failed(tmp_path / "2", ["seed=2", "method.lr=-1"], "method.lr must be positive (got -1).")
    # The failed job had evaluated once before it stopped: its partial curve is no result.
    (tmp_path / "2" / "bits_vs_accuracy.csv").write_text("comm/uplink_bits_total,val/acc\n100,0.5\n")
    (tmp_path / "3" / ".hydra").mkdir(parents=True)  # killed before it wrote anything
    return tmp_path


def test_record_failure_writes_the_sentence_the_traceback_and_the_status(sweep: Path) -> None:
    error = (sweep / "2" / "error.txt").read_text()
    assert error.startswith("method.lr must be positive (got -1).\n\nTraceback (most recent call last)")
    assert "fedlightning.errors.ConfigError: method.lr must be positive" in error
    assert read_status(sweep / "2") == {
        "status": "failed",
        "error": "method.lr must be positive (got -1).",
        "error_type": "ConfigError",
        "overrides": ["seed=2", "method.lr=-1"],
    }
    log_line = (sweep / "2" / "cli.log").read_text().splitlines()[0]
    assert log_line.endswith(
        f"[fedlightning][ERROR] - method.lr must be positive (got -1). (traceback in {sweep / '2' / 'error.txt'})"
    )
    assert read_status(sweep / "0") == {"status": "completed", "overrides": ["seed=0", "method.lr=0.1"]}


def test_failed_and_killed_jobs_are_found_with_their_reason(sweep: Path) -> None:
    assert failed_or_unfinished([sweep]) == [
        (str(sweep / "2"), "failed: method.lr must be positive (got -1)."),
        (str(sweep / "3"), "no summary.json and no status: killed or still running"),
    ]


def test_table_lists_the_jobs_it_leaves_out(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table_main([str(sweep), "--rows", "method.lr", "--cols", "seed", "--value", "test/acc", "--digits", "2"])
    captured = capsys.readouterr()
    assert "| 0.1 | 0.80 | 0.90 |" in captured.out
    assert captured.err.splitlines() == [
        "left out 2 of 4 job folders:",
        f"  {sweep / '2'}: failed: method.lr must be positive (got -1).",
        f"  {sweep / '3'}: no summary.json and no status: killed or still running",
    ]
    with pytest.raises(SystemExit):
        table_main([str(sweep), "--rows", "method.d", "--cols", "seed"])
    err = capsys.readouterr().err
    assert f"  {sweep / '0'}: lacks 'method.d'" in err and "left out 4 of 4 job folders:" in err


def test_plot_lists_the_jobs_it_leaves_out_and_never_draws_a_failed_one(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert list(collect_curves([sweep]).values()) == [[(100.0, 0.8), (200.0, 0.8)], [(0.0, 0.9)]]
    plot_main([str(sweep), "-o", str(sweep / "overlay.png")])
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "left out 3 of 4 job folders:",
        f"  {sweep / '2'}: failed: method.lr must be positive (got -1).",
        f"  {sweep / '3'}: no summary.json and no status: killed or still running",
        f"  {sweep / '1'}: no evaluation with uplink bits > 0 (the x-axis is logarithmic)",
    ]


def test_error_sentence_of_an_unexpected_exception_names_its_type() -> None:
    assert error_sentence(RuntimeError("CUDA out of\n memory")) == "RuntimeError: CUDA out of memory"
    assert error_sentence(ConfigError("rounds must be at least 1.")) == "rounds must be at least 1."


def test_a_failed_run_closes_its_wandb_run_as_failed(
    make_config: Callable[..., DictConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    finished: list[dict[str, Any]] = []
    real_finish = wandb.finish

    def finish(**kwargs: Any) -> None:  # record the call, and still close the run for later tests
        finished.append(kwargs)
        real_finish(**kwargs)

    monkeypatch.setattr(wandb, "finish", finish)

    def crash(self: L.Trainer, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("node pre-empted")

    monkeypatch.setattr(L.Trainer, "fit", crash)
    with pytest.raises(RuntimeError, match="node pre-empted"):
        run(make_config(["logger=wandb", "rounds=1"]), tmp_path)  # WANDB_MODE=disabled (conftest)
    assert finished == [{"exit_code": 1}]
    assert not (tmp_path / "summary.json").exists()
