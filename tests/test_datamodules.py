"""Data modules: digits (embedded), MNIST from the shared offline copy, plain-Lightning use."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from sklearn.datasets import load_digits
from torch import Tensor, nn

from fedlightning.datamodules import (
    DataUnavailableError,
    DigitsDataModule,
    DirichletPartition,
    FederatedDataModule,
    FilePartition,
    IIDPartition,
    MNISTDataModule,
    ShardPartition,
    default_data_root,
)
from fedlightning.datamodules.digits import load_digits_arrays
from fedlightning.datamodules.partition import dirichlet_partition
from fedlightning.models import build_model
from fedlightning.plotting import plot_client_labels

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_digits_sizes_and_tensors() -> None:
    dm = DigitsDataModule(num_clients=7, partition=DirichletPartition(alpha=0.5), val_fraction=0.1)
    dm.setup("fit")
    n_val = len(dm.val_dataloader().dataset)
    n_test = len(dm.test_dataloader().dataset)
    assert dm.num_train_samples + n_val + n_test == 1797
    assert n_test == 359  # Σ_c round(0.2 n_c) over the class sizes 178, 182, 177, 183, 181, 182, 181, 179, 174, 180
    assert sum(dm.client_sizes) == dm.num_train_samples and min(dm.client_sizes) > 0
    x, y = dm.client_tensors(3)
    assert x.shape == (dm.client_sizes[3], 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.is_contiguous() and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    stored = dm._train_tensors()[0]
    assert x.untyped_storage().data_ptr() == stored.untyped_storage().data_ptr()  # a slice, not a copy
    assert dm.label_histogram().shape == (7, 10) and dm.label_histogram().sum() == dm.num_train_samples
    np.testing.assert_array_equal(dm.label_histogram()[3], np.bincount(y.numpy(), minlength=10))


def test_embedded_digits_are_scikit_learns_digits_in_its_order() -> None:
    images, target = load_digits_arrays()
    digits = load_digits()
    assert images.dtype == target.dtype == np.uint8
    np.testing.assert_array_equal(images, digits.images)
    np.testing.assert_array_equal(target, digits.target)


def test_digits_test_split_holds_out_a_fifth_of_every_class_and_follows_the_seed() -> None:
    _, target = load_digits_arrays()
    per_class = np.bincount(target)
    quota = np.round(0.2 * per_class).astype(int)  # 36, 36, 35, 37, 36, 36, 36, 36, 35, 36
    tests = []
    for seed in (0, 1):
        dm = DigitsDataModule(num_clients=3, seed=seed, val_fraction=0.0)
        (_, y_train), (_, y_test) = dm._load()
        np.testing.assert_array_equal(np.bincount(y_test.numpy(), minlength=10), quota)
        np.testing.assert_array_equal(np.bincount(y_train.numpy(), minlength=10), per_class - quota)
        _, train_rows = dm._dataset_rows
        tests.append(np.setdiff1d(np.arange(1797), train_rows))
    assert len(tests[0]) == 359 and not np.array_equal(tests[0], tests[1])


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
def test_save_and_reload_partition_gives_the_same_clients_and_hold_out(tmp_path: Path, suffix: str) -> None:
    dm = DigitsDataModule(num_clients=6, partition=DirichletPartition(alpha=0.2), seed=3)
    path = tmp_path / f"part{suffix}"
    dm.save_partition(path)
    again = DigitsDataModule(num_clients=6, seed=3, partition_file=str(path))
    assert all(np.array_equal(dm.client_indices(k), again.client_indices(k)) for k in range(6))
    assert all(torch.equal(dm.client_tensors(k)[0], again.client_tensors(k)[0]) for k in range(6))
    assert torch.equal(dm.val_dataloader().dataset.tensors[1], again.val_dataloader().dataset.tensors[1])
    assert again.partition_name == "dirichlet_alpha0.2"
    # Digits' test split is drawn from the seed: another seed trains on other digits.
    with pytest.raises(ValueError, match=r"uses samples this run does not train on .* use seed=3"):
        DigitsDataModule(num_clients=6, seed=4, partition_file=str(path)).setup()
    with pytest.raises(ValueError, match=r"num_clients=6 \(this run: 5\)"):
        DigitsDataModule(num_clients=5, seed=3, partition_file=str(path)).setup()
    with pytest.raises(ValueError, match=r"val_fraction=0\.1 \(this run: 0\.2\)"):
        DigitsDataModule(num_clients=6, seed=3, val_fraction=0.2, partition_file=str(path)).setup()


def test_partition_json_indexes_the_data_sets_own_samples(tmp_path: Path) -> None:
    dm = DigitsDataModule(num_clients=4, partition=ShardPartition(), seed=1, max_train_samples=600)
    dm.save_partition(tmp_path / "partition.json")
    saved = json.loads((tmp_path / "partition.json").read_text())
    assert (saved["format"], saved["version"], saved["index"]) == ("fedlightning.partition", 2, "dataset")
    assert saved["num_dataset_samples"] == 1797 and saved["max_train_samples"] == 600
    digits = load_digits()  # scikit-learn's own order: no test split, no subset, no hold-out
    x_all = torch.from_numpy(digits.images / 16.0).reshape(-1, 1, 8, 8)
    y_all = torch.from_numpy(digits.target)
    for k, indices in enumerate(saved["clients"]):
        x, y = dm.client_tensors(k)
        own = dm.train_dataset_index[dm.client_indices(k)]  # the data set's index of each client row
        assert torch.equal(y_all[own], y) and torch.equal(x_all[own].float(), x)
        assert indices == sorted(own.tolist())
    val_x, _ = dm.val_dataloader().dataset.tensors
    assert torch.equal(x_all[dm.val_dataset_index].float(), val_x)
    assert saved["validation"] == sorted(dm.val_dataset_index.tolist())
    held_and_clients = [i for c in saved["clients"] for i in c] + saved["validation"]
    assert len(held_and_clients) == len(set(held_and_clients)) == 600


def test_version_1_file_is_read_when_its_settings_match_and_refused_otherwise(tmp_path: Path) -> None:
    dm = DigitsDataModule(num_clients=3, partition=DirichletPartition(alpha=0.5), seed=2)
    # The format before version 2: indices into the training set left after the hold-out.
    old = {"dataset": "digits", "num_train_samples": dm.num_train_samples, "num_clients": 3, "seed": 2}
    old |= {"val_fraction": 0.1, "clients": [dm.client_indices(k).tolist() for k in range(3)]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    again = DigitsDataModule(num_clients=3, seed=2, partition_file=str(path))
    assert all(np.array_equal(dm.client_indices(k), again.client_indices(k)) for k in range(3))
    with pytest.raises(ValueError, match=r"seed=2 \(this run: 5\)"):
        DigitsDataModule(num_clients=3, seed=5, partition_file=str(path)).setup()
    path.write_text(json.dumps({**old, "version": 9}))
    with pytest.raises(ValueError, match="has format version 9, newer than the versions 1 to 2"):
        DigitsDataModule(num_clients=3, seed=2, partition_file=str(path)).setup()


def test_partition_file_with_a_drawn_partition_is_refused_naming_both_keys(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    DigitsDataModule(num_clients=3).save_partition(path)
    with pytest.raises(ValueError) as info:
        DigitsDataModule(num_clients=3, partition=DirichletPartition(alpha=0.3), partition_file=str(path))
    assert str(info.value) == (
        f"data.partition_file={path} and partition=dirichlet_alpha0.3 both choose the clients; set "
        "partition=file to reuse the saved clients, or unset data.partition_file to draw a new split."
    )
    with pytest.raises(ValueError, match=r"partition=file reuses the clients saved in data.partition_file"):
        DigitsDataModule(num_clients=3, partition=FilePartition())
    reused = DigitsDataModule(num_clients=3, partition=FilePartition(), partition_file=str(path))
    assert sum(reused.client_sizes) == reused.num_train_samples


def test_a_partitioner_without_seed_keyword_is_refused() -> None:
    def old_style(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return np.array_split(np.arange(len(labels)), num_clients)

    with pytest.raises(TypeError, match=r"must be called as partition\(labels, num_clients, \*, seed\)"):
        DigitsDataModule(num_clients=3, partition=old_style)
    dm = DigitsDataModule(num_clients=3, partition=functools.partial(dirichlet_partition, alpha=0.4), seed=1)
    dm.setup("fit")
    partitioned = np.argsort(dm.train_index)  # the training set in the order it was partitioned
    expected = dirichlet_partition(dm._train_tensors()[1].numpy()[partitioned], 3, seed=1, alpha=0.4)
    own = [dm.train_index[dm.client_indices(k)] for k in range(3)]
    assert all(np.array_equal(own[k], dm.train_index[partitioned][expected[k]]) for k in range(3))


def test_loader_options_reach_every_loader_and_one_worker_gives_the_same_batches() -> None:
    plain = DigitsDataModule(num_clients=3, seed=0)
    worker = DigitsDataModule(num_clients=3, seed=0, num_workers=1, pin_memory=True, persistent_workers=True)
    loaders = [
        worker.val_dataloader(),
        worker.test_dataloader(),
        worker.train_dataloader(),
        worker.client_dataloader(1),
    ]
    assert all((d.num_workers, d.pin_memory, d.persistent_workers) == (1, True, True) for d in loaders)
    assert worker.loader_options() == {"num_workers": 1, "pin_memory": True, "persistent_workers": True}

    def batches(dm: DigitsDataModule) -> list[Tensor]:
        out = [t for b in dm.val_dataloader() for t in b] + [t for b in dm.test_dataloader() for t in b]
        gen = torch.Generator().manual_seed(5)
        out += [t for b in dm.client_dataloader(1, batch_size=16, generator=gen) for t in b]
        torch.manual_seed(11)  # the centralised loader shuffles with the global stream
        return out + [t for b in dm.train_dataloader() for t in b]

    a, b = batches(plain), batches(DigitsDataModule(num_clients=3, seed=0, num_workers=1))
    assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    with pytest.raises(ValueError, match=r"data.persistent_workers=true keeps DataLoader workers alive"):
        DigitsDataModule(persistent_workers=True)
    with pytest.raises(ValueError, match=r"data.num_workers must be an integer >= 0"):
        DigitsDataModule(num_workers=-1)


def test_label_distribution_picture_is_written(tmp_path: Path) -> None:
    dm = DigitsDataModule(num_clients=10, partition=DirichletPartition(alpha=0.3))
    path = plot_client_labels(dm, tmp_path / "label_distribution.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_validation_messages() -> None:
    with pytest.raises(ValueError, match=r"data\.num_clients must be an integer >= 1"):
        DigitsDataModule(num_clients=0)
    with pytest.raises(ValueError, match=r"data.val_fraction must be in \[0, 1\)"):
        DigitsDataModule(val_fraction=1.0)
    with pytest.raises(ValueError, match=r"data\.num_clients=5000 exceeds the 1294 training samples"):
        DigitsDataModule(num_clients=5000, val_fraction=0.1).setup()


def test_val_fraction_zero_uses_test_set() -> None:
    dm = DigitsDataModule(num_clients=3, val_fraction=0.0)
    assert dm.num_train_samples == 1797 - 359
    assert len(dm.val_dataloader().dataset) == 359


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


class _FixedSplit(FederatedDataModule):
    """40 fixed samples (a fixed train/test split, like MNIST's): only the hold-out uses the seed."""

    name = "fixed"
    num_classes = 4
    input_shape = (1,)

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        x = torch.arange(50, dtype=torch.float32)[:, None]
        return (x[:40], torch.arange(40) % 4), (x[40:], torch.arange(10) % 4)


def test_a_saved_split_is_reused_under_another_run_seed_when_the_data_is_fixed(tmp_path: Path) -> None:
    dm = _FixedSplit(num_clients=3, partition=DirichletPartition(alpha=1.0), seed=3, val_fraction=0.25)
    dm.save_partition(tmp_path / "partition.npz")
    again = _FixedSplit(num_clients=3, seed=8, val_fraction=0.25, partition_file=str(tmp_path / "partition.npz"))
    assert all(torch.equal(dm.client_tensors(k)[0], again.client_tensors(k)[0]) for k in range(3))
    assert torch.equal(dm.val_dataloader().dataset.tensors[0], again.val_dataloader().dataset.tensors[0])
    fresh = _FixedSplit(num_clients=3, partition=DirichletPartition(alpha=1.0), seed=8, val_fraction=0.25)
    assert not all(torch.equal(fresh.client_tensors(k)[0], again.client_tensors(k)[0]) for k in range(3))


def test_a_run_saves_its_split_and_a_second_run_reuses_it_with_partition_file(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    from fedlightning.errors import ConfigError
    from fedlightning.run import run

    quick = ["rounds=1", "logger=none", "data.num_clients=5", "partition.alpha=0.2"]
    run(make_config(quick), tmp_path / "first")
    first = tmp_path / "first"
    assert (first / "label_distribution.png").read_bytes()[:4] == b"\x89PNG"
    saved = str(first / "partition.json")
    run(make_config([*quick[:3], "partition=file", f"data.partition_file={saved}"]), tmp_path / "again")
    assert (tmp_path / "again" / "clients.csv").read_text() == (first / "clients.csv").read_text()
    again = json.loads((tmp_path / "again" / "partition.json").read_text())
    assert again["clients"] == json.loads(Path(saved).read_text())["clients"]
    assert again["partition"] == "dirichlet_alpha0.2"
    with pytest.raises(
        ConfigError, match=r"and partition=dirichlet_alpha0\.5 both choose the clients; set partition=file"
    ):
        run(make_config(["rounds=1", f"data.partition_file={saved}"]), tmp_path / "conflict")


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_a_partition_file_with_an_empty_client_is_refused_naming_the_file(tmp_path: Path, suffix: str) -> None:
    dm = DigitsDataModule(num_clients=4, partition=IIDPartition(), seed=1)
    path = tmp_path / f"part{suffix}"
    dm.save_partition(path)
    if suffix == ".json":
        raw = json.loads(path.read_text())
        raw["clients"][2] = []
        path.write_text(json.dumps(raw))
    else:
        with np.load(path) as z:
            files = {name: z[name] for name in z.files}
        sizes = np.diff(files["offsets"])
        start, stop = files["offsets"][2], files["offsets"][3]
        files["indices"] = np.concatenate([files["indices"][:start], files["indices"][stop:]])
        sizes[2] = 0
        files["offsets"] = np.concatenate([[0], np.cumsum(sizes)])
        np.savez(path, **files)
    with pytest.raises(ValueError) as info:
        DigitsDataModule(num_clients=4, seed=1, partition_file=str(path)).setup()
    text = str(info.value)
    assert f"data.partition_file={path} gives client 2 no samples" in text and "re-save" in text
    assert "\n" not in text


def test_a_partition_file_that_drops_a_sample_is_refused_naming_the_file(tmp_path: Path) -> None:
    dm = DigitsDataModule(num_clients=4, partition=IIDPartition(), seed=1)
    path = tmp_path / "partition.json"
    dm.save_partition(path)
    raw = json.loads(path.read_text())
    raw["clients"][1] = raw["clients"][1][1:]  # one sample in no client and not held out
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"^data\.partition_file={path} assigns .* \(1 are in no client"):
        DigitsDataModule(num_clients=4, seed=1, partition_file=str(path)).setup()


def test_a_run_with_an_emptied_client_in_its_partition_file_stops_before_training(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    from fedlightning.errors import ConfigError
    from fedlightning.run import run

    quick = ["rounds=1", "logger=none", "data.num_clients=5"]
    run(make_config(quick), tmp_path / "first")
    raw = json.loads((tmp_path / "first" / "partition.json").read_text())
    raw["clients"][0] = []
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=rf"^data\.partition_file={edited} gives client 0 no samples"):
        run(make_config([*quick, "partition=file", f"data.partition_file={edited}"]), tmp_path / "again")
    assert not (tmp_path / "again" / "summary.json").exists()
