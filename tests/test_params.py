"""The flat layout of a model's parameters (fedlightning/federated/params.py) and the engine's use of it."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.federated import module as engine
from fedlightning.federated.params import assign_flat_, flat_difference, flat_parameters, flat_view, lay_out_flat_
from fedlightning.methods import FedAvg
from fedlightning.models.mlp import MLP
from fedlightning.sampling import UniformSampler
from tests.conftest import round_trainer


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def test_laid_out_parameters_are_consecutive_slices_of_one_tensor_with_their_identity_and_values() -> None:
    net = _net()
    params_before = list(net.parameters())
    values_before = flat_parameters(net)
    flat = lay_out_flat_(net)
    assert flat is not None and flat_view(net) is flat
    assert list(net.parameters()) == params_before  # the same Parameter objects: optimisers keep working
    assert torch.equal(flat, values_before)
    offset = 0
    for p in net.parameters():
        assert p.data_ptr() == flat.data_ptr() + offset * flat.element_size()
        offset += p.numel()
    assert offset == flat.numel() == 5 * 4 + 4 + 4 * 3 + 3


def test_assign_and_difference_of_a_laid_out_model_equal_the_per_parameter_paths() -> None:
    laid_out, separate = _net(), _net()
    lay_out_flat_(laid_out)
    reference = torch.randn(flat_parameters(separate).numel(), generator=torch.Generator().manual_seed(1))
    assign_flat_(laid_out, reference)
    assign_flat_(separate, reference)
    assert torch.equal(flat_parameters(laid_out), reference)
    for net in (laid_out, separate):  # the same SGD step on both
        net(torch.ones(2, 5)).square().sum().backward()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(p.grad, alpha=-0.1)
    assert torch.equal(flat_difference(laid_out, reference), flat_difference(separate, reference))
    assert torch.equal(flat_difference(laid_out, reference), flat_parameters(laid_out) - reference)


def test_a_parameter_given_other_storage_ends_the_flat_view_and_every_parameter_is_still_assigned() -> None:
    net = _net()
    flat = lay_out_flat_(net)
    assert flat is not None
    last = list(net.parameters())[-1]
    last.data = last.data.clone()  # no longer a slice of flat
    assert flat_view(net) is None
    target = torch.arange(flat.numel(), dtype=torch.float32)
    assign_flat_(net, target)
    assert torch.equal(flat_parameters(net), target)
    assert torch.equal(flat_difference(net, target), torch.zeros_like(target))


def test_a_module_with_parameters_of_two_dtypes_is_not_laid_out() -> None:
    net = _net()
    net[2].double()
    assert lay_out_flat_(net) is None and flat_view(net) is None


def test_a_deep_copy_of_a_laid_out_model_is_not_a_view_of_the_original_flat_tensor() -> None:
    net = _net()
    flat = lay_out_flat_(net)
    twin = copy.deepcopy(net)
    assert flat_view(twin) is None
    assign_flat_(twin, torch.zeros_like(flat))
    assert torch.equal(flat_parameters(net), flat) and bool(flat.abs().sum() > 0)


def _mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=[32, 16], num_classes=10)


def _fedavg_model(backend: str) -> tuple[torch.Tensor, FedAvg]:
    model = _mlp()
    dm = DigitsDataModule(num_clients=8, seed=0, partition=DirichletPartition(alpha=0.3))
    module = FedAvg(
        model=model,
        datamodule=dm,
        batch_size=16,
        local_execution=backend,
        client_optimizer=functools.partial(torch.optim.SGD, lr=0.1),
    )
    round_trainer(3, [UniformSampler(clients_per_round=5)]).fit(module)
    return flat_parameters(module.model), module


@pytest.mark.parametrize("backend", ["fused", "loop"])
def test_fedavg_on_the_laid_out_client_model_gives_the_bits_of_separate_parameters(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    laid_out, module = _fedavg_model(backend)
    assert flat_view(module.client_model) is not None  # the engine laid its client model out
    monkeypatch.setattr(engine, "lay_out_flat_", lambda model: None)
    separate, module = _fedavg_model(backend)
    assert flat_view(module.client_model) is None
    assert not torch.equal(laid_out, flat_parameters(_mlp()))  # it trained
    assert torch.equal(laid_out, separate)
