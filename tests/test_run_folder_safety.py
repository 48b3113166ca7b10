"""Nothing lost, nothing silent: run folders that another run holds, folders and files that cannot
be written, crafted files in a folder being resumed, and resumes at the edges.

The command cases call :func:`fedlightning.cli.main` in this process (so a write can be made to
fail by a monkeypatch): each ends with exit status 1, one sentence naming the file or folder,
no ``summary.json``, and nothing changed in a folder the command does not hold.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedlightning import cli
from fedlightning.errors import ConfigError
from fedlightning.folder_lock import RunFolderTakenError, WriteFailedError, write_text_atomic
from fedlightning.jobs import read_status, record_failure
from fedlightning.run import run
from fedlightning.run_folder import IGNORED_KEYS, check_explicit_checkpoint, config_differences, run_config

from .conftest import QUIET, compose_config

RUN = ["rounds=2", "checkpoint_every=1", "logger=csv", "data.num_clients=3"]


@pytest.fixture(autouse=True)
def _no_png(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedlightning.plotting.plot_curves", lambda *args, **kwargs: None)


def command(folder: Path, *overrides: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``fedlightning <overrides> hydra.run.dir=<folder>`` in this process: (exit status, last stderr line)."""
    argv = sys.argv
    sys.argv = ["fedlightning", *QUIET, *overrides, f"hydra.run.dir={folder}"]
    capsys.readouterr()
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` (the lock file aside): its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def assert_one_sentence(line: str, *fragments: str) -> None:
    assert line.startswith("fedlightning: error: "), line
    assert "Traceback" not in line and line.endswith("."), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete 2-round run made by the command (its .hydra/, status.json and cli.log included)."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    argv = sys.argv
    sys.argv = ["fedlightning", *QUIET, *RUN, f"hydra.run.dir={folder}"]
    try:
        cli.main()
    finally:
        sys.argv = argv
    return folder


@pytest.fixture
def held(finished: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the finished run, locked as a running run locks it (its own open file description)."""
    folder = tmp_path / "held"
    shutil.copytree(finished, folder)
    (folder / "summary.json").unlink()  # still running
    handle = (folder / ".lock").open("a+")
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    yield folder
    handle.close()


# ---------------------------------------------------------------------------- item 4: held folders
def test_the_command_writes_hydra_records_status_and_no_lock_into_its_finished_folder(finished: Path) -> None:
    assert (finished / ".hydra" / "config.yaml").is_file() and (finished / ".hydra" / "overrides.yaml").is_file()
    assert "rounds=2" in (finished / ".hydra" / "overrides.yaml").read_text()
    assert read_status(finished) == {"status": "completed", "overrides": [*QUIET, *RUN]}
    assert not (finished / ".lock").exists() and not (finished / "error.txt").exists()


HELD = "Another run is writing the run folder"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (RUN, HELD),
        (["rounds=3", *RUN[1:]], HELD),
        (["rounds=abc", *RUN[1:]], "rounds (the number of federated rounds)"),
    ],
    ids=["same config", "another config", "a config error"],
)
def test_a_command_on_a_folder_another_run_holds_is_refused_and_writes_nothing(
    held: Path, overrides: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(held)
    code, line = command(held, *overrides, capsys=capsys)
    assert code == 1
    assert_one_sentence(line, fragment if fragment != HELD else f"{HELD} {held}")
    assert snapshot(held) == before  # status.json, .hydra/, cli.log: as the running run left them
    assert not (held / "error.txt").exists() and not (held / "summary.json").exists()


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [(["rounds=3", *RUN[1:]], "holds a run with another config (rounds: 2 -> 3)"), (["rounds=abc"], "rounds")],
    ids=["another config", "a config error"],
)
def test_a_command_refused_on_a_complete_folder_of_another_run_writes_nothing(
    finished: Path, tmp_path: Path, overrides: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "done"
    shutil.copytree(finished, folder)
    before = snapshot(folder)
    code, line = command(folder, *overrides, capsys=capsys)
    assert code == 1
    assert_one_sentence(line, fragment)
    assert snapshot(folder) == before  # .hydra/config.yaml and overrides.yaml still describe the run made here
    assert not (folder / "error.txt").exists() and not (folder / ".lock").exists()


def test_a_complete_folder_run_again_keeps_its_records(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "done"
    shutil.copytree(finished, folder)
    before = snapshot(folder)
    log = before.pop("cli.log")[0]
    code, _ = command(folder, *RUN, "threads=1", capsys=capsys)
    assert code == 0
    after = snapshot(folder)
    assert after.pop("cli.log")[0].startswith(log)  # the command's own log lines are appended, nothing else
    assert after == before  # status.json, .hydra/ and the results as the run left them


def test_a_failed_attempt_then_a_successful_retry_leaves_no_error_file_and_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Disk full while the first checkpoint is written: one sentence naming it; the same command then completes."""
    folder = tmp_path / "run"
    save = torch.save

    def full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    code, line = command(folder, *RUN, capsys=capsys)
    assert code == 1
    assert_one_sentence(
        line, f"Could not write {folder / 'checkpoints'}", "the disk is full (ENOSPC)", "free some space"
    )
    assert not (folder / "summary.json").exists()
    assert read_status(folder)["status"] == "failed"  # type: ignore[index]
    assert (folder / "error.txt").read_text().startswith(line.removeprefix("fedlightning: error: "))
    assert not list(folder.rglob(".*.tmp-*"))  # no temporary checkpoint left
    monkeypatch.setattr(torch, "save", save)
    code, _ = command(folder, *RUN, capsys=capsys)
    assert code == 0 and (folder / "summary.json").is_file()
    assert read_status(folder)["status"] == "completed"  # type: ignore[index]
    assert not (folder / "error.txt").exists() and not (folder / ".lock").exists()


# ---------------------------------------------------------------------------- item 6: writes that fail
def test_a_run_folder_under_a_regular_file_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    code, line = command(tmp_path / "file" / "run", *RUN, capsys=capsys)
    assert code == 1
    assert_one_sentence(line, f"{tmp_path / 'file'}", "is a regular file, not a folder (ENOTDIR)", "hydra.run.dir=")
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(WriteFailedError, match="is a regular file, not a folder"):
        run(compose_config(RUN), tmp_path / "file" / "run")


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make every write under ``folder`` fail as on a read-only file system (chmod does not bind root)."""
    real_open = Path.open

    def open_(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(c in mode for c in "wax+") and str(self).startswith(str(folder)):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)


def test_a_read_only_run_folder_is_one_sentence_and_nothing_is_written(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ro"
    shutil.copytree(finished, folder)
    (folder / "summary.json").unlink()
    before = snapshot(folder)
    _read_only(monkeypatch, folder)
    with pytest.raises(WriteFailedError) as info:
        run(compose_config(RUN), folder)
    text = str(info.value)
    assert f"Could not write {folder / '.lock'}: the file system is read-only (EROFS)" in text and "\n" not in text
    assert snapshot(folder) == before and not (folder / "summary.json").exists()


def test_a_status_write_on_a_full_disk_leaves_the_previous_status_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_text_atomic(tmp_path / "status.json", json.dumps({"status": "completed", "overrides": []}))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    sentence = record_failure(tmp_path, ConfigError("rounds must be at least 1."))
    assert sentence == "rounds must be at least 1."
    assert read_status(tmp_path) == {"status": "completed", "overrides": []}  # not a 0-byte file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temporary file


def _tiny_jpeg_tar(root: Path) -> None:
    from PIL import Image

    from fedlightning.datamodules.cifar import CIFAR10_CLASSES, JPEG_TAR

    (root / JPEG_TAR).parent.mkdir(parents=True)
    with tarfile.open(root / JPEG_TAR, "w") as tf:
        for split, per_class in (("train", 2), ("test", 1)):
            for c, name in enumerate(CIFAR10_CLASSES):
                for i in range(per_class):
                    data = io.BytesIO()
                    Image.fromarray(np.full((32, 32, 3), 20 * c + i, np.uint8)).save(data, format="JPEG")
                    info = tarfile.TarInfo(f"{split}/{name}/{i}.jpg")
                    info.size = data.tell()
                    data.seek(0)
                    tf.addfile(info, data)


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_jpeg_cache_that_cannot_be_written_is_one_sentence_and_leaves_no_temporary_file(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedlightning.datamodules.cifar import CIFAR10DataModule

    _tiny_jpeg_tar(tmp_path / "data")
    cache = tmp_path / "cache"
    if fault == "read-only":  # chmod does not bind root: mkdir fails as on a read-only file system
        mkdir = Path.mkdir

        def read_only(self: Path, *args: Any, **kwargs: Any) -> None:
            if str(self).startswith(str(cache)):
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", read_only)
        expected = "the file system is read-only (EROFS)"
    else:
        savez = np.savez

        def full(file: Any, **arrays: Any) -> None:
            savez(file, **arrays)  # the temporary file is written, then the disk fills
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(np, "savez", full)
        expected = "the disk is full (ENOSPC)"
    dm = CIFAR10DataModule(
        root=str(tmp_path / "data"), source="jpeg", num_clients=2, seed=0, cache_dir=str(cache), download=False
    )
    with pytest.raises(WriteFailedError) as info:
        dm.setup("fit")
    text = str(info.value)
    assert f"Could not write {cache / 'cifar10-jpeg'}" in text and expected in text, text
    assert "data.cache_dir=''" in text and "\n" not in text
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no 20 MB temporary file left


# ---------------------------------------------------------------------------- item 6: crafted files
def _killed_copy(finished: Path, folder: Path) -> Path:
    """The finished run as a kill after round 1 leaves it (no summary, no round-2 checkpoints)."""
    shutil.copytree(finished, folder)
    for name in ("summary.json", "checkpoints/last.ckpt", "checkpoints/round-0002.ckpt"):
        (folder / name).unlink()
    return folder


def _lines(path: Path, edit: Callable[[list[str]], list[str]]) -> None:
    path.write_text("".join(edit(path.read_text().splitlines(keepends=True))))


CRAFTED: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # case: (file, craft it, what the sentence says after the file's path)
    "run.json not JSON": ("run.json", lambda p: p.write_text("{"), "is not valid JSON"),
    "run.json a list": ("run.json", lambda p: p.write_text("[1]"), "holds a JSON list"),
    "run.json config a string": ("run.json", lambda p: p.write_text('{"config": "x"}'), "is not a fedlightning run"),
    "run.json not UTF-8": ("run.json", lambda p: p.write_bytes(b"\xff\xfe{"), "is not UTF-8 text"),
    "summary.json a list": ("summary.json", lambda p: p.write_text("[]"), "is not a fedlightning summary"),
    "partition.json not JSON": ("partition.json", lambda p: p.write_text("nope"), "is not valid JSON"),
    "partition.json clients an object": (
        "partition.json",
        lambda p: p.write_text('{"clients": {"0": [1]}}'),
        "holds clients as a JSON dict",
    ),
    "metrics.csv not text": ("csv/metrics.csv", lambda p: p.write_bytes(b"step\n\xff\xfe\n"), "is not UTF-8 text"),
    "metrics.csv without step": (
        "csv/metrics.csv",
        lambda p: _lines(p, lambda rows: [rows[0].replace("step", "stop"), *rows[1:]]),
        "has no 'step' column",
    ),
    "comm_records.csv a bad round": (
        "comm_records.csv",
        lambda p: _lines(p, lambda rows: [rows[0], "x" + rows[1], *rows[2:]]),
        "line 2 has a damaged value",
    ),
    "comm_records.csv a short row": (
        "comm_records.csv",
        lambda p: _lines(p, lambda rows: [rows[0], "1,2\n", *rows[1:]]),
        "line 2 has 2 fields",
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_file_in_a_folder_being_resumed_is_one_sentence_naming_it(
    case: str, finished: Path, tmp_path: Path
) -> None:
    name, craft, expected = CRAFTED[case]
    folder = _killed_copy(finished, tmp_path / "killed")
    craft(folder / name)
    taken = name == "run.json"
    before = snapshot(folder)
    with pytest.raises(ConfigError) as info:
        run(compose_config(RUN), folder)
    text = str(info.value)
    assert f"{folder / name} {expected}" in text and "\n" not in text, text
    assert not (folder / "summary.json").is_file() or name == "summary.json"
    if taken:  # the folder is not known to be this run's: nothing in it changes
        assert isinstance(info.value, RunFolderTakenError) and snapshot(folder) == before


@pytest.mark.parametrize(
    "name", ["partition.json", "comm_records.csv", "csv/metrics.csv"], ids=["partition", "records", "metrics"]
)
def test_a_crafted_file_behind_ckpt_path_is_one_sentence_naming_it(name: str, finished: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(finished, source)
    crafted = source / name
    crafted.write_bytes(b"\xff\xfe\x00garbage")
    checkpoint = source / "checkpoints" / "round-0001.ckpt"
    with pytest.raises(ConfigError) as info:
        run(compose_config([*RUN, f"ckpt_path={checkpoint}"]), tmp_path / "new")
    text = str(info.value)
    assert f"{crafted} is not UTF-8 text" in text and "\n" not in text, text
    assert not (tmp_path / "new" / "summary.json").exists()


PARTITION_FILES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "a torch .pt": ("p.pt", lambda p: torch.save({"clients": [[0]]}, p), "has no 'meta' array (a torch .pt"),
    "a legacy torch pickle": (
        "p.pt",
        lambda p: torch.save({"x": 1}, p, _use_new_zipfile_serialization=False),
        "is neither a .json partition nor a .npz",
    ),
    "an index of 2^63": ("p.json", lambda p: p.write_text('{"clients": [[9223372036854775808]]}'), "index 2^63"),
    "a float index": ("p.json", lambda p: p.write_text('{"clients": [[1.5]]}'), "lists 1.5 in client 0"),
    "not JSON": ("p.json", lambda p: p.write_text("{"), "is not valid JSON"),
    "a text version": ("p.json", lambda p: p.write_text('{"clients": [[0]], "version": "2"}'), "has version '2'"),
    "npz without offsets": (
        "p.npz",
        lambda p: np.savez(p, meta=np.array("{}"), indices=np.arange(3)),
        "has no 'offsets' array",
    ),
}


@pytest.mark.parametrize("case", sorted(PARTITION_FILES))
def test_a_bad_partition_file_is_one_sentence_naming_it(case: str, tmp_path: Path) -> None:
    from fedlightning.datamodules import DigitsDataModule

    name, make, expected = PARTITION_FILES[case]
    path = tmp_path / name
    make(path)
    expected = expected.replace("index 2^63", "holds index 9223372036854775808 in client 0, outside [0, 2^63)")
    with pytest.raises(ValueError) as info:
        DigitsDataModule(num_clients=1, seed=0, partition_file=str(path)).setup()
    text = str(info.value)
    assert text.startswith(f"data.partition_file={path} ") and expected in text and "\n" not in text, text


class _RunsCommand:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("true",))


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_checkpoint_whose_pickle_calls_os_system_is_refused_as_code(protocol: int, tmp_path: Path) -> None:
    path = tmp_path / "evil.ckpt"
    path.write_bytes(pickle.dumps({"state_dict": {}, "loops": {}, "global_step": _RunsCommand()}, protocol=protocol))
    with pytest.raises(ConfigError) as info:
        check_explicit_checkpoint(path)
    text = str(info.value)
    assert f"ckpt_path={path} holds code (unpickling it would call posix.system)" in text, text
    assert "refused as unsafe" in text and "truncated" not in text


# ---------------------------------------------------------------------------- item 5: resume edges
def test_the_process_count_is_not_part_of_the_config_on_record() -> None:
    one = run_config(compose_config(RUN))
    two = run_config(compose_config([*RUN, "trainer=ddp"]))
    assert config_differences(one, two) == []
    assert "trainer.devices" in IGNORED_KEYS and "trainer.strategy" in IGNORED_KEYS


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return [{k: v for k, v in row.items() if k != "time/round_s"} for row in csv.DictReader(handle)]


def test_a_kill_between_the_test_row_and_the_summary_leaves_no_duplicated_row(finished: Path, tmp_path: Path) -> None:
    folder = tmp_path / "killed"

    def child() -> None:
        import fedlightning.run as run_module

        write = run_module.write_text_atomic

        def write_or_die(path: Path, text: str) -> None:
            if Path(path).name == "summary.json":
                os.kill(os.getpid(), signal.SIGKILL)
            write(path, text)

        run_module.write_text_atomic = write_or_die  # type: ignore[assignment]
        run(compose_config(RUN), folder)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(timeout=300)
    assert process.exitcode == -signal.SIGKILL
    assert sum(1 for row in _rows(folder / "csv/metrics.csv") if row["test/acc"]) == 1  # the test row was written
    summary = run(compose_config(RUN), folder)
    assert summary["resumed_from_round"] == 2
    assert _rows(folder / "csv/metrics.csv") == _rows(finished / "csv/metrics.csv")


@pytest.mark.slow
def test_a_two_process_folder_resumes_in_place_with_one_process(tmp_path: Path) -> None:
    from .test_distributed import run_two_processes

    overrides = ["rounds=3", "checkpoint_every=1", "logger=csv", "data.num_clients=4"]
    straight = run(compose_config(overrides), tmp_path / "straight")
    folder = tmp_path / "two"
    assert run_two_processes(overrides, folder)["processes"] == 2
    for name in ("summary.json", "checkpoints/last.ckpt", "checkpoints/round-0003.ckpt"):  # killed after round 2
        (folder / name).unlink()
    resumed = run(compose_config(overrides), folder)  # trainer.devices 2 -> 1, in place
    assert resumed["resumed_from_round"] == 2 and resumed["processes"] == 1
    assert resumed["comm/uplink_bits_total"] == straight["comm/uplink_bits_total"]
    assert resumed["test/acc"] == pytest.approx(straight["test/acc"], abs=1e-6)
    assert [r["round"] for r in _rows(folder / "comm_records.csv")] == [
        r["round"] for r in _rows(tmp_path / "straight" / "comm_records.csv")
    ]


def test_spilled_client_state_on_a_full_disk_is_one_sentence_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedlightning.federated.state import ClientStateStore
    from fedlightning.folder_lock import hold

    def full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        try:  # as torch's zip writer reports it: a RuntimeError over the OSError
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None

    store = ClientStateStore(memory_budget_bytes=0, spill_dir=tmp_path / "client_state")
    store.set(0, "h", torch.zeros(4))
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(WriteFailedError) as info, hold(tmp_path):
        store.enforce_budget()
    text = str(info.value)
    assert f"Could not write {tmp_path / 'client_state'}" in text and "the disk is full (ENOSPC)" in text, text
