"""FedPM (arXiv 2209.15328) and Zhou's supermask (arXiv 1905.01067) on the Zampling engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedlightning.methods.fedpm import beta_posterior_mode, signed_constant_weights, smooth_bits
from fedlightning.run import run

DIGITS = ["data=digits", "model=digits_mlp", "partition=iid", "method.val_samples=2", "method.test_samples=2"]


def test_reset_prior_mode_is_the_mean_of_smoothed_bits() -> None:
    z = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    v = smooth_bits(z, 0.01)
    alpha, beta = 1.0 + v.sum(0), 1.0 + (1.0 - v).sum(0)
    assert beta_posterior_mode(alpha, beta).tolist() == pytest.approx([0.99, 0.01, 0.5])


def test_signed_constants_are_e_over_sqrt_fan_in() -> None:
    w = signed_constant_weights(torch.full((1000,), 4.0), torch.Generator().manual_seed(0))
    assert torch.allclose(w.abs(), torch.full((1000,), math.e / 2))
    assert 400 < int((w > 0).sum()) < 600


def test_fedpm_runs_and_p_stays_inside_eps(make_config, tmp_path: Path) -> None:
    summary = run(make_config(["method=fedpm", *DIGITS, "rounds=2", "method.local_epochs=1"]), tmp_path)
    p = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]["p"]
    assert float(p.min()) >= 0.01 - 1e-6 and float(p.max()) <= 0.99 + 1e-6
    assert summary["model/frozen_fraction"] == 0.0
    assert summary["comm/uplink_bits_per_client_round"] == 4810  # one bit per weight, n = m


def test_fedpm_carried_prior_differs_from_reset(make_config, tmp_path: Path) -> None:
    args = ["method=fedpm", *DIGITS, "rounds=2", "method.local_steps=3"]
    run(make_config([*args, "method.prior_reset=never"]), tmp_path / "never")
    state = torch.load(tmp_path / "never" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert torch.allclose(state["alpha"] + state["beta"], torch.full_like(state["alpha"], 2.0 + 2 * 10))


def test_supermask_runs_centralised(make_config, tmp_path: Path) -> None:
    summary = run(make_config(["method=supermask", *DIGITS, "data.num_clients=1", "rounds=3"]), tmp_path)
    assert summary["test/acc"] > 0.5  # 3 epochs on digits with lr 100 (chance is 0.1)
