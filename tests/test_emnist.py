"""EMNIST splits, orientation, label mapping, offline subsets and carving, and FEMNIST (LEAF/TFF)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlightning.datamodules import (
    DataUnavailableError,
    EMNISTDataModule,
    FEMNISTDataModule,
    MNISTDataModule,
    NaturalPartition,
)
from fedlightning.datamodules.emnist import EMNIST_SPLITS, MEAN, STD, emnist_classes
from fedlightning.datamodules.mnist import read_idx
from fedlightning.models import build_model


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def test_class_mappings_agree_with_the_official_mapping_files(shared_data_root: Path) -> None:
    for split in ("byclass", "balanced", "mnist"):
        rows = (shared_data_root / "EMNIST" / "raw" / f"emnist-{split}-mapping.txt").read_text().split("\n")
        official = [chr(int(r.split()[1])) for r in rows if r.strip()]
        assert emnist_classes(split) == official
    assert {s: len(emnist_classes(s)) for s in EMNIST_SPLITS} == {s: c for s, (c, _, _) in EMNIST_SPLITS.items()}


def test_emnist_mnist_split_is_upright_and_matches_mnist(shared_data_root: Path) -> None:
    """EMNIST's ``mnist`` test images, once transposed, are MNIST-like upright digits."""
    dm = EMNISTDataModule(root=str(shared_data_root), split="mnist", train_from="test", val_fraction=0.0)
    dm.setup("fit")
    x = dm.test_dataloader().dataset.tensors[0]
    pixels = x * STD + MEAN
    raw = read_idx(shared_data_root / "EMNIST" / "raw" / "emnist-mnist-test-images-idx3-ubyte")
    # Upright check against real MNIST: mean images correlate far better transposed than as stored.
    mnist = MNISTDataModule(root=str(shared_data_root))
    mnist_mean = read_idx(mnist.raw_folder / "t10k-images-idx3-ubyte").astype(np.float64).mean(0)
    stored = raw.astype(np.float64).mean(0)
    upright = pixels.mean(0)[0].double().numpy() * 255
    corr = lambda a, b: float(np.corrcoef(a.ravel(), b.ravel())[0, 1])  # noqa: E731
    # Measured: 0.88 transposed vs 0.62 as stored (full 10,000); the carved 2,000 are close to that.
    assert corr(upright, mnist_mean) > 0.8 and corr(upright, mnist_mean) > corr(stored, mnist_mean) + 0.15
    assert "data.train_from=test" in dm.notice


def test_offline_balanced_subset_notice_and_missing_splits(shared_data_root: Path) -> None:
    dm = EMNISTDataModule(root=str(shared_data_root), split="balanced", test_from="train", num_clients=5)
    dm.setup("fit")
    assert "subset: 9,120 of 112,800 balanced training images" in dm.notice
    assert dm.num_train_samples + len(dm.val_dataloader().dataset) + len(dm.test_dataloader().dataset) == 9120
    assert dm.num_classes == 47 and dm.label_histogram().shape == (5, 47)
    with pytest.raises(DataUnavailableError, match=r"emnist-balanced-test-images-idx3-ubyte.*data\.test_from=train"):
        EMNISTDataModule(root=str(shared_data_root), split="balanced").setup("fit")
    with pytest.raises(DataUnavailableError, match=r"emnist-byclass-train-images-idx3-ubyte.*data\.root="):
        EMNISTDataModule(root=str(shared_data_root), split="byclass").setup("fit")


def test_letters_labels_shift_and_gz(tmp_path: Path) -> None:
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    images = np.zeros((4, 28, 28), np.uint8)
    images[:, 0, 5] = 255  # stored transposed: row 0, column 5 -> upright row 5, column 0
    for part in ("train", "test"):
        _write_idx(raw / f"emnist-letters-{part}-images-idx3-ubyte", images)
        _write_idx(raw / f"emnist-letters-{part}-labels-idx1-ubyte", np.array([1, 2, 26, 26]))
    import gzip

    gz = raw / "emnist-letters-test-labels-idx1-ubyte"
    (raw / (gz.name + ".gz")).write_bytes(gzip.compress(gz.read_bytes()))
    gz.unlink()
    dm = EMNISTDataModule(root=str(tmp_path), split="letters", num_clients=2, val_fraction=0.0)
    dm.setup("fit")
    x, y = dm.test_dataloader().dataset.tensors
    assert y.tolist() == [0, 1, 25, 25] and dm.classes[25] == "Z"
    assert torch.allclose(x[0, 0, 5, 0] * STD + MEAN, torch.tensor(1.0)) and "subset" in dm.notice


def test_download_without_network_names_data_set_file_and_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision import datasets

    def offline(self: object) -> None:
        raise OSError("no network")

    monkeypatch.setattr(datasets.EMNIST, "download", offline)
    with pytest.raises(DataUnavailableError, match=r"EMNIST \(digits\).*emnist-digits-train.*data\.root="):
        EMNISTDataModule(root=str(tmp_path), split="digits", download=True).prepare_data()


def _femnist_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {w: (rng.random((n, 28, 28)).astype(np.float32), rng.integers(0, 62, n)) for w, n in [("f0", 3), ("f1", 5)]}


def test_femnist_tff_hdf5(tmp_path: Path) -> None:
    import h5py

    data = _femnist_arrays()
    (tmp_path / "femnist").mkdir()
    for split in ("train", "test"):
        with h5py.File(tmp_path / "femnist" / f"fed_emnist_{split}.h5", "w") as f:
            for w, (x, y) in data.items():
                f.create_dataset(f"examples/{w}/pixels", data=x)
                f.create_dataset(f"examples/{w}/label", data=y.astype(np.int32))
    dm = FEMNISTDataModule(root=str(tmp_path), num_clients=2, partition=NaturalPartition(), val_fraction=0.0)
    dm.setup("fit")
    assert dm.client_names == ["f0", "f1"] and dm.client_sizes == [3, 5]
    x, y = dm.client_tensors(1)
    assert torch.equal(y, torch.from_numpy(data["f1"][1]))
    assert torch.allclose(x[:, 0] * STD + MEAN, 1.0 - torch.from_numpy(data["f1"][0]), atol=1e-6)


def test_femnist_leaf_json_and_missing(tmp_path: Path) -> None:
    data = _femnist_arrays()
    for split in ("train", "test"):
        (tmp_path / "femnist" / split).mkdir(parents=True)
        raw = {
            "users": list(data),
            "num_samples": [len(y) for _, y in data.values()],
            "user_data": {w: {"x": x.reshape(len(x), -1).tolist(), "y": y.tolist()} for w, (x, y) in data.items()},
        }
        (tmp_path / "femnist" / split / "all_data_0.json").write_text(json.dumps(raw))
    dm = FEMNISTDataModule(root=str(tmp_path), num_clients=2, partition=NaturalPartition(), val_fraction=0.0)
    dm.setup("fit")
    assert dm.client_sizes == [3, 5] and dm.num_classes == 62
    with pytest.raises(DataUnavailableError, match=r"fed_emnist_train\.h5.*data\.root="):
        FEMNISTDataModule(root=str(tmp_path / "none")).setup("fit")


def test_fedavg_cnn_preset() -> None:
    model = build_model("fedavg_cnn", input_shape=(1, 28, 28), num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 1_663_370  # FedAvg paper's CNN
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
