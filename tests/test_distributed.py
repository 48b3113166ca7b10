"""The cohort sharded over 2 CPU processes (Lightning DDP, gloo) gives the 1-process run.

Each 2-process run goes through the real command (``fedlightning ... trainer=ddp``), which
is how Lightning's DDP launcher re-executes the script for the second process; the
1-process reference runs in this process through :func:`fedlightning.run.run`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from fedlightning.federated.cohort import deal_by_load
from fedlightning.run import run

QUIET = ["logger=none", "trainer.enable_progress_bar=false"]
PROBE = "+callbacks.held_out._target_=tests.held_out_probe.CountHeldOut"
SHARES = "+callbacks.shares._target_=tests.share_probe.RecordShares"
CASES = {
    "fedavg": ["rounds=2", PROBE, SHARES],
    "fedadam_uniform": ["rounds=2", "method=fedadam", "sampler=uniform", "clients_per_round=5"],
    "top_k_error_feedback": ["rounds=2", "compressor=top_k_ef", "sampler=uniform", "clients_per_round=6", SHARES],
    "fedavg_ocs": ["rounds=2", "sampler=ocs", "clients_per_round=3"],
    "fedshuffle_unequal_epochs": ["rounds=2", "method=fedshuffle", "method.local_epochs=[1,4]", SHARES],
    "diana": ["+experiment=diana_digits_quick", "rounds=3", "eval_every=3", "compressor=natural_dithering"],
    "federated_zampling": [
        "rounds=2",
        "method=zampling",
        "model=digits_mlp",
        "reports.zampling_evaluation.val_samples=2",
        "reports.zampling_evaluation.test_samples=2",
        "method.compression=4",
    ],
}

# The Zampling family's sampled-network scores: each process scores its own shard of the split.
SAMPLED_METRICS = (
    "val/acc_sampled_mean",
    "val/acc_discretised",
    "val/acc_best_mask",
    "test/acc_sampled_mean",
    "test/acc_sampled_max",
    "test/acc_discretised",
    "test/acc_best_mask",
)

# Beyond the suite's time budget (run with -m slow): FedNova's step sums, the sub-model
# methods (per-client slices, slice-wise sums, random eFD sub-models per client), and the other
# methods whose cohorts are dealt by load.
SLOW_CASES = {
    "fedavg_prune": ["rounds=2", "method=fedavg_prune", "sampler=uniform", "clients_per_round=6"],
    "fediht": ["rounds=2", "method=fediht", "sampler=uniform", "clients_per_round=6"],
    "eflops": ["rounds=2", "method=eflops", "sampler=uniform", "clients_per_round=6"],
    "dcsgd": ["rounds=3", "method=dcsgd", "model=digits_logreg", "compressor=natural_dithering"],
    "fednova_heterogeneous_epochs": ["rounds=2", "method=fednova", "sampler=uniform", "clients_per_round=5"],
    "fjord": ["rounds=2", "method=fjord", "model=digits_mlp", "sampler=uniform", "clients_per_round=6"],
    "efd": ["rounds=2", "method=efd", "method.width=0.8", "model=digits_mlp", "sampler=uniform", "clients_per_round=6"],
}


def run_two_processes(overrides: list[str], folder: Path, launch: tuple[str, ...] = ("trainer=ddp",)) -> dict[str, Any]:
    """``fedlightning <overrides> trainer=ddp`` (2 processes) with its run folder at ``folder``."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    command = [sys.executable, "-m", "fedlightning.cli", *QUIET, *overrides, *launch, f"hydra.run.dir={folder}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "summary.json").read_text())


def records(folder: Path) -> list[dict[str, str]]:
    with (folder / "comm_records.csv").open() as handle:
        return sorted(
            csv.DictReader(handle), key=lambda r: (int(r["round"]), int(r["client"]), r["direction"], r["kind"])
        )


def final_state(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]


@pytest.mark.parametrize(
    "case", [*sorted(CASES), *(pytest.param(c, marks=pytest.mark.slow) for c in sorted(SLOW_CASES))]
)
def test_two_processes_reproduce_one_process_bits_and_accuracy(
    case: str, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    overrides = {**CASES, **SLOW_CASES}[case]
    one = run(make_config(overrides), tmp_path / "one")
    two = run_two_processes(overrides, tmp_path / "two")
    assert two["processes"] == 2 and one["processes"] == 1
    for key in ("comm/uplink_bits_total", "comm/downlink_bits_total", "comm/uplink_messages", "rounds"):
        assert two[key] == one[key], key
    assert records(tmp_path / "two") == records(tmp_path / "one")  # same cohort, same per-client bits
    assert two["test/acc"] == pytest.approx(one["test/acc"], abs=1e-6)
    for key in SAMPLED_METRICS if case == "federated_zampling" else ():  # pooled over both shards
        assert two[key] == pytest.approx(one[key], abs=1e-6), key
    if PROBE in overrides:  # each process evaluated its own half of the test set, none twice
        seen = [json.loads((tmp_path / "two" / f"held_out_{r}.json").read_text())["samples"] for r in (0, 1)]
        (total,) = [json.loads((tmp_path / "one" / "held_out_0.json").read_text())["samples"]]
        assert sum(seen) == total and abs(seen[0] - seen[1]) <= 1, (seen, total)
    if SHARES in overrides:
        epochs = (1, 2, 3, 4) if case == "fedshuffle_unequal_epochs" else (1,)
        check_shares(tmp_path / "two", dealt=case != "top_k_error_feedback", epochs=epochs)
    a, b = final_state(tmp_path / "one"), final_state(tmp_path / "two")
    assert a.keys() == b.keys()
    for name in a:  # float64 sums: summation order moves the float32 result by at most a few ulps
        assert torch.allclose(a[name].float(), b[name].float(), rtol=1e-5, atol=1e-6), name


def test_a_stateless_method_that_keeps_client_state_stops_with_two_processes(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("LOCAL_RANK", None)
    method = "method._target_=tests.share_probe.FedAvgKeepingState"
    command = [sys.executable, "-m", "fedlightning.cli", *QUIET, "rounds=1", method, "trainer=ddp"]
    done = subprocess.run(
        [*command, f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedlightning: error:")]
    assert 1 <= len(errors) <= 2 and "Traceback" not in done.stderr, done.stderr[-3000:]  # a sentence per process
    for line in errors:
        assert "FedAvgKeepingState declares stateless_clients" in line and "set stateless_clients = False" in line


def check_shares(folder: Path, *, dealt: bool, epochs: tuple[int, ...] = (1,)) -> None:
    """Each round's cohort is split between the processes: by load (stateless methods), else by client id mod 2.

    A client's load is its local steps: ``epochs`` (one of them) passes over its data in batches of 32.
    """
    shares = [json.loads((folder / f"shares_{rank}.json").read_text()) for rank in (0, 1)]
    with (folder / "clients.csv").open() as handle:
        steps = {int(row["client"]): math.ceil(int(row["samples"]) / 32) for row in csv.DictReader(handle)}
    for round_idx, first in shares[0].items():
        second = shares[1][round_idx]
        assert first["cohort"] == second["cohort"] and first["loads"] == second["loads"]  # one deal on both
        cohort, loads, mine, theirs = first["cohort"], first["loads"], first["trained"], second["trained"]
        assert sorted(mine + theirs) == sorted(cohort) and not set(mine) & set(theirs)
        if not dealt:
            assert all(c % 2 == 0 for c in mine) and all(c % 2 == 1 for c in theirs), (mine, theirs)
            continue
        assert all(load in {steps[c] * e for e in epochs} for c, load in zip(cohort, loads, strict=True))
        parts = deal_by_load(loads, 2)
        assert mine == [c for c, p in zip(cohort, parts, strict=True) if p == 0]
        load_of = dict(zip(cohort, loads, strict=True))
        dealt_loads = [sum(load_of[c] for c in share) for share in (mine, theirs)]
        by_id = [sum(load_of[c] for c in cohort if c % 2 == r) for r in (0, 1)]
        assert max(dealt_loads) <= max(by_id), (dealt_loads, by_id)  # never worse than the split by client id


def test_plain_ddp_strategy_counts_each_message_once_and_first_process_writes(tmp_path: Path) -> None:
    # The strategy set by hand, not through trainer=ddp: the engine still shards the cohort.
    summary = run_two_processes(["rounds=1"], tmp_path / "two", launch=("trainer.devices=2", "+trainer.strategy=ddp"))
    assert summary["processes"] == 2
    assert summary["comm/uplink_bits_total"] == 10 * 32 * 4810  # 10 clients x float32 digits_mlp, counted once
    rows = records(tmp_path / "two")
    assert len(rows) == 2 * 10  # one downlink and one uplink row per client, not one set per process
    assert len({(r["client"], r["direction"]) for r in rows}) == 20


def test_resume_with_another_process_count_keeps_every_clients_state(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    base = ["+experiment=diana_digits_quick", "compressor=natural_dithering", "eval_every=1", "checkpoint_every=0"]
    straight = run(make_config([*base, "rounds=4"]), tmp_path / "straight")
    run_two_processes([*base, "rounds=2"], tmp_path / "two")
    ckpt = tmp_path / "two" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=False)["client_state"]
    assert {cid for cid in saved if cid >= 0} == set(range(10))  # both processes' DIANA shifts h_i
    resumed = run(make_config([*base, "rounds=4", f"ckpt_path={ckpt}"]), tmp_path / "resumed")
    assert resumed["comm/uplink_bits_total"] == straight["comm/uplink_bits_total"]
    assert resumed["test/acc"] == pytest.approx(straight["test/acc"], abs=1e-6)
    a, b = final_state(tmp_path / "straight"), final_state(tmp_path / "resumed")
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-5, atol=1e-6), name
