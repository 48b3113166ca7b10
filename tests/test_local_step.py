"""The engine's in-place SGD and Adam steps equal ``step()`` bit for bit, and are used only where they are exact."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fedlightning.federated.local.steps import adam_step_, clear_grads_, in_place_step, sgd_step_, steps_in_place

SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {"lr": 0.1},
    "momentum": {"lr": 0.05, "momentum": 0.9},
    "momentum_dampening": {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    "nesterov_weight_decay": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    "weight_decay_only": {"lr": 0.1, "weight_decay": 0.01},
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))


ADAM_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "paper_lr": {"lr": 0.1},
    "betas_eps": {"lr": 0.01, "betas": (0.5, 0.99), "eps": 1e-6},
    "weight_decay": {"lr": 0.01, "weight_decay": 0.05},
    "foreach_off": {"lr": 0.02, "foreach": False},
}


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, *, own_step: bool, steps: int = 6) -> None:
    gen = torch.Generator().manual_seed(1)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for _ in range(steps):
        x, y = torch.randn(4, 7, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        if own_step:
            optimizer.zero_grad(set_to_none=True)
        else:
            clear_grads_(params)
        nn.functional.cross_entropy(model(x), y).backward()
        if own_step:
            optimizer.step()
        else:
            step = in_place_step(optimizer)
            assert step is not None
            step(optimizer)


def _assert_same(a: nn.Module, b: nn.Module, opt_a: torch.optim.Optimizer, opt_b: torch.optim.Optimizer) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    state_a, state_b = opt_a.state_dict(), opt_b.state_dict()
    assert state_a["param_groups"] == state_b["param_groups"]
    assert state_a["state"].keys() == state_b["state"].keys()
    for key, entry in state_a["state"].items():
        assert entry.keys() == state_b["state"][key].keys()
        for name, value in entry.items():
            assert torch.equal(value, state_b["state"][key][name])


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_sgd_step_equals_torch_sgd_step_bit_for_bit(name: str) -> None:
    reference, ours = _model(), _model()
    opt_ref = torch.optim.SGD(reference.parameters(), **SETTINGS[name])
    opt_ours = torch.optim.SGD(ours.parameters(), **SETTINGS[name])
    assert steps_in_place(opt_ours)
    _train(reference, opt_ref, own_step=True)
    _train(ours, opt_ours, own_step=False)
    _assert_same(reference, ours, opt_ref, opt_ours)


@pytest.mark.parametrize("name", sorted(ADAM_SETTINGS))
def test_adam_step_equals_torch_adam_step_bit_for_bit(name: str) -> None:
    reference, ours = _model(), _model()
    opt_ref = torch.optim.Adam(reference.parameters(), **ADAM_SETTINGS[name])
    opt_ours = torch.optim.Adam(ours.parameters(), **ADAM_SETTINGS[name])
    assert in_place_step(opt_ours) is adam_step_
    _train(reference, opt_ref, own_step=True, steps=12)
    _train(ours, opt_ours, own_step=False, steps=12)
    _assert_same(reference, ours, opt_ref, opt_ours)


def test_adam_step_follows_each_param_group_and_skips_parameters_without_gradient() -> None:
    reference, ours = _model(), _model()
    for model in (reference, ours):
        model[2].bias.requires_grad_(False)

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        return [
            {"params": list(model[0].parameters()), "lr": 0.2, "betas": (0.8, 0.9)},
            {"params": [model[2].weight, model[2].bias], "lr": 0.01, "weight_decay": 0.1},
        ]

    opt_ref, opt_ours = torch.optim.Adam(groups(reference)), torch.optim.Adam(groups(ours))
    _train(reference, opt_ref, own_step=True)
    _train(ours, opt_ours, own_step=False)
    _assert_same(reference, ours, opt_ref, opt_ours)
    assert ours[2].bias not in opt_ours.state


def test_a_sparse_gradient_in_any_group_leaves_the_whole_step_to_torch_adam() -> None:
    def optimizer_and_dense() -> tuple[torch.optim.Optimizer, nn.Parameter]:
        dense, table = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(4, 2))
        dense.grad = torch.ones(2)
        table.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 2), (4, 2), check_invariants=True)
        return torch.optim.Adam([{"params": [dense]}, {"params": [table]}], lr=0.1), dense

    (reference, dense_ref), (ours, dense) = optimizer_and_dense(), optimizer_and_dense()
    for optimizer, step in ((reference, torch.optim.Adam.step), (ours, adam_step_)):
        with pytest.raises(RuntimeError, match="Adam does not support sparse gradients"):
            step(optimizer)
    # torch steps the dense group before refusing the sparse one; ours must not step it a second time
    assert torch.equal(dense, dense_ref) and ours.state[dense]["step"].item() == 1.0


def test_in_place_adam_only_for_a_plain_adam_on_the_cpu() -> None:
    p = nn.Parameter(torch.zeros(3))
    hooked = torch.optim.Adam([p])
    hooked.register_step_pre_hook(lambda *_: None)
    refused = {
        "AdamW": torch.optim.AdamW([p]),
        "amsgrad": torch.optim.Adam([p], amsgrad=True),
        "maximize": torch.optim.Adam([p], maximize=True),
        "foreach": torch.optim.Adam([p], foreach=True),
        "fused": torch.optim.Adam([p], fused=True),
        "tensor lr": torch.optim.Adam([p], lr=torch.tensor(0.1)),
        "tensor betas": torch.optim.Adam([p], betas=(torch.tensor(0.9), torch.tensor(0.999))),
        "step hook": hooked,
    }
    assert {name: in_place_step(opt) for name, opt in refused.items()} == dict.fromkeys(refused)
    assert in_place_step(torch.optim.SGD([p], lr=0.1)) is sgd_step_


def test_sgd_step_follows_each_param_group_and_skips_parameters_without_gradient() -> None:
    reference, ours = _model(), _model()
    for model in (reference, ours):
        model[2].bias.requires_grad_(False)  # never gets a gradient: no step, no momentum buffer

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        return [
            {"params": list(model[0].parameters()), "lr": 0.2, "momentum": 0.5},
            {"params": [model[2].weight, model[2].bias], "lr": 0.01, "nesterov": True, "momentum": 0.9},
        ]

    opt_ref, opt_ours = torch.optim.SGD(groups(reference), lr=1.0), torch.optim.SGD(groups(ours), lr=1.0)
    _train(reference, opt_ref, own_step=True)
    _train(ours, opt_ours, own_step=False)
    _assert_same(reference, ours, opt_ref, opt_ours)
    assert ours[2].bias not in opt_ours.state
    assert torch.equal(ours[2].bias, _model()[2].bias)


def test_sparse_gradients_take_torch_sgd_own_step() -> None:
    reference = nn.Embedding(10, 3, sparse=True)
    ours = copy.deepcopy(reference)
    opt_ref, opt_ours = torch.optim.SGD(reference.parameters(), lr=0.5), torch.optim.SGD(ours.parameters(), lr=0.5)
    for model, opt, own in ((reference, opt_ref, True), (ours, opt_ours, False)):
        model(torch.tensor([1, 4, 4])).sum().backward()
        assert model.weight.grad is not None and model.weight.grad.is_sparse
        opt.step() if own else sgd_step_(opt)
    assert torch.equal(reference.weight, ours.weight)


def test_steps_in_place_only_for_a_plain_sgd_without_hooks_or_special_modes() -> None:
    p = nn.Parameter(torch.zeros(3))

    class OwnSGD(torch.optim.SGD):
        pass

    hooked = torch.optim.SGD([p], lr=0.1)
    hooked.register_step_post_hook(lambda *_: None)
    refused = {
        "subclass": OwnSGD([p], lr=0.1),
        "Adam": torch.optim.Adam([p]),
        "maximize": torch.optim.SGD([p], lr=0.1, maximize=True),
        "differentiable": torch.optim.SGD([p], lr=0.1, differentiable=True),
        "tensor lr": torch.optim.SGD([p], lr=torch.tensor(0.1)),
        "step hook": hooked,
    }
    assert {name: steps_in_place(opt) for name, opt in refused.items()} == dict.fromkeys(refused, False)
    handle = register_optimizer_step_pre_hook(lambda *_: None)
    try:
        assert not steps_in_place(torch.optim.SGD([p], lr=0.1))  # a global hook must still run
    finally:
        handle.remove()
    assert steps_in_place(torch.optim.SGD([p], lr=0.1, foreach=True))
