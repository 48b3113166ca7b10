"""FjORD's stacked local work (arXiv 2102.13451) on the vectorised backend equals the loop backend.

Tolerances are those of tests/test_vectorised_cohort.py: models within rtol 1e-4, atol 2e-6
(a vmapped pass batches the clients' matrix products; masked means sum in another order), losses
within 1e-5 relative; the traffic is the same message for message.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import DirichletPartition
from fedlightning.errors import ConfigError
from fedlightning.federated.local import choose_runner
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import fjord_stacked
from fedlightning.methods.fjord import ExtendedFederatedDropout, FjORD
from fedlightning.models.presets import build_model
from fedlightning.sampling import UniformSampler
from tests.conftest import record_calls, round_trainer

SGD = functools.partial(torch.optim.SGD, lr=0.1, weight_decay=1e-4)  # configs/method/fjord.yaml's client


class _NoisyDigits(DigitsDataModule):
    """Digits whose client batches get Gaussian noise from the client's ``augment`` stream."""

    def augment(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return self.transform(x + 0.1 * torch.randn(x.shape, generator=generator).to(x))


def _digits(num_clients: int = 6, data: type[DigitsDataModule] = DigitsDataModule) -> DigitsDataModule:
    dm = data(num_clients=num_clients, seed=0, partition=DirichletPartition(alpha=0.3))
    dm.setup("fit")
    return dm


def _fjord(dm: DigitsDataModule, *, model: str = "digits_mlp", method: type[FjORD] = FjORD, **kwargs: Any) -> FjORD:
    torch.manual_seed(0)
    options: dict[str, Any] = {"client_optimizer": SGD, "batch_size": 16}
    options.update(kwargs)
    net = build_model(model, input_shape=(1, 8, 8), num_classes=10, **options.pop("model_options", {}))
    return method(model=net, datamodule=dm, **options)


def _run(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> dict[str, Any]:
    dm = _digits(data=kwargs.pop("data", DigitsDataModule))
    assert len(set(dm.client_sizes)) == dm.num_clients  # unequal clients: padded batches and steps
    module = _fjord(dm, local_execution=backend, **kwargs)
    assert len(set(module.client_tier)) >= 3  # clients of several tiers
    calls = record_calls(monkeypatch, fjord_stacked, "stacked_client_updates")
    records = tmp_path / f"{backend}.csv"
    trainer = round_trainer(3, [UniformSampler(clients_per_round=5), CommunicationAccountant(records_path=records)])
    trainer.fit(module)
    with records.open() as handle:
        rows = list(csv.DictReader(handle))
    return {
        "model": flat_parameters(module.model),
        "loss": float(trainer.callback_metrics["train/loss"]),
        "traffic": [(r["round"], r["client"], r["direction"], r["bits"], r["codec"]) for r in rows],
        "shares": [kw["share"] for _, kw in calls],
        "per_client_received": [len(kw["received_by_client"]) for _, kw in calls],
    }


@pytest.mark.parametrize(
    "options",
    [
        {},  # self-distillation (α = 1, T = 1), SGD with weight decay, one local epoch
        {
            "adaptive_dropout": 0.25,
            "kd_alpha": 0.5,
            "kd_temperature": 2.0,
            "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True),
            "max_grad_norm": 0.5,
            "local_steps": 7,
        },
        {
            "distillation": False,
            "client_optimizer": functools.partial(torch.optim.Adam, lr=0.01, weight_decay=1e-3),
            "local_epochs": 2,
        },
        {
            "model": "digits_cnn",
            "tiers": [0.4, 0.6, 1.0],
            "drop_scale": 0.9,
            "client_optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5, dampening=0.1),
        },
        {"client_optimizer": functools.partial(torch.optim.AdamW, lr=0.01, betas=(0.8, 0.99)), "max_grad_norm": 0.5},
        {"data": _NoisyDigits},
        {"model": "fjord_femnist_cnn", "model_options": {"channels": [6, 10]}},
    ],
    ids=[
        "distillation_sgd",
        "adaptive_kd_mix_nesterov_clip_7_steps",
        "adam_no_distillation_2_epochs",
        "cnn_momentum",
        "adamw_clip",
        "augment",
        "fjord_femnist_cnn",
    ],
)
def test_vectorised_fjord_equals_the_loop_in_model_losses_and_traffic(
    options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = _run("loop", tmp_path, monkeypatch, **options)
    stacked = _run("vectorised", tmp_path, monkeypatch, **options)
    assert loop["shares"] == [] and [len(s) for s in stacked["shares"]] == [5, 5, 5]  # the stacked path, each round
    assert stacked["per_client_received"] == [5, 5, 5]  # each client's own slice, from the backend
    start = flat_parameters(_fjord(_digits(), **{k: v for k, v in options.items() if k != "data"}).model)
    assert not torch.equal(loop["model"], start)  # training moved the model
    diff = (stacked["model"] - loop["model"]).abs().max()
    assert torch.allclose(stacked["model"], loop["model"], rtol=1e-4, atol=2e-6), diff
    assert stacked["loss"] == pytest.approx(loop["loss"], rel=1e-5)
    # the same messages (the backend observes a share's downlinks before its uploads; the loop interleaves them)
    assert sorted(stacked["traffic"]) == sorted(loop["traffic"]) and len(loop["traffic"]) == 3 * 5 * 2


def _budget(module: FjORD, budgets: dict[int, int]) -> None:
    """Cut client c's local steps to ``budgets[c]`` (as a straggler callback would)."""
    module._budget_callbacks = [object()]  # type: ignore[list-item]
    module.local_step_budget = lambda *, client_id, round_idx, planned: min(planned, budgets[client_id])  # type: ignore[method-assign]


@pytest.mark.parametrize("own_messages", [True, False], ids=["received_by_client", "broadcast"])
def test_stacked_updates_equal_each_clients_client_update_and_record_start_losses_of_clients_that_stepped(
    own_messages: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = _digits()
    module = _fjord(dm, adaptive_dropout=0.25, kd_alpha=0.3, local_steps=6)
    _budget(module, {0: 6, 1: 0, 2: 3, 3: 1, 4: 6, 5: 4})  # unequal steps, client 1 takes none
    share = [5, 0, 1, 2, 3, 4]
    broadcast = flat_parameters(module.model)
    own = [broadcast[module.client_indices(c, 2)].clone() for c in share]
    starts = record_calls(monkeypatch, module, "record_start_losses")
    loop = [module.client_update(client_id=c, round_idx=2, received=r) for c, r in zip(share, own, strict=True)]
    loop_starts = torch.cat([args[0] for args, _ in starts])
    starts.clear()
    stacked = module.stacked_client_updates(
        round_idx=2,
        share=share,
        received=own[-1] if own_messages else broadcast,
        **({"received_by_client": own} if own_messages else {}),
    )
    assert len(starts) == 1 and len(loop_starts) == 5  # one record of the five clients that took a step
    assert torch.allclose(starts[0][0][0], loop_starts, rtol=1e-5)
    for c, a, b in zip(share, loop, stacked, strict=True):
        assert b.num_samples == a.num_samples == dm.client_sizes[c]
        assert b.upload.shape == a.upload.shape == own[share.index(c)].shape
        assert torch.allclose(b.upload, a.upload, rtol=1e-4, atol=2e-6), (c, (b.upload - a.upload).abs().max())
        assert float(b.loss) == pytest.approx(float(a.loss), rel=1e-5)
    idle = stacked[share.index(1)]  # no step: nothing moved
    assert torch.count_nonzero(idle.upload) == 0 and float(idle.loss) == 0.0


def test_resnet18_gn_sub_models_with_partial_groupnorm_groups_train_stacked_as_alone() -> None:
    # width 8, 2 groups of 4: F_0.2 keeps 2 channels (a partial group), F_0.6 keeps 5 (one whole, one partial)
    module = _fjord(_digits(3), model="resnet18_gn", model_options={"width": 8}, local_steps=2, batch_size=8)
    share = [0, 1, 2]
    broadcast = flat_parameters(module.model)
    own = [broadcast[module.client_indices(c, 0)].clone() for c in share]
    loop = [module.client_update(client_id=c, round_idx=0, received=r) for c, r in zip(share, own, strict=True)]
    stacked = module.stacked_client_updates(round_idx=0, share=share, received=own[-1], received_by_client=own)
    for a, b in zip(loop, stacked, strict=True):
        assert torch.allclose(b.upload, a.upload, rtol=1e-4, atol=2e-6), (b.upload - a.upload).abs().max()
        assert float(b.loss) == pytest.approx(float(a.loss), rel=1e-5)


def _refusal(module: FjORD) -> str:
    with pytest.raises(ConfigError) as caught:
        choose_runner(module, "vectorised")
    message = str(caught.value)
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
    return message


def test_served_fjord_settings_are_not_refused() -> None:
    module = _fjord(_digits(), adaptive_dropout=0.25, max_grad_norm=1.0, local_execution="vectorised")
    assert module.stacked_refusal() is None
    assert choose_runner(module, "vectorised")[0].name == "vectorised"


def test_efd_is_refused_because_it_chooses_its_own_sub_models() -> None:
    module = _fjord(_digits(), method=ExtendedFederatedDropout, width=0.8)
    message = _refusal(module)
    assert "its local work is its own (step_loss, client_indices), not FjORD's stacked local work" in message


def test_char_lstm_is_refused_because_vmap_has_no_batching_rule_for_the_lstm() -> None:
    torch.manual_seed(0)
    net = build_model("char_lstm", input_shape=(20,), num_classes=10)
    module = FjORD(model=net, datamodule=_digits(), client_optimizer=SGD)
    assert "model=char_lstm runs the LSTM kernel, which has no batching rule under torch.func.vmap" in _refusal(module)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda params: torch.optim.SGD(params, lr=0.1), "must be a functools.partial"),
        (functools.partial(torch.optim.Adam, lr=0.01, amsgrad=True), "turns on amsgrad"),
        (functools.partial(torch.optim.RMSprop, lr=0.01), "serve only"),
    ],
    ids=["lambda", "amsgrad", "rmsprop"],
)
def test_client_optimisers_the_stacked_clients_cannot_reproduce_are_refused_naming_the_key(
    factory: Any, match: str
) -> None:
    message = _refusal(_fjord(_digits(), client_optimizer=factory))
    assert "method.client_optimizer" in message and match in message
