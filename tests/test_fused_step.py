"""The fused local step (forward, backward and SGD by hand) equals autograd and torch.optim."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.errors import ConfigError
from fedlightning.federated import module as engine
from fedlightning.federated.local import fused as fused_backend
from fedlightning.federated.local.fused import (
    SGDSettings,
    chain_refusal,
    fused_sgd_step_,
    linear_chain,
    plain_sgd_rates,
    sgd_settings,
)
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import FedAvg, FedShuffle
from fedlightning.models.linear import BinaryLogisticRegression, LogisticRegression
from fedlightning.models.mlp import MLP
from fedlightning.sampling import UniformSampler
from tests.conftest import record_calls, round_trainer


def _mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP(in_features=64, hidden=[32, 16], num_classes=10)


def _batch(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def _autograd_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def test_fused_gradients_equal_autograd_gradients_and_loss() -> None:
    reference, fused = _mlp(), _mlp()
    x, y = _batch()
    expected_loss = nn.functional.cross_entropy(reference(x), y)
    expected_loss.backward()
    loss = fused_sgd_step_(linear_chain(fused), x, y, rates=None)
    assert torch.equal(loss, expected_loss.detach())  # the same forward ops
    for (name, p), q in zip(reference.named_parameters(), fused.parameters(), strict=True):
        assert q.grad is not None, name
        assert torch.allclose(q.grad, p.grad, rtol=1e-5, atol=1e-7), (name, (q.grad - p.grad).abs().max())
        assert torch.equal(q, p), f"{name}: rates=None must not update"


def test_fused_plain_sgd_steps_track_torch_sgd_over_twenty_steps() -> None:
    reference, fused = _mlp(), _mlp()
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    # per-group step sizes: the output layer takes half the step of the others
    layers = linear_chain(fused)
    head = list(layers[-1].parameters())
    body = [p for layer in layers[:-1] for p in layer.parameters()]
    opt = torch.optim.SGD([{"params": body}, {"params": head, "lr": 0.05}], lr=0.1)
    opt_ref = torch.optim.SGD(
        [
            {"params": [p for layer in linear_chain(reference)[:-1] for p in layer.parameters()]},
            {"params": list(linear_chain(reference)[-1].parameters()), "lr": 0.05},
        ],
        lr=0.1,
    )
    rates = plain_sgd_rates(opt, layers)
    assert rates == [(0.1, 0.1), (0.1, 0.1), (0.05, 0.05)]
    gen = torch.Generator().manual_seed(2)
    for _ in range(20):
        x, y = torch.randn(10, 64, generator=gen), torch.randint(0, 10, (10,), generator=gen)
        loss_ref = _autograd_step(reference, opt_ref, x, y)
        loss = fused_sgd_step_(layers, x, y, rates=rates)
        assert loss == pytest.approx(float(loss_ref), rel=1e-5)
    moved = flat_parameters(reference) - flat_parameters(_mlp())
    assert moved.abs().max() > 1e-2  # twenty steps moved the weights
    assert torch.allclose(flat_parameters(fused), flat_parameters(reference), rtol=1e-5, atol=1e-6)


def test_plain_sgd_rates_are_none_with_momentum_or_weight_decay() -> None:
    layer = nn.Linear(2, 2)
    assert plain_sgd_rates(torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9), [layer]) is None
    assert plain_sgd_rates(torch.optim.SGD(layer.parameters(), lr=0.1, weight_decay=1e-4), [layer]) is None
    bias_apart = torch.optim.SGD([{"params": [layer.weight]}, {"params": [layer.bias], "lr": 0.3}], lr=0.1)
    assert plain_sgd_rates(bias_apart, [layer]) == [(0.1, 0.3)]


def test_fused_step_of_logistic_regression_without_bias_equals_autograd() -> None:
    torch.manual_seed(3)
    reference = nn.Sequential(nn.Flatten(), nn.Linear(64, 10, bias=False))
    fused = nn.Sequential(nn.Flatten(), nn.Linear(64, 10, bias=False))
    fused.load_state_dict(reference.state_dict())
    x, y = _batch()
    loss_ref = _autograd_step(reference, torch.optim.SGD(reference.parameters(), lr=0.5), x, y)
    rates = plain_sgd_rates(torch.optim.SGD(fused.parameters(), lr=0.5), linear_chain(fused))
    loss = fused_sgd_step_(linear_chain(fused), x, y, rates=rates)
    assert torch.equal(loss, loss_ref)
    assert torch.allclose(fused[1].weight, reference[1].weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)), "its layer Tanh is not Flatten, Linear or ReLU"),
        (nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), "its Linear layers are not separated by exactly one ReLU"),
        (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.ReLU(), nn.Linear(3, 2)), "its Linear layers are not separated"),
        (nn.Sequential(nn.Linear(4, 3), nn.ReLU()), "it does not start and end with a Linear layer"),
        (nn.Sequential(nn.Linear(4, 3), nn.Flatten(), nn.ReLU(), nn.Linear(3, 2)), "it flattens after its first layer"),
        (nn.Sequential(nn.Flatten(0), nn.Linear(4, 3)), "its Flatten keeps more than the batch dimension"),
        (BinaryLogisticRegression(in_features=4), "BinaryLogisticRegression is not an MLP"),
    ],
    ids=["tanh", "no_relu", "two_relus", "relu_last", "late_flatten", "flatten_batch", "binary_logistic"],
)
def test_chain_refusal_names_what_is_not_a_relu_chain(model: nn.Module, reason: str) -> None:
    refusal = chain_refusal(model)
    assert refusal is not None and refusal.startswith(reason), refusal


def test_chain_refusal_names_hooks_frozen_parameters_and_parametrised_layers() -> None:
    hooked = _mlp()
    hooked.net[1].register_forward_hook(lambda *_: None)
    assert chain_refusal(hooked) == "its Linear has hooks"
    frozen = _mlp()
    frozen.net[1].bias.requires_grad_(False)
    assert chain_refusal(frozen) == "some of its parameters are frozen"
    grad_hooked = _mlp()
    grad_hooked.net[1].weight.register_hook(lambda g: g)
    assert chain_refusal(grad_hooked) == "some of its parameters have gradient hooks"
    pruned = _mlp()
    nn.utils.parametrize.register_parametrization(pruned.net[1], "weight", nn.Identity())
    assert chain_refusal(pruned) == "its layer ParametrizedLinear is not Flatten, Linear or ReLU"
    assert chain_refusal(LogisticRegression(in_features=4, num_classes=3)) is None
    assert [layer.out_features for layer in linear_chain(_mlp())] == [32, 16, 10]


def _fedavg_run(
    backend: str, monkeypatch: pytest.MonkeyPatch, method: type[engine.FederatedModule] = FedAvg, **kwargs: Any
) -> tuple[torch.Tensor, float, int]:
    dm = DigitsDataModule(num_clients=8, seed=0, partition=DirichletPartition(alpha=0.3))
    module = method(model=_mlp(), datamodule=dm, batch_size=16, local_execution=backend, **kwargs)
    calls = record_calls(monkeypatch, fused_backend, "fused_sgd_step_")
    trainer = round_trainer(3, [UniformSampler(clients_per_round=5)])
    trainer.fit(module)
    return flat_parameters(module.model), float(trainer.callback_metrics["train/loss"]), len(calls)


@pytest.mark.parametrize(
    "options",
    [
        {"client_optimizer": functools.partial(torch.optim.SGD, lr=0.1)},
        {
            "client_optimizer": functools.partial(
                torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
            ),
            "local_epochs": 2,
        },
    ],
    ids=["sgd", "nesterov_decay_2_epochs"],
)
def test_fedavg_with_fused_steps_equals_fedavg_with_autograd(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    autograd, loss_a, calls_a = _fedavg_run("loop", monkeypatch, **options)
    fused, loss_f, calls_f = _fedavg_run("auto", monkeypatch, **options)
    assert calls_a == 0 and calls_f > 0  # auto took the fused backend on this MLP, loop never did
    assert not torch.equal(autograd, flat_parameters(_mlp()))
    assert torch.allclose(fused, autograd, rtol=1e-4, atol=2e-6), (fused - autograd).abs().max()
    assert loss_f == pytest.approx(loss_a, rel=1e-5)


def test_fedshuffle_clients_with_their_own_step_sizes_take_fused_steps_equal_to_autograd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options: dict[str, Any] = {
        "method": FedShuffle,
        "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05),
        "local_epochs": [1, 3],  # each client's epochs drawn per round, its step size scaled to them
    }
    autograd, loss_a, calls_a = _fedavg_run("loop", monkeypatch, **options)
    fused, loss_f, calls_f = _fedavg_run("auto", monkeypatch, **options)
    assert calls_a == 0 and calls_f > 0
    assert torch.allclose(fused, autograd, rtol=1e-4, atol=2e-6), (fused - autograd).abs().max()
    assert loss_f == pytest.approx(loss_a, rel=1e-5)


def test_auto_keeps_autograd_where_gradients_are_clipped(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, calls = _fedavg_run("auto", monkeypatch, max_grad_norm=1.0)
    assert calls == 0


def test_local_execution_fused_refuses_a_model_it_cannot_step_before_training() -> None:
    dm = DigitsDataModule(num_clients=4, seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))
    module = FedAvg(model=model, datamodule=dm, local_execution="fused")
    before = flat_parameters(module.model)
    with pytest.raises(
        ConfigError,
        match=r"^local_execution=fused cannot run FedAvg's clients: its model cannot: "
        r"its layer Tanh is not Flatten, Linear or ReLU; set local_execution=auto or loop\.$",
    ):
        round_trainer(1, []).fit(module)
    assert torch.equal(flat_parameters(module.model), before)  # refused before any round


def test_local_execution_fused_refuses_mixed_precision_and_auto_keeps_autograd_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dm = DigitsDataModule(num_clients=4, seed=0)
    module = FedAvg(model=_mlp(), datamodule=dm, local_execution="fused")
    with pytest.raises(ConfigError, match=r"trainer\.precision=bf16-mixed runs the forward pass under autocast"):
        round_trainer(1, [], precision="bf16-mixed").fit(module)
    calls = record_calls(monkeypatch, fused_backend, "fused_sgd_step_")
    module = FedAvg(model=_mlp(), datamodule=dm)
    round_trainer(1, [], precision="bf16-mixed").fit(module)
    assert calls == []


def test_local_execution_fused_stops_at_a_client_whose_optimiser_it_cannot_serve_and_auto_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = register_optimizer_step_pre_hook(lambda *_: None)  # every step must go through step()
    try:
        module = FedAvg(model=_mlp(), datamodule=DigitsDataModule(num_clients=4, seed=0), local_execution="fused")
        refusal = r"the client optimiser is not a plain torch\.optim\.SGD without step hooks"
        with pytest.raises(ConfigError, match=refusal):
            round_trainer(1, []).fit(module)
        calls = record_calls(monkeypatch, fused_backend, "fused_sgd_step_")
        module = FedAvg(model=_mlp(), datamodule=DigitsDataModule(num_clients=4, seed=0))
        round_trainer(1, []).fit(module)
        assert calls == []
        assert not torch.equal(flat_parameters(module.model), flat_parameters(_mlp()))  # trained by autograd
    finally:
        hook.remove()


def test_local_execution_rejects_an_unknown_backend_name_in_one_sentence() -> None:
    with pytest.raises(
        ConfigError, match=r"^local_execution is auto, loop, fused or vectorised \(got 'vectorized'\)\.$"
    ):
        FedAvg(model=_mlp(), datamodule=DigitsDataModule(num_clients=4, seed=0), local_execution="vectorized")  # type: ignore[arg-type]


def test_only_plain_sgd_factories_are_read() -> None:
    assert sgd_settings(functools.partial(torch.optim.SGD, lr=0.1, nesterov=True, momentum=0.9)) == SGDSettings(
        lr=0.1, momentum=0.9, nesterov=True
    )
    assert sgd_settings(functools.partial(torch.optim.SGD, lr=0.1, maximize=True)) is None
    assert sgd_settings(lambda p: torch.optim.SGD(p, lr=0.1)) is None
