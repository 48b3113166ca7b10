"""Data modules: digits (embedded), MNIST from the shared offline copy, plain-Lightning use."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedlightning.datamodules import (
    DataUnavailableError,
    DigitsDataModule,
    DirichletPartition,
    MNISTDataModule,
    ShardPartition,
    default_data_root,
)
from fedlightning.models import build_model

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_digits_sizes_and_tensors() -> None:
    dm = DigitsDataModule(num_clients=7, partition=DirichletPartition(alpha=0.5), val_fraction=0.1)
    dm.setup("fit")
    n_val = len(dm.val_dataloader().dataset)
    n_test = len(dm.test_dataloader().dataset)
    assert dm.num_train_samples + n_val + n_test == 1797
    assert n_test == 360
    assert sum(dm.client_sizes) == dm.num_train_samples and min(dm.client_sizes) > 0
    x, y = dm.client_tensors(3)
    assert x.shape == (dm.client_sizes[3], 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.is_contiguous() and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert dm.client_tensors(3)[0] is x  # cached
    assert dm.label_histogram().shape == (7, 10) and dm.label_histogram().sum() == dm.num_train_samples
    np.testing.assert_array_equal(dm.label_histogram()[3], np.bincount(y.numpy(), minlength=10))


def test_setup_is_idempotent_and_seeded() -> None:
    a = DigitsDataModule(num_clients=5, partition=ShardPartition(), seed=1)
    a.setup("fit")
    first = [a.client_indices(k).copy() for k in range(5)]
    a.setup("test")
    b = DigitsDataModule(num_clients=5, partition=ShardPartition(), seed=1)
    c = DigitsDataModule(num_clients=5, partition=ShardPartition(), seed=2)
    assert all(
        np.array_equal(p, a.client_indices(k)) and np.array_equal(p, b.client_indices(k)) for k, p in enumerate(first)
    )
    assert not all(np.array_equal(p, c.client_indices(k)) for k, p in enumerate(first))


def test_client_dataloader_covers_client() -> None:
    dm = DigitsDataModule(num_clients=4)

    def gen() -> torch.Generator:
        return torch.Generator().manual_seed(0)

    batches = list(dm.client_dataloader(2, batch_size=16, generator=gen()))
    ys = torch.cat([y for _, y in batches])
    assert len(ys) == dm.client_sizes[2] and max(len(y) for _, y in batches) == 16
    assert torch.equal(ys.sort().values, dm.client_tensors(2)[1].sort().values)
    assert torch.equal(
        ys,
        torch.cat([y for _, y in dm.client_dataloader(2, batch_size=16, generator=gen())]),
    )


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_and_reload_partition(tmp_path: Path, suffix: str) -> None:
    dm = DigitsDataModule(num_clients=6, partition=DirichletPartition(alpha=0.2), seed=3)
    path = tmp_path / f"part{suffix}"
    dm.save_partition(path)
    again = DigitsDataModule(num_clients=6, seed=3, partition_file=str(path))
    assert all(np.array_equal(dm.client_indices(k), again.client_indices(k)) for k in range(6))
    with pytest.raises(ValueError, match="num_clients=6 \\(this run: 5\\)"):
        DigitsDataModule(num_clients=5, seed=3, partition_file=str(path)).setup()
    with pytest.raises(ValueError, match="seed=3 \\(this run: 4\\)"):
        DigitsDataModule(num_clients=6, seed=4, partition_file=str(path)).setup()


def test_config_validation_messages() -> None:
    with pytest.raises(ValueError, match=r"data\.num_clients must be an integer >= 1"):
        DigitsDataModule(num_clients=0)
    with pytest.raises(ValueError, match=r"data.val_fraction must be in \[0, 1\)"):
        DigitsDataModule(val_fraction=1.0)
    with pytest.raises(ValueError, match=r"data\.num_clients=5000 exceeds the 1293 training samples"):
        DigitsDataModule(num_clients=5000, val_fraction=0.1).setup()


def test_val_fraction_zero_uses_test_set() -> None:
    dm = DigitsDataModule(num_clients=3, val_fraction=0.0)
    assert dm.num_train_samples == 1797 - 360
    assert len(dm.val_dataloader().dataset) == 360


def test_debug_log_has_per_client_table(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fedlightning.datamodules.base"):
        DigitsDataModule(num_clients=3).setup()
    assert "client size min" in caplog.text and "label histogram" in caplog.text


class TinyClassifier(L.LightningModule):
    """An ordinary LightningModule with no fedlightning engine involved."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.05)


def test_usable_with_a_plain_lightning_trainer() -> None:
    dm = DigitsDataModule(num_clients=10, partition=DirichletPartition(alpha=0.5))
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    model = TinyClassifier()
    trainer.fit(model, datamodule=dm)
    (result,) = trainer.test(model, datamodule=dm, verbose=False)
    assert result["test_acc"] > 0.5


def test_digits_mlp_preset_learns_digits() -> None:
    torch.manual_seed(0)
    dm = DigitsDataModule(num_clients=1, val_fraction=0.0)
    model = build_model("digits_mlp", input_shape=dm.input_shape, num_classes=dm.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(20):
        for x, y in dm.train_dataloader():
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    x, y = next(iter(dm.test_dataloader()))
    assert (model(x).argmax(1) == y).float().mean() > 0.9


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def mnist(
    shared_data_root: Path,
) -> tuple[MNISTDataModule, list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    if not (shared_data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST/raw under {shared_data_root}")
    before = _listing(shared_data_root)
    dm = MNISTDataModule(root=str(shared_data_root), num_clients=100, val_fraction=0.0)
    dm.prepare_data()
    dm.setup("fit")
    return dm, before, _listing(shared_data_root)


def test_mnist_from_shared_copy(mnist: tuple[MNISTDataModule, list, list]) -> None:
    dm, before, after = mnist
    assert dm.num_train_samples == 60_000
    x_test, y_test = dm.test_dataloader().dataset.tensors
    assert len(y_test) == 10_000 and x_test.shape[1:] == (1, 28, 28)
    assert dm.label_histogram().sum(axis=0).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(y_test.numpy(), minlength=10).tolist() == MNIST_TEST_COUNTS
    assert abs(float(x_test.mean())) < 0.05 and abs(float(x_test.std()) - 1.0) < 0.05
    assert sum(dm.client_sizes) == 60_000 and set(dm.client_sizes) == {600}
    assert before == after, "the MNIST loader wrote into the read-only data folder"


def test_missing_mnist_raises_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError) as err:
        MNISTDataModule(root=str(tmp_path)).setup()
    msg = str(err.value)
    assert str(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte") in msg
    assert "data.root" in msg and "data.download=true" in msg
    assert list(tmp_path.iterdir()) == []


def test_default_root_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDLIGHTNING_DATA", str(tmp_path))
    assert default_data_root() == tmp_path and MNISTDataModule().root == tmp_path
    monkeypatch.delenv("FEDLIGHTNING_DATA")
    assert default_data_root() == Path(os.path.expanduser("~")) / ".cache" / "fedlightning" / "data"
