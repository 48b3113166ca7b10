"""End to end: the main job, real MNIST, resume, multirun, W&B, errors, plots, packaging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from fedlightning.errors import FedLightningError
from fedlightning.plotting import main as plot_main
from fedlightning.run import run

from .conftest import REPO_ROOT

SUMMARY_KEYS = {
    "method",
    "data",
    "rounds",
    "test/acc",
    "val/acc_best",
    "comm/uplink_bits_total",
    "comm/downlink_bits_total",
    "comm/uplink_bits_per_client_round",
    "comm/uplink_compression",
    "comm/downlink_compression",
    "time/wall_s",
    "config",
}


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    cmd = [sys.executable, "-m", "fedlightning.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600)


def test_main_job_defaults_reach_090_on_non_iid_digits_within_a_minute(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(["logger=csv"])
    assert cfg.data._target_.endswith("DigitsDataModule") and cfg.partition._target_.endswith("DirichletPartition")
    summary = run(cfg, tmp_path, choices={"method": "fedavg", "data": "digits"})
    assert summary["test/acc"] >= 0.90
    assert summary["time/wall_s"] < 60
    assert set(json.loads((tmp_path / "summary.json").read_text())) >= SUMMARY_KEYS
    for name in (
        "bits_vs_accuracy.png",
        "bits_vs_accuracy.csv",
        "csv/metrics.csv",
        "comm_records.csv",
        "partition.json",
        "clients.csv",
        "checkpoints/last.ckpt",
    ):
        assert (tmp_path / name).is_file(), name
    params = 64 * 64 + 64 + 64 * 10 + 10
    assert summary["comm/uplink_bits_total"] == cfg.rounds * 10 * 32 * params
    assert summary["comm/uplink_bits_per_client_round"] == 32 * params
    assert summary["comm/uplink_compression"] == 1.0
    # The validation rows carry the cumulative bits, the x-axis of accuracy curves.
    header, *rows = (tmp_path / "csv/metrics.csv").read_text().splitlines()
    columns = header.split(",")
    eval_rows = [dict(zip(columns, r.split(","), strict=True)) for r in rows if r.split(",")[columns.index("val/acc")]]
    assert len(eval_rows) == cfg.rounds
    assert all(row["comm/uplink_bits_total"] for row in eval_rows)


def test_mnist_mnistfc_fedavg_reaches_097_in_five_rounds(
    make_config: Callable[..., DictConfig], shared_data_root: Path, tmp_path: Path
) -> None:
    cfg = make_config(
        ["data=mnist", "model=mnistfc", "partition=iid", "rounds=5", "eval_every=5", f"data.root={shared_data_root}"]
    )
    summary = run(cfg, tmp_path)
    assert summary["test/acc"] >= 0.97
    assert summary["comm/uplink_bits_per_client_round"] == 32 * 266_610


def test_resume_from_a_checkpoint_gives_the_same_run(make_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    base = ["rounds=4", "checkpoint_every=2", "sampler=uniform", "clients_per_round=4"]
    straight = run(make_config(base), tmp_path / "straight")
    ckpt = tmp_path / "straight" / "checkpoints" / "round-0002.ckpt"
    assert ckpt.is_file()
    resumed = run(make_config([*base, f"ckpt_path={ckpt}"]), tmp_path / "resumed")
    for key in ("test/acc", "comm/uplink_bits_total", "comm/downlink_bits_total", "val/acc"):
        assert resumed[key] == straight[key], key
    a = torch.load(tmp_path / "straight/checkpoints/last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.num_clients=-3"], "data.num_clients"),
        (["sampler=uniform", "clients_per_round=50"], "clients_per_round=50 exceeds data.num_clients=10"),
        (["rounds=0"], "rounds"),
        (["data=mnist", "data.root=/nonexistent/folder", "model=mnistfc"], "data.root"),
        (["model=mnistfc"], "model=mnistfc expects 784 input features"),
        (["partition.alpha=-1"], "partition.alpha"),
        (["+method.no_such_option=3"], "method"),
    ],
)
def test_bad_input_stops_with_one_sentence(
    make_config: Callable[..., DictConfig], tmp_path: Path, overrides: list[str], message: str
) -> None:
    short = [] if any(o.startswith("rounds=") for o in overrides) else ["rounds=1"]
    with pytest.raises(FedLightningError) as info:
        run(make_config([*short, *overrides]), tmp_path)
    text = str(info.value)
    assert message in text
    assert "\n" not in text.strip()


def test_cli_prints_the_sentence_and_exits_1(tmp_path: Path) -> None:
    result = _cli("data=mnist", "data.root=/nonexistent", "model=mnistfc", f"hydra.run.dir={tmp_path}", cwd=REPO_ROOT)
    assert result.returncode == 1
    assert "fedlightning: error: MNIST" in result.stderr and "data.root" in result.stderr
    assert "Traceback" not in result.stderr
    unknown = _cli("method=nonexistent", f"hydra.run.dir={tmp_path}", cwd=REPO_ROOT)
    assert unknown.returncode != 0 and "method" in unknown.stderr and "fedavg" in unknown.stderr


def test_multirun_runs_every_job_even_when_one_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Jobs 0 and 1 do not compose (method=fedavgg), job 2 fails in run(), job 3 completes.
    result = _cli(
        "-m",
        "method=fedavgg,fedavg",
        "data.num_clients=-1,4",
        "rounds=2",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={tmp_path}",
        cwd=REPO_ROOT,
    )
    assert result.returncode == 1  # the sweep reports its failures
    assert (tmp_path / "3" / "summary.json").is_file()  # ran after the failed jobs
    assert json.loads((tmp_path / "3" / "summary.json").read_text())["status"] == "completed"
    assert json.loads((tmp_path / "3" / "status.json").read_text())["status"] == "completed"
    for job, sentence in [
        ("0", "method=fedavgg is not a config in configs/method/ (did you mean method=fedavg?)"),
        ("1", "method=fedavgg is not a config in configs/method/ (did you mean method=fedavg?)"),
        ("2", "data.num_clients must be at least 1 (got -1)."),
    ]:
        folder = tmp_path / job
        assert not (folder / "summary.json").exists()
        status = json.loads((folder / "status.json").read_text())
        assert status["status"] == "failed" and status["error"].startswith(sentence)
        error = (folder / "error.txt").read_text()
        assert error.startswith(sentence) and "Traceback (most recent call last)" in error
        assert sentence in (folder / "cli.log").read_text()
    listing = result.stderr.strip().splitlines()[-4:]
    assert listing[0] == "fedlightning: error: 3 of 4 jobs failed (error.txt in each folder):"
    assert [line.split()[:3] for line in listing[1:]] == [
        ["#0", str(tmp_path / "0"), "[method=fedavgg"],
        ["#1", str(tmp_path / "1"), "[method=fedavgg"],
        ["#2", str(tmp_path / "2"), "[method=fedavg"],
    ]
    out = tmp_path / "overlay.png"
    plot_main([str(tmp_path), "-o", str(out)])
    assert out.stat().st_size > 10_000
    left_out = capsys.readouterr().err
    assert "left out 3 of 4 job folders:" in left_out
    assert f"{tmp_path / '2'}: failed: data.num_clients must be at least 1 (got -1)." in left_out


def test_multirun_grid_of_seeds_and_partitions(tmp_path: Path) -> None:
    result = _cli(
        "-m",
        "seed=0,1",
        "partition=iid,dirichlet",
        "rounds=2",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={tmp_path}",
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(4)]
    assert {(s["seed"], s["partition"]) for s in summaries} == {
        (0, "iid"),
        (0, "dirichlet"),
        (1, "iid"),
        (1, "dirichlet"),
    }


def test_wheel_ships_the_configs(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO_ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("fedlightning-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedlightning/configs/train.yaml" in names
    assert "fedlightning/configs/method/fedavg.yaml" in names
    assert "fedlightning/configs/hydra/sweeper/fedlightning.yaml" in names
    assert "hydra_plugins/fedlightning_sweep.py" in names  # Hydra finds plugins only in this package


@pytest.mark.parametrize("method", ["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_server_optimisers_train_on_digits(
    make_config: Callable[..., DictConfig], tmp_path: Path, method: str
) -> None:
    # Measured at 50 rounds: fedavgm 0.961, fedadam 0.947, fedyogi 0.947, fedadagrad 0.950.
    summary = run(make_config([f"method={method}", "rounds=25", "eval_every=25"]), tmp_path)
    assert summary["test/acc"] >= 0.85
