"""The vectorised backend (stacked clients, vmap) equals the loop backend on the same batches."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.errors import ConfigError
from fedlightning.federated.local import VectorisedRunner
from fedlightning.federated.local import vectorised as vectorised_backend
from fedlightning.federated.local.vectorised import plan_steps
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import FedAvg, FedShuffle
from fedlightning.sampling import UniformSampler
from tests.conftest import record_calls, round_trainer


def _gn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.GroupNorm(4, 16), nn.ReLU(), nn.Linear(16, 10))


def _run(
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    callbacks: tuple[Any, ...] = (),
    method: type[FedAvg] = FedAvg,
    **kwargs: Any,
) -> tuple[torch.Tensor, float]:
    dm = DigitsDataModule(num_clients=8, seed=0, partition=DirichletPartition(alpha=0.3))
    assert len(set(dm.client_sizes)) > 1  # unequal clients: padded batches and steps
    module = method(model=_gn_model(), datamodule=dm, batch_size=16, local_execution=backend, **kwargs)
    calls = record_calls(monkeypatch, vectorised_backend, "train_stacked")
    trainer = round_trainer(2, [UniformSampler(clients_per_round=5), *callbacks])
    trainer.fit(module)
    cohorts = [kw["plan"].index.shape[0] for _, kw in calls]
    assert cohorts == ([5, 5] if backend == "vectorised" else [])  # one stacked call per round, the whole cohort
    return flat_parameters(module.model), float(trainer.callback_metrics["train/loss"])


@pytest.mark.parametrize(
    "options",
    [
        {"client_optimizer": functools.partial(torch.optim.SGD, lr=0.1)},
        {
            "client_optimizer": functools.partial(
                torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
            ),
            "max_grad_norm": 0.5,
            "local_epochs": 2,
        },
        {
            "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5, dampening=0.1),
            "local_steps": 7,
        },
        {"client_optimizer": functools.partial(torch.optim.Adam, lr=0.01, weight_decay=1e-3), "local_epochs": 2},
        {"client_optimizer": functools.partial(torch.optim.AdamW, lr=0.01, betas=(0.8, 0.99)), "max_grad_norm": 0.5},
    ],
    ids=["sgd", "nesterov_decay_clip_2_epochs", "momentum_dampening_7_steps", "adam_l2_2_epochs", "adamw_clip"],
)
def test_vectorised_backend_equals_the_loop_on_the_same_batches(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sequential, loss_s = _run("loop", monkeypatch, **options)
    vectorised, loss_v = _run("vectorised", monkeypatch, **options)
    assert not torch.equal(sequential, flat_parameters(_gn_model()))  # training moved the model
    assert torch.allclose(vectorised, sequential, rtol=1e-4, atol=2e-6), (vectorised - sequential).abs().max()
    assert loss_v == pytest.approx(loss_s, rel=1e-5)


def test_padded_plan_masks_short_batches_and_missing_steps() -> None:
    plan = plan_steps([[torch.tensor([2, 0, 1]), torch.tensor([3])], [torch.tensor([1, 0])]], [0, 4], 3)
    assert plan.steps.tolist() == [2, 1]
    assert plan.active.tolist() == [[True, True], [True, False]]
    assert plan.mask.sum().item() == 6 and plan.index[1, 0, :2].tolist() == [5, 4]


class _OwnMomentum(FedAvg):
    def make_client_optimizer(self, params: Any, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        optimizer = super().make_client_optimizer(params, client_id=client_id, round_idx=round_idx)
        optimizer.param_groups[0]["momentum"] = 0.5 if client_id % 2 else 0.9
        return optimizer


class _OwnLocalWork(FedAvg):
    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().local_loss(model, x, y) + 0.0


@pytest.mark.parametrize(
    ("cls", "optimizer", "reason"),
    [
        (
            FedAvg,
            functools.partial(torch.optim.Adam, lr=0.01, amsgrad=True),
            r"method\.client_optimizer torch\.optim\.Adam\(lr=0\.01, amsgrad=True\) turns on amsgrad",
        ),
        (_OwnLocalWork, functools.partial(torch.optim.SGD, lr=0.1), r"its local work is its own \(local_loss\)"),
        (
            _OwnMomentum,
            functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
            r"its make_client_optimizer gives client \d+ an optimiser that differs from method\.client_optimizer "
            r"in more than its learning rate; set local_execution=loop\.$",
        ),
    ],
)
def test_local_execution_vectorised_on_a_method_it_cannot_serve_is_refused_before_training(
    cls: type[FedAvg], optimizer: Any, reason: str
) -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    module = cls(model=_gn_model(), datamodule=dm, client_optimizer=optimizer, local_execution="vectorised")
    with pytest.raises(ConfigError, match=rf"^local_execution=vectorised cannot run .*'s clients: {reason}"):
        round_trainer(1, []).fit(module)


@pytest.mark.slow
def test_config_key_runs_the_default_job_vectorised_as_the_loop(make_config: Any, tmp_path: Any) -> None:
    from fedlightning.run import run

    base = ["rounds=2", "checkpoint_every=0"]
    loop = run(make_config([*base, "local_execution=loop"]), tmp_path / "loop")
    stacked = run(make_config([*base, "local_execution=vectorised"]), tmp_path / "stacked")  # Hydra's SGD partial
    assert stacked["test/acc"] == pytest.approx(loop["test/acc"], abs=1 / 300)  # at most one flipped prediction
    a, b = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt")["state_dict"] for d in ("loop", "stacked"))
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4, atol=2e-6), name


def test_config_refuses_a_named_backend_that_cannot_serve_before_training(make_config: Any, tmp_path: Any) -> None:
    from fedlightning.run import run

    with pytest.raises(
        ConfigError, match=r"local_execution=vectorised cannot run FedIHT's clients: its local work is its own"
    ):
        run(make_config(["rounds=1", "method=fediht", "local_execution=vectorised"]), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"local_execution .* must be"):
        run(make_config(["rounds=1", "local_execution=sometimes"]), tmp_path / "typo")


def test_vectorised_backend_with_stragglers_equals_the_loop_with_the_same_step_budgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedlightning.federated.failures import ClientFailures

    def stragglers() -> ClientFailures:
        return ClientFailures(straggler_probability=0.6, straggler_fraction=0.5)

    options = {"client_optimizer": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), "local_epochs": 2}
    sequential, loss_s = _run("loop", monkeypatch, (stragglers(),), **options)
    vectorised, loss_v = _run("vectorised", monkeypatch, (stragglers(),), **options)
    full, _ = _run("loop", monkeypatch, **options)
    assert not torch.allclose(sequential, full, rtol=1e-4, atol=2e-6)  # the budgets cut steps
    assert torch.allclose(vectorised, sequential, rtol=1e-4, atol=2e-6), (vectorised - sequential).abs().max()
    assert loss_v == pytest.approx(loss_s, rel=1e-5)


def test_client_failures_without_stragglers_keep_the_vectorised_cohort_and_ask_no_step_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedlightning.federated.failures import ClientFailures

    asked: list[int] = []
    original = ClientFailures.local_step_budget

    def counted(self: ClientFailures, *args: Any) -> int | None:
        asked.append(args[3])
        return original(self, *args)

    monkeypatch.setattr(ClientFailures, "local_step_budget", counted)
    dm = DigitsDataModule(num_clients=3, seed=0)
    module = FedAvg(model=_gn_model(), datamodule=dm, client_optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    trainer = round_trainer(1, [ClientFailures(dropout=0.5)])
    trainer.fit(module)
    assert VectorisedRunner().refusal(module) is None  # drop-outs alone do not touch local steps
    assert asked == []
    round_trainer(1, [ClientFailures(straggler_probability=1.0, straggler_fraction=0.5)]).fit(module)
    assert sorted(asked) == [0, 1, 2]  # asked once per client when stragglers are on


@pytest.mark.parametrize(
    "options",
    [
        # FedShuffle: epochs drawn per client and round, step sizes scaled to them
        {"local_epochs": [1, 3], "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5)},
        {
            "local_epochs": [1, 3],
            "update_scaling": "fednova",
            "step_size": "fedavg",
            "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05),
        },
    ],
    ids=["fedshuffle", "fednova"],
)
def test_fedshuffle_family_on_the_vectorised_backend_equals_the_loop(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sequential, loss_s = _run("loop", monkeypatch, method=FedShuffle, **options)
    vectorised, loss_v = _run("vectorised", monkeypatch, method=FedShuffle, **options)
    assert not torch.equal(sequential, flat_parameters(_gn_model()))
    assert torch.allclose(vectorised, sequential, rtol=1e-4, atol=2e-6), (vectorised - sequential).abs().max()
    assert loss_v == pytest.approx(loss_s, rel=1e-5)


def test_the_vectorised_backend_refuses_a_model_with_dropout_whose_masks_the_loop_draws_globally() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 10))
    module = FedAvg(model=model, datamodule=DigitsDataModule(num_clients=3, seed=0))
    assert VectorisedRunner().refusal(module) == (
        "model: its Dropout layers draw from the global random stream, unlike the stacked clients"
    )
