"""Multirun grids: experiment configs carry their sweep, and Hydra's joblib launcher runs under our sweeper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from .conftest import CONFIG_DIR, REPO_ROOT


def sweep_jobs(overrides: list[str], arguments: list[str] = ()) -> list[list[str]]:  # type: ignore[assignment]
    """The jobs ``fedlightning -m <overrides> <arguments>`` launches, without running any."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    sweeper = instantiate(cfg.hydra.sweeper)  # as Hydra builds it (its plugin scan re-imports the module)
    return sweeper.job_overrides(list(arguments))


@pytest.mark.parametrize(
    ("experiment", "expected"),
    [
        ("zampling_tradeoff_quick", [["method.compression=1", "seed=0"], ["method.compression=8", "seed=0"]]),
        ("compression_mnist_quick", [["compressor=none"], ["compressor=natural"]]),
        ("compression_mnist_bidir_quick", [["compressor=none"], ["compressor=natural"]]),
        (
            "golub_eflops_quick",
            [
                ["method=eflops", "seed=0"],
                ["method=eflops", "seed=1"],
                ["method=fediht", "seed=0"],
                ["method=fediht", "seed=1"],
            ],
        ),
        ("ocs_mnist_quick", [["sampler=ocs", "seed=0"], ["sampler=uniform", "seed=0"]]),
        ("fedshuffle_heterogeneous_quick", [["method=fedshuffle", "seed=0"], ["method=fedavg_epochs", "seed=0"]]),
    ],
)
def test_quick_experiment_expands_to_its_small_grid(experiment: str, expected: list[list[str]]) -> None:
    assert sweep_jobs([f"+experiment={experiment}"]) == expected


def test_full_experiments_carry_the_papers_grids() -> None:
    zampling = sweep_jobs(["+experiment=zampling_tradeoff"])
    assert len(zampling) == 11 * 5 and zampling[0] == ["method.compression=1", "seed=0"]
    assert zampling[-1] == ["method.compression=1024", "seed=4"]
    compressors = [job[0] for job in sweep_jobs(["+experiment=compression_mnist"])]
    assert compressors == [
        f"compressor={name}"
        for name in ("none", "natural", "natural_dithering", "qsgd", "top_k_ef", "top_k_natural", "induced", "rand_k")
    ]
    golub = sweep_jobs(["+experiment=golub_eflops"])
    assert len(golub) == 3 * 30 and golub[-1] == ["method=fedavg_prune", "seed=29"]
    assert len(sweep_jobs(["+experiment=ocs_mnist"])) == 4 * 3
    assert len(sweep_jobs(["+experiment=fedshuffle_heterogeneous"])) == 5 * 3


def test_command_line_replaces_an_axis_of_the_experiment_grid_and_adds_others() -> None:
    jobs = sweep_jobs(["+experiment=golub_eflops_quick"], ["seed=7", "rounds=1,2"])
    assert jobs == [
        ["method=eflops", "seed=7", "rounds=1"],
        ["method=eflops", "seed=7", "rounds=2"],
        ["method=fediht", "seed=7", "rounds=1"],
        ["method=fediht", "seed=7", "rounds=2"],
    ]


def test_joblib_and_slurm_launcher_configs_compose_under_our_sweeper() -> None:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        joblib = compose(config_name="train", overrides=["hydra/launcher=parallel"], return_hydra_config=True)
        slurm = compose(config_name="train", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
        hydras = compose(config_name="train", overrides=["hydra/launcher=joblib"], return_hydra_config=True)
    assert hydras.hydra.launcher.n_jobs == -1  # Hydra's own joblib config: one worker per core
    assert joblib.hydra.launcher._target_.endswith("JoblibLauncher") and joblib.hydra.launcher.n_jobs == 2
    assert slurm.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert slurm.hydra.launcher.partition is None and slurm.hydra.launcher.timeout_min == 60
    for cfg in (joblib, slurm, hydras):
        assert cfg.hydra.sweeper._target_ == "hydra_plugins.fedlightning_sweep.FedLightningSweeper"


@pytest.mark.slow
def test_joblib_multirun_on_digits_records_every_job(tmp_path: Path) -> None:
    # Jobs 0 and 1 do not compose; jobs 2 (trains) and 3 (fails in run()) run in two joblib workers.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedlightning.cli",
            "-m",
            "hydra/launcher=parallel",
            "method=fedavgg,fedavg",
            "data.num_clients=4,-1",
            "rounds=2",
            "logger=none",
            "trainer.enable_progress_bar=false",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    statuses = {int(p.parent.name): json.loads(p.read_text())["status"] for p in tmp_path.glob("*/status.json")}
    assert statuses == {0: "failed", 1: "failed", 2: "completed", 3: "failed"}
    summary = json.loads((tmp_path / "2" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_clients"] == 4 and summary["rounds"] == 2
    assert not (tmp_path / "3" / "summary.json").exists()
    assert json.loads((tmp_path / "3" / "status.json").read_text())["error"] == (
        "data.num_clients must be at least 1 (got -1)."
    )
    for job in ("0", "1"):
        assert (tmp_path / job / "error.txt").read_text().startswith("method=fedavgg is not a config")
    listing = result.stderr.strip().splitlines()[-4:]
    assert listing[0] == "fedlightning: error: 3 of 4 jobs failed (error.txt in each folder):"
    assert [line.split()[:2] for line in listing[1:]] == [[f"#{n}", str(tmp_path / str(n))] for n in (0, 1, 3)]
