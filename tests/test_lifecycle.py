"""Run folders: a run killed with SIGKILL and run again equals the uninterrupted run; bad checkpoints.

The killed runs are forks of this (already imported) test process that SIGKILL themselves at a
seeded round, right after a checkpoint or in the middle of the next round; the same config is
then run again in the same folder, in this process. One case kills the real command from outside.
"""

from __future__ import annotations

import csv
import json
import logging
import multiprocessing
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.checkpointing import RoundCheckpoint, atomic_torch_save
from fedlightning.errors import ConfigError
from fedlightning.loggers import ResumableExperimentWriter
from fedlightning.run import run
from fedlightning.run_folder import cut_csv, locked

from .conftest import REPO_ROOT, compose_config

ROUNDS = 4
RUN = [f"rounds={ROUNDS}", "checkpoint_every=1", "logger=csv", "data.num_clients=5"]
METHODS = {
    "fedavg": [],
    "fedadam_uniform": ["method=fedadam", "sampler=uniform", "clients_per_round=3"],
    "top_k_error_feedback": ["compressor=top_k_ef", "sampler=uniform", "clients_per_round=3"],
    # Algorithm 1: the resumed run broadcasts the pending compressed step, not the model again
    "bidirectional_natural": ["compressor=natural", "downlink=natural"],
    "diana": ["+experiment=diana_digits_quick", "eval_every=1", "compressor=natural_dithering", "data.num_clients=5"],
    "federated_zampling": [
        "method=zampling",
        "model=digits_mlp",
        "partition=iid",
        "reports.zampling_evaluation.val_samples=2",
        "reports.zampling_evaluation.test_samples=2",
        "method.compression=4",
        "method.reset_optimizer=false",
    ],
    "fedpm": [
        "method=fedpm",
        "model=digits_mlp",
        "partition=iid",
        "reports.zampling_evaluation.val_samples=2",
        "reports.zampling_evaluation.test_samples=2",
    ],
    "eflops": ["method=eflops", "model=digits_mlp", "partition=iid"],
    # failure injection: the drop-out and quorum draws and their totals continue across the kill
    "fedavg_dropout_repeat": [
        "failures=dropout",
        "failures.dropout=0.5",
        "failures.min_uploads=3",
        "failures.below_quorum=repeat",
    ],
}
NOT_COMPARED = {"time/wall_s", "resumed_from_round"}  # wall time, and where the second attempt began
TIMING_COLUMNS = ("time/round_s",)


@pytest.fixture(autouse=True)
def _no_png(monkeypatch: pytest.MonkeyPatch) -> None:
    # The PNG plot takes a second per run; the CSV it is drawn from is compared instead.
    monkeypatch.setattr("fedlightning.plotting.plot_curves", lambda *args, **kwargs: None)


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(handle)]


def _assert_same_run(
    straight: Path, resumed: Path, *, not_compared: tuple[str, ...] = (), same_checkpoints: bool = True
) -> None:
    a, b = (json.loads((folder / "summary.json").read_text()) for folder in (straight, resumed))
    assert a.keys() == b.keys()
    for key in sorted(a.keys() - NOT_COMPARED - set(not_compared)):
        assert b[key] == a[key], key
    assert "val/acc_best" in a
    assert _rows(resumed / "comm_records.csv") == _rows(straight / "comm_records.csv")
    assert _rows(resumed / "bits_vs_accuracy.csv") == _rows(straight / "bits_vs_accuracy.csv")
    header = (resumed / "csv/metrics.csv").read_text().splitlines()[0]
    assert header == (straight / "csv/metrics.csv").read_text().splitlines()[0]
    assert _rows(resumed / "csv/metrics.csv", TIMING_COLUMNS) == _rows(straight / "csv/metrics.csv", TIMING_COLUMNS)
    names = sorted(p.name for p in (resumed / "checkpoints").iterdir())
    if same_checkpoints:
        assert names == sorted(p.name for p in (straight / "checkpoints").iterdir())  # no round-0002-v1.ckpt
    state = {f: torch.load(f / "checkpoints/last.ckpt", weights_only=True)["state_dict"] for f in (straight, resumed)}
    for name, tensor in state[straight].items():
        assert torch.equal(state[resumed][name], tensor), name


def _killed(cfg: DictConfig, folder: Path, *, round_idx: int, where: str) -> None:
    """Run ``cfg`` in a fork of this process that SIGKILLs itself at ``round_idx``."""

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def child() -> None:
        if where == "after_checkpoint":  # the checkpoint of round_idx is on disk
            save = RoundCheckpoint._save

            def save_then_die(self: RoundCheckpoint, trainer: Any, step: int) -> None:
                save(self, trainer, step)
                if step == round_idx:
                    die()

            RoundCheckpoint._save = save_then_die  # type: ignore[method-assign]
        else:  # mid-round: the next round's communication rows are written, its checkpoint is not
            write = CommunicationAccountant._write_rows

            def write_then_die(self: CommunicationAccountant) -> None:
                rounds = {row[0] for row in self._rows}
                write(self)
                if round_idx + 1 in rounds:  # rounds count from 1: the round after checkpoint round_idx
                    die()

            CommunicationAccountant._write_rows = write_then_die  # type: ignore[method-assign]
        run(cfg, folder)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(timeout=300)
    assert process.exitcode == -signal.SIGKILL


@pytest.mark.parametrize("method", sorted(METHODS))
def test_killed_run_run_again_equals_the_uninterrupted_run(method: str, tmp_path: Path) -> None:
    rng = random.Random(f"kill-{method}")
    round_idx, where = rng.randrange(1, ROUNDS), rng.choice(["after_checkpoint", "mid_round"])
    cfg = compose_config([*RUN, *METHODS[method]])
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=round_idx, where=where)
    assert not (tmp_path / "resumed" / "summary.json").exists()
    summary = run(cfg, tmp_path / "resumed")
    assert summary["resumed_from_round"] == round_idx
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("method", ["fedavg", "top_k_error_feedback", "federated_zampling"])
def test_a_killed_run_resumes_with_the_progress_bar_on(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Lightning skips on_train_epoch_start when it restarts mid-epoch: the bar is made on first use.
    cfg = compose_config([*RUN, *METHODS[method], "trainer.enable_progress_bar=true"])
    assert cfg.trainer.enable_progress_bar
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=2, where="mid_round")
    capsys.readouterr()
    assert run(cfg, tmp_path / "resumed")["resumed_from_round"] == 2
    shown = capsys.readouterr().out
    assert "round 2/4" in shown and f"round {ROUNDS}/{ROUNDS}" in shown and "round 1/4" not in shown
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_a_run_killed_after_its_final_checkpoint_only_tests_and_summarises(tmp_path: Path) -> None:
    # Nothing is left to train: the validation metrics come from the checkpoint.
    cfg = compose_config([*RUN, "eval_every=3"])
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=ROUNDS, where="after_checkpoint")
    assert run(cfg, tmp_path / "resumed")["resumed_from_round"] == ROUNDS
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("where", ["after_checkpoint", "mid_round"])
def test_a_round_without_validation_resumes_from_its_own_checkpoint(where: str, tmp_path: Path) -> None:
    # Round 3 is not evaluated (eval_every=2): its training row is written before its
    # checkpoint, so a kill right after the checkpoint, or in round 4, loses nothing of round 3.
    cfg = compose_config([*RUN, "eval_every=2"])
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=3, where=where)
    assert run(cfg, tmp_path / "resumed")["resumed_from_round"] == 3
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_a_checkpoint_whose_training_row_is_missing_is_passed_over(tmp_path: Path) -> None:
    # A folder whose round-3 checkpoint lacks round 3's training row (a kill between the two,
    # when an earlier version wrote the checkpoint first) resumes from round 2's checkpoint.
    cfg = compose_config([*RUN, "eval_every=2"])
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=3, where="after_checkpoint")
    metrics = tmp_path / "resumed/csv/metrics.csv"
    lines = metrics.read_text().splitlines(keepends=True)
    rows = list(csv.DictReader(lines))
    assert rows[-1]["step"] == "3" and rows[-1]["train/loss"]
    metrics.write_text("".join(lines[:-1]))
    assert run(cfg, tmp_path / "resumed")["resumed_from_round"] == 2
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_a_truncated_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = compose_config(RUN)
    run(cfg, tmp_path / "straight")
    _killed(cfg, tmp_path / "resumed", round_idx=3, where="after_checkpoint")
    last = tmp_path / "resumed/checkpoints/last.ckpt"
    data = last.read_bytes()
    for name in ("last.ckpt", "round-0003.ckpt"):  # torn by something outside the run
        (tmp_path / "resumed/checkpoints" / name).unlink()
        (tmp_path / "resumed/checkpoints" / name).write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="fedlightning"):
        summary = run(cfg, tmp_path / "resumed")
    assert summary["resumed_from_round"] == 2
    warned = [r.getMessage() for r in caplog.records if "truncated or corrupted" in r.getMessage()]
    assert len(warned) == 2 and all("resuming from the previous good checkpoint" in m for m in warned)
    _assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_the_command_killed_from_outside_and_run_again_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    overrides = [
        "rounds=8",
        "checkpoint_every=1",
        "logger=csv",
        "data.num_clients=3",
        "trainer.enable_progress_bar=false",
    ]
    folder = tmp_path / "killed"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "fedlightning.cli", *overrides, f"hydra.run.dir={folder}"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (folder / "checkpoints" / "round-0002.ckpt").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run ended or stalled before round 2: {process.communicate()[1].decode()[-2000:]}")
        time.sleep(0.01)
    process.kill()  # SIGKILL
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (folder / "summary.json").exists()
    cfg = compose_config(overrides)
    run(cfg, tmp_path / "straight")
    summary = run(cfg, folder)  # the same config in the same folder: resumes
    assert summary["resumed_from_round"] >= 2
    _assert_same_run(tmp_path / "straight", folder)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete 2-round FedAvg run with a checkpoint each round."""
    folder = tmp_path_factory.mktemp("finished")
    run(compose_config(["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3"]), folder)
    return folder


def test_a_complete_run_run_again_returns_its_summary_without_training(finished: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in finished.rglob("*") if p.is_file() and p.name != ".lock"}
    again = run(
        compose_config(["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3", "threads=2"]), finished
    )
    assert again == json.loads((finished / "summary.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing rewritten


def test_another_config_in_a_run_folder_stops_with_one_sentence(finished: Path) -> None:
    with pytest.raises(ConfigError) as info:
        run(compose_config(["rounds=3", "checkpoint_every=1", "logger=csv", "data.num_clients=3"]), finished)
    text = str(info.value)
    assert str(finished) in text and "rounds: 2 -> 3" in text and "hydra.run.dir=" in text
    assert "\n" not in text


def test_a_resumed_run_whose_code_draws_other_clients_than_its_partition_file_stops(
    finished: Path, tmp_path: Path
) -> None:
    stopped = tmp_path / "stopped"
    shutil.copytree(finished, stopped)
    (stopped / "summary.json").unlink()
    for name in ("round-0002.ckpt", "last.ckpt"):
        (stopped / "checkpoints" / name).unlink(missing_ok=True)
    record = json.loads((stopped / "partition.json").read_text())
    record["clients"][1].append(record["clients"][0].pop())  # as if the partitioner had changed
    (stopped / "partition.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError) as info:
        run(compose_config(["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3"]), stopped)
    text = str(info.value)
    assert f"{stopped / 'partition.json'} records other clients than" in text and "since round 1" in text
    assert "\n" not in text and not (stopped / "summary.json").exists()


def test_resuming_another_runs_checkpoint_with_another_partition_stops(finished: Path, tmp_path: Path) -> None:
    checkpoint = finished / "checkpoints" / "round-0001.ckpt"
    base = ["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3", f"ckpt_path={checkpoint}"]
    with pytest.raises(ConfigError) as info:
        run(compose_config([*base, "partition=iid"]), tmp_path / "other")
    text = str(info.value)
    assert f"ckpt_path={checkpoint} comes from a run whose partition.json records other clients" in text, text
    assert "\n" not in text and not (tmp_path / "other" / "summary.json").exists()
    same = run(compose_config(base), tmp_path / "same")  # its own data and partition: resumes
    assert same["resumed_from_round"] == 1


def test_a_record_older_than_early_stopping_matches_only_while_early_stopping_is_off(
    finished: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(finished, old)
    record = json.loads((old / "run.json").read_text())
    del record["config"]["early_stopping"]  # a run recorded before the node existed
    (old / "run.json").write_text(json.dumps(record))
    overrides = ["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3"]
    assert run(compose_config(overrides), old) == json.loads((old / "summary.json").read_text())
    with pytest.raises(ConfigError, match="early_stopping: <absent> ->"):
        run(compose_config([*overrides, "early_stopping.monitor=val/acc"]), old)


def _another_models(finished: Path, tmp: Path) -> Path:
    """The finished run's checkpoint with a wider first layer and no recorded config."""
    checkpoint = torch.load(finished / "checkpoints/round-0002.ckpt", weights_only=True)
    del checkpoint["fedlightning"]
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name] = torch.zeros(3, *checkpoint["state_dict"][name].shape)
    torch.save(checkpoint, tmp / "wider.ckpt")
    return tmp / "wider.ckpt"


BAD_CHECKPOINTS: dict[str, tuple[Callable[[Path, Path], Path], list[str], str]] = {
    # case: (make the file from the finished run's folder and a scratch folder, overrides, expected text)
    "missing": (lambda f, t: t / "nowhere.ckpt", [], "does not exist"),
    "a folder": (lambda f, t: f / "checkpoints", [], "is a folder"),
    "empty": (lambda f, t: _write(t / "empty.ckpt", b""), [], "is empty"),
    "truncated": (
        lambda f, t: _write(t / "cut.ckpt", (f / "checkpoints/last.ckpt").read_bytes()[:5000]),
        [],
        "truncated or corrupted",
    ),
    "garbage": (lambda f, t: _write(t / "noise.ckpt", os.urandom(4096)), [], "truncated or corrupted"),
    "not a Lightning checkpoint": (
        lambda f, t: _torch_save(t / "weights.ckpt", {"weight": torch.zeros(2)}),
        [],
        "is not a Lightning checkpoint",
    ),
    "another model's": (lambda f, t: f / "checkpoints/last.ckpt", ["model=digits_logreg"], "holds another model"),
    "another model's, no config recorded": (_another_models, [], "holds another model or method"),
    "another method's": (lambda f, t: f / "checkpoints/last.ckpt", ["method=fedadam"], "another method"),
    "another method's model": (
        lambda f, t: f / "checkpoints/last.ckpt",
        ["method=zampling", "model=digits_mlp", "method.compression=4"],
        "another method",
    ),
    "past rounds": (lambda f, t: f / "checkpoints/round-0002.ckpt", ["rounds=1"], "past rounds=1"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _torch_save(path: Path, obj: Any) -> Path:
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_bad_ckpt_path_stops_with_one_sentence_naming_it_and_the_fix(case: str, finished: Path, tmp_path: Path) -> None:
    make, overrides, expected = BAD_CHECKPOINTS[case]
    path = make(finished, tmp_path)
    cfg = compose_config(["rounds=2", "data.num_clients=3", *overrides, f"ckpt_path={path}"])
    started = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        run(cfg, tmp_path / "run")
    text = str(info.value)
    assert f"ckpt_path={path}" in text and expected in text, text
    assert "point ckpt_path at" in text or "set rounds to at least 2" in text
    assert "\n" not in text
    assert time.perf_counter() - started < 20  # refused before training
    assert not (tmp_path / "run" / "summary.json").exists()


class _WritesMarker:
    """Unpickling this runs ``Path.touch(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


class _RunsCommand:
    """Unpickling this runs ``touch marker`` in a shell (torch names the refused global otherwise)."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch {shlex.quote(str(marker))}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


@pytest.mark.parametrize("payload", [_WritesMarker, _RunsCommand])
def test_a_crafted_checkpoint_runs_no_code_even_when_torch_is_told_to_unpickle(
    payload: Callable[[Path], object], finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "code-ran"
    checkpoint = torch.load(finished / "checkpoints/last.ckpt", weights_only=True)
    checkpoint["callbacks"] = {"evil": payload(marker)}
    crafted = _torch_save(tmp_path / "crafted.ckpt", checkpoint)
    torch.load(crafted, weights_only=False)  # the file is live: a full unpickle runs its code
    assert marker.exists()
    marker.unlink()
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(ConfigError) as info:
        run(compose_config(["rounds=2", "data.num_clients=3", f"ckpt_path={crafted}"]), tmp_path / "run")
    assert not marker.exists()
    assert f"ckpt_path={crafted} holds code (unpickling it would call" in str(info.value)
    assert "refused as unsafe" in str(info.value)


def test_a_failed_write_leaves_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    atomic_torch_save({"w": torch.ones(3)}, path)

    class Unpicklable:
        def __reduce__(self) -> tuple[Any, ...]:
            raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError):
        atomic_torch_save({"w": torch.zeros(3), "x": Unpicklable()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["c.ckpt"]  # no temporary file left


def test_cut_csv_keeps_earlier_rounds_and_drops_a_line_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "comm_records.csv"
    path.write_text("round,client,bits\n0,0,32\n0,1,32\n1,0,32\n2,0,32\n1")  # "1" was being written
    cut_csv(path, lambda row: int(row["round"]) < 2)
    assert path.read_text() == "round,client,bits\n0,0,32\n0,1,32\n1,0,32\n"


def test_metrics_writer_continues_the_file_it_finds(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("loss,step\n0.5,0\n")
    writer = ResumableExperimentWriter(log_dir=str(tmp_path))
    writer.log_metrics({"loss": 0.25}, step=1)
    writer.save()
    assert (tmp_path / "metrics.csv").read_text() == "loss,step\n0.5,0\n0.25,1\n"
    writer.log_metrics({"acc": 0.75}, step=1)  # a new column: the file is rewritten with it
    writer.save()
    assert (tmp_path / "metrics.csv").read_text() == "acc,loss,step\n,0.5,0\n,0.25,1\n0.75,,1\n"


def test_ckpt_path_into_a_new_folder_continues_the_csvs_of_its_run(finished: Path, tmp_path: Path) -> None:
    checkpoint = finished / "checkpoints/round-0001.ckpt"
    overrides = ["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3", f"ckpt_path={checkpoint}"]
    summary = run(compose_config(overrides), tmp_path / "resumed")
    assert summary["resumed_from_round"] == 1
    # The config records ckpt_path; the new folder holds the checkpoints of round 2 only.
    _assert_same_run(finished, tmp_path / "resumed", not_compared=("config",), same_checkpoints=False)


def test_a_folder_held_by_another_run_is_refused(tmp_path: Path) -> None:
    import fcntl

    with (tmp_path / ".lock").open("a+") as other:  # another run's lock: its own open file description
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="Another run is writing the run folder"):
            run(compose_config(["rounds=1"]), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # nothing written


def test_a_run_holds_its_folder_reentrantly_and_removes_its_lock_at_the_end(tmp_path: Path) -> None:
    with locked(tmp_path):
        assert (tmp_path / ".lock").is_file()
        with locked(tmp_path):  # the same process again (the command, then run())
            pass
        assert (tmp_path / ".lock").is_file()
    assert not (tmp_path / ".lock").exists()
