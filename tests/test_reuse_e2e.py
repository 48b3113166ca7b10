"""Each real data set trains a couple of rounds end to end from ``../shared/data`` without writing there,
and a datamodule works in a plain ``lightning.Trainer`` with no fedlightning engine involved."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from fedlightning.datamodules import CIFAR10DataModule, EMNISTDataModule, ShakespeareDataModule
from fedlightning.models import build_model
from fedlightning.run import run


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


E2E = {
    "emnist": [
        "data=emnist",
        "data.split=balanced",
        "data.test_from=train",
        "data.num_clients=20",
        "partition=dirichlet",
        "model=fedavg_cnn",
    ],
    "cifar10": [
        "data=cifar10",
        "data.max_train_samples=600",
        "data.max_test_samples=200",
        "data.num_clients=6",
        "partition=shards",
        "model=conv4",
        "data.cache_dir=''",
    ],
    "shakespeare": [
        "data=shakespeare",
        "partition=natural",
        "data.stride=80",
        "data.max_test_samples=300",
        "model=char_lstm",
        "model.hidden=32",
        "method.local_steps=2",
        "method.batch_size=8",
    ],
}


@pytest.mark.parametrize("name", list(E2E))
def test_trains_two_rounds_offline_without_writing_into_data(
    name: str, shared_data_root: Path, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    before = _listing(shared_data_root)
    overrides = [
        *E2E[name],
        f"data.root={shared_data_root}",
        "rounds=2",
        "sampler=uniform",
        "clients_per_round=3",
        "logger=none",
        "trainer.enable_progress_bar=false",
    ]
    summary = run(make_config(overrides), tmp_path, choices={"data": name})
    assert summary["rounds"] == 2
    assert 0.0 <= summary["test/acc"] <= 1.0
    assert summary["data_notice"]  # every offline copy here is a subset or lossy, and says so
    saved = json.loads((tmp_path / "partition.json").read_text())
    assert saved["dataset"] == name and sum(map(len, saved["clients"])) == saved["num_train_samples"]
    assert _listing(shared_data_root) == before


def test_shakespeare_natural_clients_are_the_715_roles(
    shared_data_root: Path, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config([f"data.root={shared_data_root}", "data=shakespeare", "partition=natural"])
    from hydra.utils import instantiate

    dm = instantiate(cfg.data, _partial_=True)(partition=instantiate(cfg.partition), seed=0)
    dm.setup("fit")
    assert dm.num_clients == 715 == len(dm.client_names)
    assert dm.snippet_counts == {"train": 16068, "test": 2356}
    assert min(dm.client_sizes) >= 1


class _Plain(L.LightningModule):
    """An ordinary LightningModule: automatic optimisation, no fedlightning engine."""

    def __init__(self, net: nn.Module, prepare: Callable[[Tensor], Tensor] | None = None) -> None:
        super().__init__()
        self.net = net
        self.prepare = prepare or (lambda x: x)
        self.accs: list[float] = []

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(self.prepare(x)), y)

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        x, y = batch
        self.accs.append(float((self.net(x).argmax(1) == y).float().mean()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=2e-3)


def _trainer() -> L.Trainer:
    return L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        limit_val_batches=0,
    )


def test_emnist_centralised_in_a_plain_trainer(shared_data_root: Path) -> None:
    dm = EMNISTDataModule(root=str(shared_data_root), split="mnist", train_from="test", batch_size=64)
    torch.manual_seed(0)
    model = _Plain(build_model("logreg", input_shape=dm.input_shape, num_classes=dm.num_classes))
    trainer = _trainer()
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    # Logistic regression on 6,400 upright digits for one epoch: well above the 0.1 of chance.
    assert sum(model.accs) / len(model.accs) > 0.8


def test_cifar_one_client_in_a_plain_trainer(shared_data_root: Path) -> None:
    dm = CIFAR10DataModule(root=str(shared_data_root), source="png", num_clients=2, batch_size=16)
    dm.setup("fit")
    x, _ = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.float32 and x.shape[1:] == (3, 32, 32)  # augmented and normalised per batch
    loader = torch.utils.data.DataLoader(dm.client_dataset(1), batch_size=16)
    # One client's raw uint8 tensors in a loader of the user's own: ``dm.transform`` normalises.
    model = _Plain(build_model("conv4", input_shape=dm.input_shape, num_classes=10), prepare=dm.transform)
    _trainer().fit(model, train_dataloaders=loader)
    assert model.trainer.global_step == -(-dm.client_sizes[1] // 16)


def test_shakespeare_plain_trainer_on_the_union(shared_data_root: Path) -> None:
    dm = ShakespeareDataModule(
        root=str(shared_data_root), num_clients=4, stride=400, max_test_samples=64, batch_size=64, val_fraction=0.0
    )
    model = _Plain(build_model("char_lstm", input_shape=dm.input_shape, num_classes=dm.num_classes, hidden=16))
    trainer = L.Trainer(
        max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0
    )
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    assert trainer.global_step == 3 and len(model.accs) == 1
