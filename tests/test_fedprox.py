"""FedProx: the proximal term, μ = 0 as FedAvg, and every backend that serves it equal to the loop."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.errors import ConfigError
from fedlightning.federated.local import FusedRunner, choose_runner
from fedlightning.federated.local import vectorised as vectorised_backend
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import FedAvg, FedProx
from fedlightning.methods.fedprox import proximal_term
from fedlightning.models.mlp import MLP
from fedlightning.sampling import UniformSampler
from tests.conftest import record_calls, round_trainer

# A gentle optimiser and few steps: the two backends then differ only by float rounding, which a
# long chaotic local run (many steps at a large rate) would amplify into a real difference.
SGD = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5)


def _gn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.GroupNorm(4, 16), nn.ReLU(), nn.Linear(16, 10))


def _fit(method: type[FedAvg], backend: str = "loop", model: nn.Module | None = None, **kwargs: Any) -> FedAvg:
    dm = DigitsDataModule(num_clients=6, seed=0, partition=DirichletPartition(alpha=0.3))
    module = method(
        model=model if model is not None else _gn_model(),
        datamodule=dm,
        batch_size=16,
        client_optimizer=SGD,
        local_execution=backend,
        local_steps=8,
        **kwargs,
    )
    round_trainer(2, [UniformSampler(clients_per_round=4)]).fit(module)
    return module


def test_proximal_term_gradient_is_mu_times_the_distance_to_the_received_model() -> None:
    w = {"a": torch.tensor([1.0, -2.0], requires_grad=True), "b": torch.tensor([[3.0]], requires_grad=True)}
    w_t = {"a": torch.tensor([0.5, 0.0]), "b": torch.tensor([[1.0]])}
    term = proximal_term(w, w_t, mu=0.2)
    assert float(term.detach()) == pytest.approx(0.1 * (0.25 + 4.0 + 4.0))
    term.backward()
    assert w["a"].grad.tolist() == pytest.approx([0.1, -0.4])  # type: ignore[union-attr]
    assert w["b"].grad.flatten().tolist() == pytest.approx([0.4])  # type: ignore[union-attr]


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit() -> None:
    assert torch.equal(flat_parameters(_fit(FedProx, mu=0.0).model), flat_parameters(_fit(FedAvg).model))


def test_a_large_mu_keeps_the_clients_near_the_received_model() -> None:
    start = flat_parameters(_gn_model())
    free = (flat_parameters(_fit(FedAvg).model) - start).norm()
    held = (flat_parameters(_fit(FedProx, mu=5.0).model) - start).norm()
    assert 0 < held < 0.7 * free


def test_fedprox_on_the_vectorised_backend_equals_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record_calls(monkeypatch, vectorised_backend, "train_stacked")
    loop = flat_parameters(_fit(FedProx, mu=0.5).model)
    assert calls == []
    stacked = flat_parameters(_fit(FedProx, backend="vectorised", mu=0.5).model)
    assert len(calls) == 2 and calls[0][1]["penalty"] is not None  # one stacked call per round, with the term
    assert torch.allclose(stacked, loop, rtol=1e-4, atol=2e-6), (stacked - loop).abs().max()
    assert not torch.allclose(loop, flat_parameters(_fit(FedAvg).model), rtol=1e-4, atol=2e-6)


def test_the_fused_backend_refuses_a_penalised_loss_and_auto_takes_the_loop() -> None:
    torch.manual_seed(0)
    module = FedProx(model=MLP(in_features=64, hidden=[16], num_classes=10), datamodule=DigitsDataModule(num_clients=3))
    assert FusedRunner().refusal(module) == (
        "its local loss adds a term (local_penalty) that the hand-taken steps do not differentiate"
    )
    assert choose_runner(module, "auto")[0].name == "loop"


def test_a_negative_mu_is_refused_in_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"^method\.mu is FedProx's proximal weight μ and must be at least 0"):
        FedProx(model=_gn_model(), datamodule=DigitsDataModule(num_clients=3), mu=-0.1)


def test_a_penalty_that_a_methods_own_client_update_would_ignore_is_refused_in_one_sentence() -> None:
    from fedlightning.methods import FedIHT

    class PenalisedIHT(FedIHT):  # FedIHT trains its clients through its own client_update
        def local_penalty(self, params: Any, received: Any) -> torch.Tensor:
            return proximal_term(params, received, mu=0.1)

    with pytest.raises(ConfigError, match=r"^PenalisedIHT defines local_penalty but has its own client_update"):
        PenalisedIHT(model=_gn_model(), datamodule=DigitsDataModule(num_clients=3), density=0.5)
