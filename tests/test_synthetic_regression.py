"""Synthetic sparse regression: generator facts and the support-recovery metric end to end."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.datamodules.synthetic_regression import SyntheticRegressionDataModule
from fedlightning.metrics import support_recovery
from fedlightning.run import run


def test_generator_sizes_support_and_snr() -> None:
    dm = SyntheticRegressionDataModule(
        num_features=200,
        sparsity=5,
        samples_per_parameter=0.1,
        num_clients=4,
        snr=4.0,
        heterogeneity=1.0,
        num_test=4000,
        val_fraction=0.0,
        seed=1,
    )
    dm.setup("fit")
    assert dm.num_train_samples == round(0.1 * 201) == 20 and dm.client_sizes == [5, 5, 5, 5]
    assert dm.true_support is not None and dm.true_coef is not None
    assert len(dm.true_support) == 5 and torch.count_nonzero(dm.true_coef) == 5
    assert set(torch.nonzero(dm.true_coef).reshape(-1).tolist()) == set(dm.true_support.tolist())
    x, y = dm.test_dataloader().dataset.tensors
    residual = y - x @ dm.true_coef
    signal = x @ dm.true_coef
    snr = float(signal.var() / residual.var())
    assert 3.0 < snr < 5.5  # SNR 4 within sampling error of 4,000 draws and the mixture means
    # heterogeneity: client feature means differ
    m0, m1 = dm.client_tensors(0)[0].mean(0), dm.client_tensors(1)[0].mean(0)
    assert float((m0 - m1).abs().mean()) > 0.5


def test_partition_must_be_iid() -> None:
    with pytest.raises(ValueError, match="partition=iid"):
        SyntheticRegressionDataModule(partition=DirichletPartition(alpha=0.5))


def test_support_recovery_hand_value() -> None:
    assert support_recovery(torch.tensor([0, 2, 5]), torch.tensor([2, 3, 5, 7])) == 0.5


@pytest.mark.parametrize("method", ["eflops", "fediht", "fedavg_prune"])
def test_regression_summary_carries_r2_density_recovery(
    method: str, make_config: Callable[..., object], tmp_path: Path
) -> None:
    cfg = make_config(
        [
            "+experiment=sparse_regression_eflops_quick",
            f"method={method}",
            "rounds=2",
            "data.samples_per_parameter=2.0",
            "data.num_features=50",
            "data.sparsity=3",
            "method.density=0.1",
        ]
    )
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("test/r2", "test/support_recovery", "model/density", "model/macs"):
        assert key in on_disk and np.isfinite(on_disk[key]), key
    m = int(0.1 * 51)
    assert summary["model/density"] <= m / 51 + 1e-9
    assert 0.0 <= summary["test/support_recovery"] <= 1.0
