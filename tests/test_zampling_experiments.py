"""Smoke tests of the Zampling-family experiment configs, and the slow acceptance runs.

The quick experiment configs run in the default suite; the slow tests reproduce the acceptance
numbers (benchmarks/results/zampling.md) on real MNIST
(``pytest -m slow tests/test_zampling_experiments.py``; 1.5 to 6 minutes each on 2 cores).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fedlightning.run import run

QUICK = [
    "zampling_federated_quick",
    "zampling_federated_mn32_quick",
    "zampling_tradeoff_quick",
    "zampling_vs_supermask_quick",
    "zampling_supermask_baseline_quick",
    "zampling_init_quick",
    "zampling_fedpm_quick",
    "zampling_sensitivity_quick",
]


def test_quick_early_stopping_experiment_runs_and_logs_its_local_epochs(
    make_config, shared_data_root: Path, tmp_path: Path
) -> None:
    cfg = make_config(
        [
            "+experiment=zampling_federated_early_stopping_quick",
            f"data.root={shared_data_root}",
            "rounds=1",
            "logger=csv",
        ]
    )
    summary = run(cfg, tmp_path)
    assert summary["rounds"] == 1 and summary["test/acc_sampled_mean"] > 0.2
    (metrics,) = tmp_path.glob("csv/**/metrics.csv")
    epochs = [float(row["train/local_epochs"]) for row in csv.DictReader(metrics.open()) if row["train/local_epochs"]]
    assert len(epochs) == 1 and 2 <= epochs[0] <= 3  # patience 1: at least 2 epochs, capped at 3


@pytest.mark.parametrize("name", QUICK)
def test_quick_experiment_runs(name: str, make_config, shared_data_root: Path, tmp_path: Path) -> None:
    cfg = make_config(
        [
            f"+experiment={name}",
            f"data.root={shared_data_root}",
            "rounds=1",
            "method.local_steps=5",
            "save_partition=false",
        ]
    )
    summary = run(cfg, tmp_path)
    assert summary["rounds"] == 1
    for key in (
        "test/acc",
        "test/acc_sampled_mean",
        "test/acc_best_mask",
        "test/acc_discretised",
        "model/frozen_fraction",
    ):
        assert key in summary, key
    assert summary["comm/uplink_compression"] >= 1.0
    if name == "zampling_sensitivity_quick":
        for tau in ("0.01", "0.1", "0.2", "0.5"):
            for key in ("acc_expected", "acc_sampled", "sensitivity_sampled", "deviation_expected", "eps_norm"):
                assert f"test/sensitivity/{tau}/{key}" in summary, (tau, key)


def _federated(make_config, root: Path, tmp_path: Path, compression: int, extra: list[str] | None = None) -> dict:
    cfg = make_config(
        [
            "+experiment=zampling_federated",
            f"data.root={root}",
            "rounds=20",
            "seed=0",
            f"method.compression={compression}",
            "reports.zampling_evaluation.val_samples=5",
            *(extra or []),
        ]
    )
    return run(cfg, tmp_path)


@pytest.mark.slow  # 20 MNIST rounds (~90 s); in CI the quick experiment above runs one MNIST round of it
def test_federated_zampling_mnistfc_m_over_n_32(make_config, shared_data_root: Path, tmp_path: Path) -> None:
    s = _federated(make_config, shared_data_root, tmp_path, 32)
    assert s["test/acc"] >= 0.93
    assert s["test/acc_sampled_mean"] >= 0.925
    assert s["comm/uplink_bits_per_client_round"] == 266_610 // 32
    assert s["comm/uplink_compression"] == pytest.approx(32 * 266_610 / (266_610 // 32))


@pytest.mark.slow
def test_federated_zampling_mnistfc_m_over_n_8(make_config, shared_data_root: Path, tmp_path: Path) -> None:
    s = _federated(make_config, shared_data_root, tmp_path, 8, ["method.uplink=arithmetic"])
    assert s["test/acc_sampled_mean"] >= 0.955
    assert s["comm/uplink_compression"] > 256  # entropy coding beats the n bits of bit-packing


@pytest.mark.slow
@pytest.mark.parametrize(("compression", "threshold"), [(1, 0.90), (8, 0.80), (32, 0.52)])
def test_local_zampling_small_mlp(
    compression: int, threshold: float, make_config, shared_data_root: Path, tmp_path: Path
) -> None:
    cfg = make_config(
        [
            "+experiment=zampling_tradeoff",
            f"data.root={shared_data_root}",
            f"method.compression={compression}",
            "seed=0",
        ]
    )
    s = run(cfg, tmp_path)
    assert s["test/acc_sampled_mean"] >= threshold
