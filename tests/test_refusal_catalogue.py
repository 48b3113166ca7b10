"""Config-decidable refusals: before any data, once, in config names, and no run folder.

Each case of :data:`CATALOGUE` is a config whose problem shows without data. The command's entry
point (:func:`fedlightning.cli.main`, what the ``fedlightning`` script calls) must exit with
status 1 before Hydra's job starts (so before the run folder is made and any data is read),
printing one line, ``fedlightning: error: <sentence>``, whose sentence names the config keys
and the fix. The catalogue runs in this process, then each case as the real command, which must
refuse within :data:`COMMAND_LIMIT_S` seconds of CPU, or, on a machine where importing torch
and Hydra alone is slow, within :data:`BEYOND_IMPORTS_S` seconds more than that import (the
target index of an earlier command in the cache, :mod:`fedlightning.target_index`, so that no
refusal waits for Lightning to import: without it a refusal costs about 4 s beyond the import).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedlightning import cli, target_index
from fedlightning.errors import ConfigError
from fedlightning.run import run

from .conftest import QUIET, REPO_ROOT, compose_config

# (overrides, fragments the sentence must hold: the keys in config names, then the fix)
CATALOGUE: dict[str, tuple[list[str], list[str]]] = {
    "misspelt top-level key": (["rouns=3"], ["rouns is not a key of the config", "did you mean rounds?"]),
    "misspelt group": (["method=fedavgg"], ["method=fedavgg is not a config", "did you mean method=fedavg?"]),
    "misspelt group key": (["method.lcoal_epochs=2"], ["method.lcoal_epochs", "did you mean method.local_epochs?"]),
    "unknown top-level key with +": (["+roundz=3"], ["roundz is not a top-level key", "did you mean rounds?"]),
    "unknown constructor key with +": (["+partition.alfa=1"], ["partition has no key alfa", "did you mean alpha?"]),
    "rounds zero": (["rounds=0"], ["rounds", "must be at least 1 (got 0)", "rounds=50"]),
    "local_epochs zero": (["method.local_epochs=0"], ["method.local_epochs must be at least 1"]),
    "zampling with top-k": (
        ["method=zampling", "compressor=top_k"],
        [
            "method=zampling uploads a Bernoulli mask, which compressor=top_k does not compress",
            "use compressor=none",
        ],
    ),
    "diana with a biased compressor": (
        ["method=diana", "compressor=top_k"],
        [
            "method=diana needs an unbiased uplink compressor and compressor=top_k is biased",
            "set compressor= to one of",
            " natural, ",
        ],
    ),
    "diana with error feedback": (
        ["method=diana", "compressor=rand_k", "compressor.error_feedback=true"],
        ["method=diana's shifts replace error feedback", "set compressor.error_feedback=false"],
    ),
    "fed-iht broadcast with a downlink operator": (
        ["method=fediht", "downlink=natural"],
        [
            "method=fediht broadcasts a hard-thresholded model, which downlink=natural does not compress",
            "downlink=none",
        ],
    ),
    "fjord's per-client broadcast with a downlink operator": (
        ["method=fjord", "downlink=qsgd"],
        ["method=fjord sends each client its own message", "use downlink=none"],
    ),
    "algorithm 1 with a biased master compressor": (
        ["downlink=top_k", "downlink.scheme=aggregate"],
        ["downlink.scheme=aggregate", "downlink=top_k is biased", "downlink.scheme=replica"],
    ),
    "top-k fraction zero": (
        ["compressor=top_k", "compressor.compressor.fraction=0"],
        ["compressor.compressor.fraction must lie in (0, 1] (got 0)", "compressor.compressor.fraction=0.01"],
    ),
    "top-k fraction above one": (
        ["compressor=top_k", "compressor.compressor.fraction=1.5"],
        ["compressor.compressor.fraction must lie in (0, 1] (got 1.5)", "compressor.compressor.fraction=0.01"],
    ),
    "top-k fraction nan": (
        ["compressor=top_k", "compressor.compressor.fraction=nan"],
        ["compressor.compressor.fraction must be a number (got nan)"],
    ),
    "top-k k zero": (
        ["compressor=top_k", "compressor.compressor.fraction=null", "+compressor.compressor.k=0"],
        ["compressor.compressor.k must be at least 1 (got 0)", "compressor.compressor.k=100"],
    ),
    "top-k with neither k nor fraction": (
        ["compressor=top_k", "compressor.compressor.fraction=null"],
        ["Give exactly one of compressor.compressor.k", "or compressor.compressor.fraction"],
    ),
    "unknown accelerator": (
        ["trainer.accelerator=gpuu"],
        ["trainer.accelerator=gpuu is not an accelerator Lightning knows", "did you mean trainer.accelerator=gpu?"],
    ),
    "no devices": (["trainer.devices=0"], ["trainer.devices=0 asks for no device", "trainer.devices=1"]),
    "negative devices on the CPU": (["trainer.devices=-3"], ["trainer.devices=-3 is not a process count"]),
    "no nodes": (["trainer.num_nodes=0"], ["trainer.num_nodes must be a machine count of at least 1 (got 0)"]),
    "an override nothing reads": (["clients_per_round=4"], ["clients_per_round=4 would change nothing"]),
    "early stopping on the test set": (
        ["data.val_fraction=0", "early_stopping.monitor=val/acc"],
        ["early_stopping.monitor=val/acc would choose the round on the test set", "data.val_fraction=0.1"],
    ),
    "a report setting the method ignores": (
        ["method=fedavg", "reports.zampling_evaluation.test_samples=5"],
        [
            "reports.zampling_evaluation.test_samples is read only by methods that declare the zampling_evaluation "
            "report (continuous_zampling, fedpm, local_zampling, supermask, zampling); method=fedavg ignores it",
            "drop the override or choose one of those methods",
        ],
    ),
    "misspelt report key with +": (
        ["method=zampling", "+reports.zampling_evaluation.tst_samples=3"],
        ["reports.zampling_evaluation has no key tst_samples", "did you mean test_samples?"],
    ),
    "misspelt report key": (
        ["method=zampling", "reports.zampling_evaluation.tst_samples=3"],
        ["reports.zampling_evaluation.tst_samples", "did you mean reports.zampling_evaluation.test_samples?"],
    ),
    "Apple's MPS, which has no float64": (
        ["trainer.accelerator=mps"],
        ["trainer.accelerator=mps cannot hold the server's float64 sums", "trainer.accelerator=cpu"],
    ),
    "a key that lives in another node": (
        ["method=zampling", "method.test_samples=3"],
        ["method.test_samples is not a key of the config", "did you mean reports.zampling_evaluation.test_samples?"],
    ),
    "report setting zero": (
        ["method=zampling", "reports.zampling_evaluation.test_samples=0"],
        ["reports.zampling_evaluation.test_samples must be at least 1 (got 0)"],
    ),
}
if not torch.cuda.is_available():
    CATALOGUE["a GPU this machine lacks"] = (
        ["trainer.accelerator=gpu"],
        ["trainer.accelerator=gpu needs a CUDA GPU", "trainer.accelerator=cpu"],
    )

#: Seconds a refusal may take in this process (imports done): generous for a loaded machine.
IN_PROCESS_LIMIT_S = 3.0
#: Seconds of CPU a refusal may take as a command, imports included. CPU time, not wall time, so
#: that the tests running beside it on a loaded machine do not count.
COMMAND_LIMIT_S = 3.0
#: Seconds of CPU a refusal may take beyond importing torch and Hydra, measured just before it:
#: the limit where sharing the cores slows every process (about 0.4 s on a quiet machine).
BEYOND_IMPORTS_S = 1.5


@pytest.fixture(scope="module", autouse=True)
def _target_index() -> None:
    """The target index in this test process's cache, as the first command on a machine leaves it."""
    target_index.ensure()


def test_the_catalogue_holds_at_least_15_refusals() -> None:
    assert len(CATALOGUE) >= 15


@pytest.mark.parametrize(("overrides", "fragments"), CATALOGUE.values(), ids=CATALOGUE)
def test_refused_before_the_job_starts_once_in_config_names_without_a_folder(
    overrides: list[str],
    fragments: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started: list[bool] = []
    monkeypatch.setattr(cli, "job", lambda: started.append(True))  # the job makes the folder and reads data
    monkeypatch.delenv(cli.FULL_ERROR, raising=False)
    folder = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["fedlightning", *QUIET, *overrides, f"hydra.run.dir={folder}"])
    begin = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        cli.main()
    elapsed = time.perf_counter() - begin
    captured = capsys.readouterr()
    assert info.value.code == 1
    assert not started, "the refusal came only once the job had started"
    assert not folder.exists()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlightning: error: "), captured.err
    sentence = lines[0].removeprefix("fedlightning: error: ")
    assert sentence.endswith((".", "?")), sentence
    for fragment in fragments:
        assert fragment in sentence, (fragment, sentence)
    assert captured.out == ""
    assert elapsed < IN_PROCESS_LIMIT_S, f"{elapsed:.1f} s"


@pytest.mark.parametrize(
    "overrides", [["trainer.devices=0"], ["compressor=top_k", "compressor.compressor.fraction=0"]], ids=str
)
def test_run_refuses_before_making_its_folder(overrides: list[str], tmp_path: Path) -> None:
    folder = tmp_path / "new"
    with pytest.raises(ConfigError):
        run(compose_config(overrides), folder, overrides=overrides)
    assert not folder.exists()


def test_without_choices_the_refusal_names_the_method_class_and_the_operator(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^Zampling uploads a Bernoulli mask, which the uplink compressor top_k\("):
        run(compose_config(["method=zampling", "compressor=top_k"]), tmp_path / "run")


def test_a_plain_config_passes_the_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cli.FULL_ERROR, raising=False)
    cli.preflight_command([*QUIET, "method=diana", "compressor=natural", "downlink=natural"])


# --- the real command, end to end ----------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "fragments"), CATALOGUE.values(), ids=CATALOGUE)
def test_the_command_refuses_within_3_s_of_cpu_or_little_beyond_its_imports_once_in_config_names_without_a_folder(
    overrides: list[str], fragments: list[str], tmp_path: Path
) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}
    env.pop(cli.FULL_ERROR, None)
    imports, _ = _child_cpu([sys.executable, "-c", "import torch, hydra, omegaconf"], cwd=tmp_path, env=env)
    begin = time.perf_counter()
    cmd = [sys.executable, "-m", "fedlightning.cli", *QUIET, *overrides]
    cpu, result = _child_cpu(cmd, cwd=tmp_path, env=env)
    wall = time.perf_counter() - begin
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlightning: error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no outputs/<date>/<time> folder
    limit = max(COMMAND_LIMIT_S, imports + BEYOND_IMPORTS_S)
    assert cpu < limit, f"{cpu:.2f} s of CPU ({wall:.2f} s wall); importing torch and Hydra took {imports:.2f} s"


def _child_cpu(cmd: list[str], **options: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run ``cmd`` to its end; the CPU seconds (user and system) it took, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **options)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, result


def test_auto_is_refused_where_it_would_choose_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedlightning.preflight import refuse_mps

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"^trainer.accelerator=auto \(auto chooses Apple's MPS on this machine\)"):
        refuse_mps("auto")
    refuse_mps("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # auto then chooses CUDA
    refuse_mps("auto")
