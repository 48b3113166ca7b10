"""FedPM (arXiv 2209.15328) and Zhou's supermask (arXiv 1905.01067) on the Zampling engine."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from fedlightning.datamodules import DigitsDataModule, IIDPartition
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.message import Message
from fedlightning.methods.fedpm import FedPM, beta_posterior_mode, signed_constant_weights, smooth_bits
from fedlightning.models.mlp import MLP
from fedlightning.run import run
from fedlightning.sampling import FullParticipation
from tests.conftest import round_trainer

DIGITS = [
    "data=digits",
    "model=digits_mlp",
    "partition=iid",
    "reports.zampling_evaluation.val_samples=2",
    "reports.zampling_evaluation.test_samples=2",
]


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
    """Beta(1, 1) plus K = 10 smoothed bits a round: α + β = 2 + 10 after a reset, 2 + 2·10 when carried."""
    args = ["method=fedpm", *DIGITS, "rounds=2", "method.local_steps=3"]
    states = {}
    for reset in ("never", "every_round"):
        run(make_config([*args, f"method.prior_reset={reset}"]), tmp_path / reset)
        states[reset] = torch.load(tmp_path / reset / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    carried, reset = states["never"], states["every_round"]
    assert torch.allclose(carried["alpha"] + carried["beta"], torch.full_like(carried["alpha"], 2.0 + 2 * 10))
    assert torch.allclose(reset["alpha"] + reset["beta"], torch.full_like(reset["alpha"], 2.0 + 10))
    assert not torch.allclose(carried["p"], reset["p"])  # the carried counts move the server's p differently


def test_supermask_runs_centralised(make_config, tmp_path: Path) -> None:
    summary = run(make_config(["method=supermask", *DIGITS, "data.num_clients=1", "rounds=3"]), tmp_path)
    assert summary["test/acc"] > 0.5  # 3 epochs on digits with lr 100 (chance is 0.1)


class _Uploads(FederatedCallback):
    """Each round's decoded uploads, stacked."""

    def __init__(self) -> None:
        self.rounds: list[Tensor] = []

    def on_round_start(self, trainer: Any, module: Any, round_idx: int) -> None:
        self.rounds.append(torch.zeros(0))

    def on_client_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int, message: Message) -> None:
        z = message.decode().unsqueeze(0)
        self.rounds[-1] = z if self.rounds[-1].numel() == 0 else torch.cat([self.rounds[-1], z])


@pytest.mark.parametrize("prior_reset", ["every_round", "never"])
def test_fedpm_posterior_from_the_round_sums_matches_the_stacked_formula(prior_reset: str) -> None:
    dm = DigitsDataModule(num_clients=3, partition=IIDPartition(), seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = FedPM(
        model=MLP(in_features=64, hidden=[16], num_classes=10),
        datamodule=dm,
        prior_reset=prior_reset,
        local_steps=2,
    )
    uploads = _Uploads()
    trainer = round_trainer(2, [FullParticipation(), uploads], limit_val_batches=0)
    trainer.fit(module)
    # By hand over the stacked masks: alpha = 1 + sum_k v_k, beta = 1 + sum_k (1 - v_k), v = smooth(z).
    rounds = uploads.rounds if prior_reset == "never" else uploads.rounds[-1:]
    v = smooth_bits(torch.cat(rounds).double(), 0.01)
    alpha, beta = 1.0 + v.sum(0), 1.0 + (1.0 - v).sum(0)
    assert torch.allclose(module.alpha.double(), alpha, atol=1e-5)
    assert torch.allclose(module.beta.double(), beta, atol=1e-5)
    assert torch.allclose(module.p.detach().double(), beta_posterior_mode(alpha, beta), atol=1e-6)


@pytest.mark.parametrize("method", ["fedpm", "supermask"])
@pytest.mark.parametrize("setting", ["method.d=5", "method.compression=8", "method.estimator=zampling"])
def test_settings_the_diagonal_methods_fix_are_refused_not_ignored(
    make_config: Any, tmp_path: Path, method: str, setting: str
) -> None:
    from fedlightning.errors import ConfigError

    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"fixes {key}=.*would be ignored; remove it"):
        run(make_config([f"method={method}", "model=digits_mlp", setting, "rounds=1"]), tmp_path)
