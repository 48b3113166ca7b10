"""E-FLoPS on the vectorised backend (stacked clients) equals its loop backend (one client at a time).

Digits, five clients of unequal sizes (a Dirichlet split), three rounds (the first a screening
round of ``off_support_gates=closed``), a small MLP. Both backends run on the CPU from the
same config, seed and streams: the same batches, the same gate noise, the same optimiser maths.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.errors import ConfigError
from fedlightning.federated.failures import ClientFailures
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.message import Message
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import eflops_stacked
from fedlightning.methods.eflops import EFLoPS
from tests.conftest import compose_config, record_calls, round_trainer

ROUNDS, CLIENTS = 3, 5

VARIANT = (
    "method.off_support_gates=resume",
    "method.constraint=inequality",
    "method.penalty=10",
    "method.density_estimator=expected_gate",
    "method.quadrature_nodes=8",
    "method.temperature_schedule=linear",
    "method.temperature=0.01",
    "method.support_allocation=per_tensor",
    "method.density=0.1",
    "method.lambda_lr=10",
    "method.client_optimizer._target_=torch.optim.Adam",
    "method.client_optimizer.lr=0.01",
    "method.log_alpha_lr=0.1",
    "method.log_alpha_min=-4",
    "method.log_alpha_max=0.5",
    "method.max_grad_norm=1.0",
    "method.local_epochs=2",
)
"""E-FLoPS options away from their defaults (a clamp of log α that binds), Adam, clipping and two epochs."""


class _Records(FederatedCallback):
    """Every message's bits, each round's train/loss and E-FLoPS metrics."""

    def __init__(self) -> None:
        self.bits: list[tuple[int, int, str, int]] = []
        self.rounds: list[dict[str, float]] = []

    def on_client_downlink(self, trainer: Any, module: Any, round_idx: int, client_id: int, message: Message) -> None:
        self.bits.append((round_idx, client_id, "down", message.num_bits))

    def on_client_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int, message: Message) -> None:
        self.bits.append((round_idx, client_id, "up", message.num_bits))

    def on_round_end(self, trainer: Any, module: Any, round_idx: int, metrics: dict[str, Any]) -> None:
        keys = ("train/loss", "eflops/local_density", "eflops/lambda")
        self.rounds.append({k: float(metrics[k]) for k in keys})


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _digits() -> DigitsDataModule:
    return DigitsDataModule(num_clients=CLIENTS, seed=0, partition=DirichletPartition(alpha=0.3))


def _eflops(backend: str, overrides: tuple[str, ...] = (), **kwargs: Any) -> EFLoPS:
    """E-FLoPS from ``configs/method/eflops.yaml`` (with ``overrides``), as ``fedlightning.run`` builds it."""
    cfg = compose_config(["method=eflops", *overrides])
    options = {"model": _mlp(), "datamodule": _digits(), "seed": 0, "local_execution": backend, **kwargs}
    module = instantiate(cfg.method, _partial_=True)(**options)
    assert isinstance(module, EFLoPS)
    return module


def _train(
    backend: str, overrides: tuple[str, ...], stragglers: bool, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    module = _eflops(backend, overrides)
    sizes = module.datamodule.client_sizes
    assert len(set(sizes)) == CLIENTS  # unequal clients: padded batches and steps
    stacked = record_calls(monkeypatch, eflops_stacked, "stacked_client_updates")
    looped = record_calls(monkeypatch, EFLoPS, "client_update")
    starts = record_calls(monkeypatch, module, "record_start_losses")
    records = _Records()
    failures = [ClientFailures(straggler_probability=0.6, straggler_fraction=0.5)] if stragglers else []
    round_trainer(ROUNDS, [records, *failures], accelerator="cpu").fit(module)
    monkeypatch.undo()
    return {
        "module": module,
        "stacked_shares": [kw["share"] for _, kw in stacked],
        "client_updates": len(looped),
        "start_losses": torch.cat([args[0].reshape(-1) for args, _ in starts]),
        "records": records,
    }


def _state(module: EFLoPS) -> dict[str, torch.Tensor]:
    """The server state: θ̃, the gate probabilities π = P(z ≠ 0) and λ."""
    pi = module.hc.prob_nonzero(module.log_alpha.detach())
    return {"theta": flat_parameters(module.model), "pi": pi, "lambda": module.lagrange.detach().clone()}


@pytest.mark.parametrize(
    ("overrides", "stragglers"),
    [((), False), (VARIANT, True)],
    ids=["default_config", "resume_inequality_penalty_expected_gate_per_tensor_adam_clip_2_epochs_stragglers"],
)
def test_vectorised_eflops_reproduces_the_loop_state_losses_and_bits(
    overrides: tuple[str, ...], stragglers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Server state within rtol 1e-5 / atol 1e-6, losses within 1e-5 relative, identical bits.

    The tolerance allows for float rounding only: the stacked clients' batched products and
    per-client reductions may round differently from the loop's one-client kernels, and the
    server recovers log α from π through a logit. Any difference in batches, gate noise, step
    counts, optimiser state or dual steps would move the state far beyond it (and change the
    supports, hence the bits, of the messages).
    """
    loop = _train("loop", overrides, stragglers, monkeypatch)
    stacked = _train("vectorised", overrides, stragglers, monkeypatch)

    # the stacked path ran: one call per round for the whole cohort, and no client_update
    assert loop["stacked_shares"] == [] and loop["client_updates"] == ROUNDS * CLIENTS
    assert stacked["stacked_shares"] == [list(range(CLIENTS))] * ROUNDS and stacked["client_updates"] == 0

    before = _state(_eflops("loop", overrides))
    after_loop, after_stacked = _state(loop["module"]), _state(stacked["module"])
    assert not torch.allclose(after_loop["theta"], before["theta"])  # training moved the state
    assert float(after_loop["lambda"]) != 0.0  # the dual variable moved
    for name, value in after_loop.items():
        torch.testing.assert_close(after_stacked[name], value, rtol=1e-5, atol=1e-6, msg=name)

    rounds_loop, rounds_stacked = loop["records"].rounds, stacked["records"].rounds
    assert len(rounds_loop) == len(rounds_stacked) == ROUNDS
    for mine, reference in zip(rounds_stacked, rounds_loop, strict=True):
        for key, value in reference.items():
            assert mine[key] == pytest.approx(value, rel=1e-5), key
    starts_loop, starts_stacked = loop["start_losses"], stacked["start_losses"]
    assert starts_loop.numel() == ROUNDS * CLIENTS  # every client took a step in every round
    torch.testing.assert_close(starts_stacked, starts_loop, rtol=1e-5, atol=0.0)

    # the message sizes depend on the supports only: the same supports give the same bits
    assert sorted(stacked["records"].bits) == sorted(loop["records"].bits)
    assert len(loop["records"].bits) == 2 * ROUNDS * CLIENTS


class _AugmentedDigits(DigitsDataModule):
    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.transform(x + 0.01 * torch.randn(x.shape, generator=generator))


def _dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


def test_default_eflops_is_served_by_the_stacked_clients() -> None:
    assert _eflops("vectorised").stacked_refusal() is None
    assert _eflops("vectorised", VARIANT).stacked_refusal() is None


@pytest.mark.parametrize(
    ("overrides", "kwargs", "reason"),
    [
        (
            ("method.off_support_gates=regrow",),
            {},
            r"method\.off_support_gates=regrow sums each client's gradients at its closed coordinates",
        ),
        (
            ("method.client_optimizer._target_=torch.optim.Adam", "+method.client_optimizer.amsgrad=true"),
            {},
            r"method\.client_optimizer torch\.optim\.Adam\(lr=0\.03, amsgrad=True\) turns on amsgrad",
        ),
        (
            ("method.log_alpha_lr=-1",),
            {},
            r"method\.log_alpha_lr=-1\.0 makes the gates' optimiser unstackable: .* rejected by torch",
        ),
        ((), {"datamodule": _AugmentedDigits(num_clients=CLIENTS, seed=0)}, r"data: _AugmentedDigits augments"),
        (
            (),
            {"model": _dropout_mlp()},
            r"model: its Dropout layers draw from the global random stream, unlike the stacked clients",
        ),
    ],
    ids=["regrow", "amsgrad", "negative_log_alpha_lr", "augmenting_data", "dropout_model"],
)
def test_vectorised_eflops_refuses_what_it_does_not_reproduce_before_training(
    overrides: tuple[str, ...], kwargs: dict[str, Any], reason: str
) -> None:
    module = _eflops("vectorised", overrides, **kwargs)
    why = module.stacked_refusal()
    assert why is not None and not why.endswith(".")
    with pytest.raises(ConfigError, match=rf"^local_execution=vectorised cannot run EFLoPS's clients: {reason}"):
        round_trainer(1, [], accelerator="cpu").fit(module)
