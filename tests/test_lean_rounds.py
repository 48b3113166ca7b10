"""Lean rounds: per-round (not per-client) work, sliced held-out loaders, a frozen collector."""

from __future__ import annotations

import functools
import gc
import itertools
import subprocess
import sys
from typing import Any

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader, TensorDataset

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules import tensor_loader as tensor_loader_module
from fedlightning.datamodules.tensor_loader import shard_bounds, tensor_loader
from fedlightning.federated.module import resolved_optimizer_factory
from fedlightning.federated.round_row import round_row_values
from fedlightning.methods import FedAvg
from fedlightning.models import build_model
from fedlightning.sampling import FullParticipation
from tests.conftest import record_calls, round_trainer


def _fedavg(dm: DigitsDataModule, **kwargs: Any) -> FedAvg:
    model = build_model("digits_mlp", input_shape=tuple(dm.input_shape), num_classes=dm.num_classes)
    return FedAvg(model=model, datamodule=dm, **kwargs)


def test_sliced_loader_gives_the_batches_of_a_per_sample_loader_without_fetching_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x, y = torch.randn(23, 3), torch.arange(23)
    expected = [[a.clone(), b.clone()] for a, b in DataLoader(TensorDataset(x, y), batch_size=5)]

    def refuse(self: object, index: int) -> None:
        raise AssertionError("a sample was fetched on its own")

    monkeypatch.setattr(TensorDataset, "__getitem__", refuse)
    got = list(tensor_loader((x, y), batch_size=5))
    assert [len(b[1]) for b in got] == [5, 5, 5, 5, 3]
    assert all(torch.equal(u, v) for g, e in zip(got, expected, strict=True) for u, v in zip(g, e, strict=True))
    doubled = list(tensor_loader((x, y), batch_size=5, transform=lambda t: 2 * t))
    assert torch.equal(doubled[4][0], 2 * x[20:])


def test_shards_cover_the_held_out_set_once_without_padding() -> None:
    for n, world in ((10, 3), (7, 2), (1797, 4), (2, 2)):
        bounds = [shard_bounds(n, rank=r, world_size=world) for r in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))  # contiguous, disjoint
        assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    x, y = torch.randn(7, 2), torch.arange(7)
    parts = [torch.cat([b[1] for b in tensor_loader((x, y), batch_size=2, rank=r, world_size=2)]) for r in range(2)]
    assert parts[0].tolist() == [0, 1, 2, 3] and parts[1].tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="rank 2 is not one of 2 processes"):
        shard_bounds(7, rank=2, world_size=2)


def test_datamodule_held_out_loaders_keep_their_dataset_and_take_a_shard() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    full = dm.test_dataloader()
    _x, y = full.dataset.tensors
    half = dm.test_dataloader(rank=1, world_size=2)
    start, stop = shard_bounds(len(y), rank=1, world_size=2)
    assert torch.equal(torch.cat([b[1] for b in half]), y[start:stop])


def test_a_held_out_loader_for_an_accelerator_serves_its_shard_from_a_copy_there() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    x, y = dm.test_dataloader().dataset.tensors
    start, stop = shard_bounds(len(y), rank=1, world_size=2)
    placed = dm.test_dataloader(rank=1, world_size=2, device="meta")  # an accelerator without values
    kept_x, kept_y = placed.dataset.tensors
    assert (kept_x.device.type, kept_y.device.type) == ("meta", "meta")
    assert (kept_x.shape, kept_y.shape) == (x[start:stop].shape, y[start:stop].shape)  # the shard alone
    assert [len(b) for b, _ in placed] == [len(b) for b, _ in dm.test_dataloader(rank=1, world_size=2)]
    assert placed.num_workers == 0 and not placed.pin_memory
    host = dm.val_dataloader(device="cpu")  # the CPU keeps the host loader: views of the stored tensors
    assert host.dataset.tensors[0].data_ptr() == dm.val_dataloader().dataset.tensors[0].data_ptr()


def test_a_held_out_shard_too_large_for_the_device_is_served_from_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []

    def refuse(device: torch.device, nbytes: int) -> bool:
        asked.append((device.type, nbytes))
        return False

    monkeypatch.setattr(tensor_loader_module, "may_reside_on", refuse)
    dm = DigitsDataModule(num_clients=3, seed=0)
    loader = dm.test_dataloader(rank=0, world_size=2, device="meta")
    x, y = dm.test_dataloader().dataset.tensors
    start, stop = shard_bounds(len(y), rank=0, world_size=2)
    assert asked == [("meta", x[start:stop].numel() * x.element_size() + y[start:stop].numel() * y.element_size())]
    assert loader.dataset.tensors[0].device.type == "cpu"
    assert torch.equal(torch.cat([b for _, b in loader]), y[start:stop])


def test_evaluation_asks_for_its_held_out_shard_on_the_modules_device() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    module = _fedavg(dm)
    on_cpu = module.val_dataloader()
    assert on_cpu.dataset.tensors[0].device.type == "cpu"
    module._device = torch.device("meta")  # where Lightning records the module's device
    placed = module.val_dataloader()
    assert placed.dataset.tensors[0].device.type == "meta"
    assert len(placed.dataset) == len(on_cpu.dataset)


def test_the_held_out_loader_is_asked_for_once_per_fit_however_many_rounds_are_evaluated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """So an accelerator's copy of the held-out shard is made once a run, not once an evaluation."""
    dm = DigitsDataModule(num_clients=3, seed=0)
    calls = record_calls(monkeypatch, DigitsDataModule, "val_dataloader")
    passes = record_calls(monkeypatch, FedAvg, "on_validation_epoch_end")
    round_trainer(4, [FullParticipation()], val_check_interval=1).fit(_fedavg(dm))
    assert (len(calls), len(passes)) == (1, 4)


def test_hydra_optimiser_partial_is_resolved_to_the_same_optimiser() -> None:
    node = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.03, "momentum": 0.9, "nesterov": True}
    hydra_factory = instantiate(node)
    model = torch.nn.Linear(3, 2)
    plain = resolved_optimizer_factory(hydra_factory, model)
    assert type(plain) is functools.partial and plain.func is torch.optim.SGD
    a, b = hydra_factory(model.parameters()), plain(model.parameters())
    assert type(a) is type(b) and a.defaults == b.defaults
    assert resolved_optimizer_factory(lambda p: torch.optim.SGD(p, lr=0.1), model) is None  # called as it is
    assert resolved_optimizer_factory(functools.partial(torch.optim.SGD, lr=0.1), model) is None  # already plain


class _CountingPartial(functools.partial):  # type: ignore[type-arg]
    """A partial subclass (as Hydra's) that counts its calls."""

    calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        type(self).calls += 1
        return super().__call__(*args, **kwargs)


def test_client_optimiser_wrapper_is_called_once_per_round_not_per_client() -> None:
    dm = DigitsDataModule(num_clients=6, seed=0)
    _CountingPartial.calls = 0
    module = _fedavg(dm, client_optimizer=_CountingPartial(torch.optim.SGD, lr=0.05))
    round_trainer(2, [FullParticipation()]).fit(module)
    assert _CountingPartial.calls == 2  # one call per round through the wrapper, six clients each


class _FreezeProbe(L.Callback):
    def __init__(self) -> None:
        self.frozen: list[int] = []

    def on_train_batch_start(self, *args: object) -> None:
        self.frozen.append(gc.get_freeze_count())


def test_objects_of_start_up_are_frozen_during_rounds_and_released_after() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    before = gc.get_freeze_count()
    probe = _FreezeProbe()
    round_trainer(2, [FullParticipation(), probe]).fit(_fedavg(dm))
    assert len(probe.frozen) == 2 and min(probe.frozen) > before + 10_000  # torch, Lightning, the model
    assert gc.get_freeze_count() == before


class _Rows(L.pytorch.loggers.Logger):
    """A logger that keeps every row it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "rows"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args: object, **kwargs: object) -> None:
        pass


def test_a_round_logs_its_row_in_one_logger_call_and_never_through_lightning_module_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    module = _fedavg(dm)
    calls: list[str] = []
    log = L.LightningModule.log

    def counted(self: L.LightningModule, name: str, *args: Any, **kwargs: Any) -> None:
        calls.append(name)
        log(self, name, *args, **kwargs)

    monkeypatch.setattr(L.LightningModule, "log", counted)
    rows = _Rows()
    accountant = CommunicationAccountant()
    trainer = round_trainer(3, [FullParticipation(), accountant], logger=rows, log_every_n_steps=1)
    trainer.fit(module)
    training = [(step, row) for step, row in rows.rows if "train/loss" in row]
    assert [step for step, _ in training] == [0, 1, 2]
    assert [row["round"] for _, row in training] == [1.0, 2.0, 3.0]
    assert all(row["epoch"] == 0 for _, row in training)
    bits = 3 * 2 * module.dense_message_bits  # 3 clients, one message each way, dense float32
    assert [row["comm/bits_total"] for _, row in training] == [bits, 2 * bits, 3 * bits]
    cumulative = {"comm/uplink_bits_total", "comm/downlink_bits_total", "comm/bits_total"}
    assert set(calls) == {"val/acc", "val/loss", "val/acc_best", "round", *cumulative}  # the validation row only
    assert trainer.callback_metrics["comm/bits_total"].dtype == torch.float64
    assert float(trainer.callback_metrics["train/loss"]) == training[-1][1]["train/loss"]
    assert trainer.progress_bar_metrics["round"] == 3.0
    assert float(trainer.logged_metrics["comm/bits_total"]) == 3 * bits


def test_a_round_row_value_that_is_not_a_number_is_named() -> None:
    with pytest.raises(TypeError, match="'method/note' is a str"):
        round_row_values({"train/loss": 0.5, "method/note": "diverged"})
    with pytest.raises(ValueError, match="'model/p' has 3 elements"):
        round_row_values({"model/p": torch.zeros(3)})


def test_the_round_row_reaches_the_loggers_at_the_trainers_cadence() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    rows = _Rows()
    round_trainer(5, [FullParticipation()], logger=rows, log_every_n_steps=2).fit(_fedavg(dm))
    assert [row["round"] for _, row in rows.rows if "train/loss" in row] == [2.0, 4.0]


@pytest.mark.parametrize("module", ["fedlightning.cli", "fedlightning"])
def test_importing_the_command_loads_no_plotting_scipy_or_wandb(module: str) -> None:
    probe = (
        f"import sys, {module}; "
        "print(','.join(m for m in ('matplotlib', 'scipy', 'wandb', 'sympy', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == ""


def test_a_non_finite_update_with_a_finite_loss_is_still_quarantined() -> None:
    dm = DigitsDataModule(num_clients=4, seed=0)

    class PoisonClientTwo(FedAvg):
        def client_update(self, *, client_id: int, round_idx: int, received: torch.Tensor) -> Any:
            result = super().client_update(client_id=client_id, round_idx=round_idx, received=received)
            if client_id == 2:
                result.upload[7] = float("inf")  # the loss stays finite
            return result

    model = build_model("digits_mlp", input_shape=tuple(dm.input_shape), num_classes=dm.num_classes)
    module = PoisonClientTwo(model=model, datamodule=dm)
    trainer = round_trainer(1, [FullParticipation()])
    trainer.fit(module)
    assert trainer.callback_metrics["failures/quarantined"] == 1
    assert all(torch.isfinite(p).all() for p in module.model.parameters())
