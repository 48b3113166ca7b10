"""The stacked client optimisers equal ``torch.optim`` run per client, bit for bit, under unequal step plans."""

from __future__ import annotations

import doctest
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fedlightning.federated.local import stacked_optim
from fedlightning.federated.local.stacked_optim import (
    StackedAdam,
    StackedAdamW,
    StackedOptimizer,
    StackedSGD,
    refusal,
    stacked_optimizer,
)

# K = 3 clients, 5 steps: client 1 is inactive at step 0, client 2 stops after 2 of the 5 steps.
ACTIVE = torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
# odd sizes and one large enough to be split across threads: every element path of the CPU kernels
SHAPES: dict[str, tuple[int, ...]] = {"w": (5, 7), "b": (3,), "odd": (37,), "big": (300, 257), "scalar": ()}

SETTINGS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd_plain": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "sgd_momentum_dampening_weight_decay": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01},
    ),
    "sgd_nesterov_weight_decay": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    ),
    "adam": (torch.optim.Adam, {"lr": 0.01}),
    "adam_weight_decay": (torch.optim.Adam, {"lr": 0.01, "betas": (0.5, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    "adam_decoupled_weight_decay": (
        torch.optim.Adam,
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    "adamw_no_weight_decay": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.0}),
    "adamw_weight_decay": (torch.optim.AdamW, {"lr": 0.3, "weight_decay": 0.5}),
    "adamw_defaults_foreach_off": (torch.optim.AdamW, {"foreach": False}),
}


def _partial(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``functools.partial``, untyped: some factories here are wrong on purpose."""
    return functools.partial(func, *args, **kwargs)


def _problem(dtype: torch.dtype, seed: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    k, steps = ACTIVE.shape[1], ACTIVE.shape[0]
    start = {n: torch.randn((k, *s), generator=gen, dtype=dtype) for n, s in SHAPES.items()}
    grads = [{n: torch.randn((k, *s), generator=gen, dtype=dtype) for n, s in SHAPES.items()} for _ in range(steps)]
    return start, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_stacked_steps_equal_torch_optimizer_per_client_bit_for_bit(setting: str, dtype: torch.dtype) -> None:
    cls, kwargs = SETTINGS[setting]
    factory = _partial(cls, **kwargs)
    start, grads = _problem(dtype, seed=len(setting))
    stacked = stacked_optimizer(factory)
    assert stacked is not None
    params = {n: t.clone() for n, t in start.items()}
    k = ACTIVE.shape[1]
    clients = [{n: torch.nn.Parameter(start[n][c].clone()) for n in SHAPES} for c in range(k)]
    optimizers = [factory(list(client.values())) for client in clients]
    for step, active in enumerate(ACTIVE):
        before = {n: t.clone() for n, t in params.items()}
        stacked.step_(params, grads[step], active)
        for c in range(k):
            if active[c]:  # torch sees only the client's own active steps
                for n in SHAPES:
                    clients[c][n].grad = grads[step][n][c].clone()
                optimizers[c].step()
            for n in SHAPES:
                torch.testing.assert_close(params[n][c], clients[c][n].detach(), rtol=0, atol=0)
                if not active[c]:
                    assert torch.equal(params[n][c], before[n][c]), (step, c, n)


@pytest.mark.parametrize("setting", ["sgd_momentum_dampening_weight_decay", "adam_weight_decay", "adamw_weight_decay"])
def test_stacked_state_equals_torch_state_per_client(setting: str) -> None:
    cls, kwargs = SETTINGS[setting]
    factory = _partial(cls, **kwargs)
    start, grads = _problem(torch.float32, seed=3)
    stacked = stacked_optimizer(factory)
    assert stacked is not None
    params = {n: t.clone() for n, t in start.items()}
    k = ACTIVE.shape[1]
    clients = [{n: torch.nn.Parameter(start[n][c].clone()) for n in SHAPES} for c in range(k)]
    optimizers = [factory(list(client.values())) for client in clients]
    for step, active in enumerate(ACTIVE):
        stacked.step_(params, grads[step], active)
        for c in range(k):
            if active[c]:
                for n in SHAPES:
                    clients[c][n].grad = grads[step][n][c].clone()
                optimizers[c].step()
    for c in range(k):
        for n in SHAPES:
            theirs = optimizers[c].state[clients[c][n]]
            for key, value in theirs.items():
                ours = stacked.state[n][key][c]
                torch.testing.assert_close(ours, value.reshape(ours.shape), rtol=0, atol=0)


def test_adam_step_counts_are_each_clients_active_steps() -> None:
    adam = StackedAdam(lr=0.1)
    params, grads = {"w": torch.zeros(3, 2)}, {"w": torch.ones(3, 2)}
    for active in ACTIVE:
        adam.step_(params, grads, active)
    assert adam.state["w"]["step"].tolist() == ACTIVE.sum(dim=0).float().tolist() == [5.0, 4.0, 2.0]


def test_sgd_momentum_buffer_starts_at_a_clients_first_active_step() -> None:
    sgd = StackedSGD(lr=0.5, momentum=0.5, dampening=0.5)
    params = {"w": torch.zeros(2, 1)}
    sgd.step_(params, {"w": torch.full((2, 1), 8.0)}, torch.tensor([True, False]))
    sgd.step_(params, {"w": torch.full((2, 1), 2.0)}, torch.tensor([True, True]))
    # client 0: b = 8, then 0.5·8 + 0.5·2 = 5; client 1: b = 2 at its first step (its step-0 gradient unused)
    assert sgd.state["w"]["momentum_buffer"].flatten().tolist() == [5.0, 2.0]
    assert params["w"].flatten().tolist() == [-4.0 - 2.5, -1.0]


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (_partial(torch.optim.SGD, lr=0.1, momentum=0.9, foreach=True), StackedSGD),
        (_partial(torch.optim.Adam, lr=0.1, fused=True), StackedAdam),
        (_partial(torch.optim.Adam, amsgrad=False, maximize=False), StackedAdam),
        (_partial(torch.optim.AdamW, betas=[0.8, 0.9]), StackedAdamW),
    ],
    ids=["sgd_foreach", "adam_fused", "adam_flags_off", "adamw_list_betas"],
)
def test_from_factory_serves_implementation_choices_and_explicit_defaults(factory: Any, expected: type) -> None:
    found = stacked_optimizer(factory)
    assert type(found) is expected
    assert refusal(factory) == ""


def test_from_factory_fills_torchs_defaults() -> None:
    adamw = StackedAdamW.from_factory(_partial(torch.optim.AdamW))
    assert adamw is not None
    assert (adamw.lr, adamw.betas, adamw.eps, adamw.weight_decay) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)
    assert adamw.decoupled_weight_decay


REFUSED: dict[str, Any] = {
    "amsgrad": _partial(torch.optim.Adam, lr=0.1, amsgrad=True),
    "adamw_amsgrad": _partial(torch.optim.AdamW, amsgrad=True),
    "maximize": _partial(torch.optim.SGD, lr=0.1, maximize=True),
    "adam_maximize": _partial(torch.optim.Adam, maximize=True),
    "differentiable": _partial(torch.optim.SGD, lr=0.1, differentiable=True),
    "capturable": _partial(torch.optim.Adam, capturable=True),
    "tensor_lr": _partial(torch.optim.Adam, lr=torch.tensor(0.1)),
    "unknown_keyword": _partial(torch.optim.SGD, lr=0.1, schedule="cosine"),
    "positional": _partial(torch.optim.SGD, [torch.nn.Parameter(torch.zeros(1))]),
    "torch_rejects": _partial(torch.optim.SGD, lr=0.1, nesterov=True),
    "rmsprop": _partial(torch.optim.RMSprop, lr=0.1),
    "not_partial": lambda params: torch.optim.SGD(params, lr=0.1),
    "optimizer_class": torch.optim.SGD,
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_from_factory_returns_none_and_refusal_names_the_config_key(name: str) -> None:
    factory = REFUSED[name]
    assert stacked_optimizer(factory) is None
    for cls in (StackedSGD, StackedAdam, StackedAdamW):
        assert cls.from_factory(factory) is None
    reason = refusal(factory)
    assert reason.startswith("method.client_optimizer") and reason.endswith(".")


def test_step_refuses_gradients_of_another_shape() -> None:
    sgd: StackedOptimizer = StackedSGD(lr=0.1)
    with pytest.raises(ValueError, match="3 clients"):
        sgd.step_({"w": torch.zeros(3, 2)}, {"w": torch.zeros(3, 1)}, torch.ones(3, dtype=torch.bool))


def test_module_doctests_pass() -> None:
    result = doctest.testmod(stacked_optim, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0


@pytest.mark.parametrize(
    "setting", ["sgd_plain", "sgd_nesterov_weight_decay", "adam_weight_decay", "adamw_weight_decay"]
)
def test_per_client_learning_rates_equal_torch_optimizers_with_each_clients_rate_bit_for_bit(setting: str) -> None:
    cls, kwargs = SETTINGS[setting]
    rates = [kwargs.get("lr", 1e-3) * scale for scale in (1.0, 1 / 3, 2.5)]  # e.g. FedShuffle's scaled step sizes
    start, grads = _problem(torch.float32, seed=7)
    stacked = stacked_optimizer(_partial(cls, **kwargs))
    assert stacked is not None
    stacked.set_client_lr(rates)
    params = {n: t.clone() for n, t in start.items()}
    k = ACTIVE.shape[1]
    clients = [{n: torch.nn.Parameter(start[n][c].clone()) for n in SHAPES} for c in range(k)]
    optimizers = [cls(list(client.values()), **{**kwargs, "lr": rates[c]}) for c, client in enumerate(clients)]
    for step, active in enumerate(ACTIVE):
        stacked.step_(params, grads[step], active)
        for c in range(k):
            if active[c]:
                for n, p in clients[c].items():
                    p.grad = grads[step][n][c].clone()
                optimizers[c].step()
            for n in SHAPES:
                torch.testing.assert_close(params[n][c], clients[c][n].detach(), rtol=0, atol=0)


def test_equal_client_rates_at_the_configured_rate_keep_the_single_rate_path() -> None:
    sgd = StackedSGD(lr=0.1)
    sgd.set_client_lr([0.1, 0.1])
    assert sgd.client_lr is None
    sgd.set_client_lr([0.1, 0.2])
    assert sgd.client_lr == [0.1, 0.2]
