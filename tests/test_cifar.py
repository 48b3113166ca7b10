"""CIFAR-10/100: pickle, lossy JPEG tar and PNG sources, augmentation, caching, models."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedlightning.datamodules import CIFAR10DataModule, CIFAR100DataModule, DataUnavailableError
from fedlightning.datamodules.cifar import CIFAR10_CLASSES, random_crop_flip
from fedlightning.models import build_model


def _fake_batches(root: Path, folder: str, files: list[str], label_key: str, n: int, classes: int) -> np.ndarray:
    (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (len(files) * n, 3072), dtype=np.uint8)
    for i, name in enumerate(files):
        part = {b"data": data[i * n : (i + 1) * n], label_key.encode(): [j % classes for j in range(n)]}
        (root / folder / name).write_bytes(pickle.dumps(part))
    return data


def test_python_batches_layout_and_normalisation(tmp_path: Path) -> None:
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    data = _fake_batches(tmp_path, "cifar-10-batches-py", files, "labels", 4, 10)
    dm = CIFAR10DataModule(root=str(tmp_path), num_clients=2, val_fraction=0.0)
    dm.setup("fit")
    x, _ = dm._train_tensors()
    x = x[np.argsort(dm.train_index)]  # stored client by client; back in the order the files hold them
    assert x.dtype == torch.uint8 and x.shape == (20, 3, 32, 32) and not dm.notice
    # rows of ``data`` are the R plane, then G, then B
    assert torch.equal(x[0, 1].flatten(), torch.from_numpy(data[0, 1024:2048]))
    xt, _ = next(iter(dm.test_dataloader()))
    expected = (torch.from_numpy(data[20].reshape(3, 32, 32)).float() / 255 - dm._mean[0]) / dm._std[0]
    assert torch.allclose(xt[0], expected)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    _fake_batches(tmp_path, "cifar-100-python", ["train", "test"], "fine_labels", 200, 100)
    dm = CIFAR100DataModule(root=str(tmp_path), num_clients=2, val_fraction=0.0)
    dm.setup("fit")
    assert dm.num_classes == 100 and dm.label_histogram().sum(0).tolist() == [2] * 100
    with pytest.raises(ValueError, match=r"data\.source"):
        CIFAR100DataModule(root=str(tmp_path), source="jpeg")


def test_random_crop_flip_by_hand() -> None:
    x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4)
    g = torch.Generator().manual_seed(0)
    out = random_crop_flip(x, g, padding=1, flip=False)
    g = torch.Generator().manual_seed(0)
    dy, dx = torch.randint(0, 3, (1, 2), generator=g)[0].tolist()
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    assert torch.equal(out, padded[..., dy : dy + 4, dx : dx + 4])
    flipped = random_crop_flip(x.repeat(200, 1, 1, 1), torch.Generator().manual_seed(1), crop=False)
    share = float((flipped[:, 0, 0, 0] == 3).float().mean())
    assert 0.4 < share < 0.6  # Binomial(200, 1/2): 5 standard deviations is +-0.18
    assert torch.equal(random_crop_flip(x, torch.Generator(), crop=False, flip=False), x)


def test_png_source_and_engine_augment_path(shared_data_root: Path) -> None:
    dm = CIFAR10DataModule(root=str(shared_data_root), source="png", num_clients=4)
    dm.setup("fit")
    assert "subset: 200 of 60,000" in dm.notice
    x, _ = dm.client_tensors(0)
    a = dm.augment(x, torch.Generator().manual_seed(0))
    b = dm.augment(x, torch.Generator().manual_seed(0))
    assert a.dtype == torch.float32 and torch.equal(a, b) and not torch.equal(a, dm.transform(x))


def test_jpeg_is_labelled_lossy_and_matches_the_lossless_pngs(shared_data_root: Path) -> None:
    dm = CIFAR10DataModule(root=str(shared_data_root), max_train_samples=300, max_test_samples=50, cache_dir="")
    dm.setup("fit")
    assert "LOSSY" in dm.notice and "subset: 300 of 50,000 training JPEGs" in dm.notice
    # train/frog/0000.jpg is the first frog of the official first batch, i.e. PNG 1.
    with tarfile.open(shared_data_root / "cifar10" / "cifar10-jpeg-q75.tar") as tf:
        f = tf.extractfile("train/frog/0000.jpg")
        assert f is not None
        jpg = np.asarray(Image.open(io.BytesIO(f.read())).convert("RGB")).astype(float)
    png = [
        np.asarray(Image.open(shared_data_root / "cifar10/small-png/train" / f"{i}.png")).astype(float) for i in (1, 2)
    ]
    # Measured mean absolute errors: 7.2 grey levels to its PNG, 64 to another image.
    assert np.abs(jpg - png[0]).mean() < 12 < np.abs(jpg - png[1]).mean()


def test_jpeg_tar_cache_outside_the_data(tmp_path: Path) -> None:
    root, cache = tmp_path / "data", tmp_path / "cache"
    (root / "cifar10").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with tarfile.open(root / "cifar10" / "cifar10-jpeg-q75.tar", "w") as tf:
        for split, n in (("train", 3), ("test", 1)):
            for c in ("cat", "airplane"):
                for i in range(n):
                    buf = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG", quality=75)
                    info = tarfile.TarInfo(f"{split}/{c}/{i:04d}.jpg")
                    info.size = buf.tell()
                    buf.seek(0)
                    tf.addfile(info, buf)
    listing = sorted(p.name for p in root.rglob("*"))
    dm = CIFAR10DataModule(root=str(root), num_clients=2, val_fraction=0.0, cache_dir=str(cache))
    dm.setup("fit")
    assert dm._train_tensors()[1][np.argsort(dm.train_index)].tolist() == [0, 0, 0, 3, 3, 3]  # airplane before cat
    assert len(list(cache.rglob("*.npz"))) == 1 and sorted(p.name for p in root.rglob("*")) == listing
    again = CIFAR10DataModule(root=str(root), num_clients=2, val_fraction=0.0, cache_dir=str(cache))
    again.setup("fit")
    assert torch.equal(again._train_tensors()[0], dm._train_tensors()[0])


def test_missing_and_offline_download_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataUnavailableError, match=r"CIFAR10.*test_batch.*data\.root="):
        CIFAR10DataModule(root=str(tmp_path)).setup("fit")
    from torchvision import datasets

    def offline(self: object) -> None:
        raise OSError("no network")

    monkeypatch.setattr(datasets.CIFAR10, "download", offline)
    with pytest.raises(DataUnavailableError, match=r"CIFAR10.*cifar-10-batches-py.*download failed.*data\.root="):
        CIFAR10DataModule(root=str(tmp_path), download=True).prepare_data()


def test_models_for_cifar_have_no_buffers() -> None:
    conv4 = build_model("conv4", input_shape=(3, 32, 32), num_classes=10)
    assert sum(p.numel() for p in conv4.parameters()) == 2_425_930  # Conv-4 of Frankle and Carbin: 2.4M
    net = build_model("resnet18_gn", input_shape=(3, 32, 32), num_classes=100, width=8)
    assert not list(net.buffers()) and net(torch.zeros(2, 3, 32, 32)).shape == (2, 100)
    with pytest.raises(ValueError, match="unknown option"):
        build_model("resnet18_gn", input_shape=(3, 32, 32), num_classes=10, depth=50)
    assert len(CIFAR10_CLASSES) == 10


@pytest.mark.slow
def test_full_jpeg_load(shared_data_root: Path, tmp_path: Path) -> None:
    dm = CIFAR10DataModule(root=str(shared_data_root), cache_dir=str(tmp_path), val_fraction=0.0)
    dm.setup("fit")
    assert dm.num_train_samples == 50_000 and len(dm.test_dataloader().dataset) == 10_000
    assert dm.label_histogram().sum(0).tolist() == [5000] * 10


class _WritesMarker:
    """A pickle payload whose ``__reduce__`` would create a marker file when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path, str]]:
        return (Path.write_text, (self.marker, "code ran"))


def test_crafted_batch_runs_no_code_and_names_the_file(tmp_path: Path) -> None:
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    _fake_batches(tmp_path, "cifar-10-batches-py", files, "labels", 4, 10)
    marker = tmp_path / "marker"
    crafted = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    crafted.write_bytes(pickle.dumps({b"data": _WritesMarker(marker), b"labels": [0]}))
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_WritesMarker(probe)))  # the payload does run code under a plain unpickler
    assert probe.read_text() == "code ran"
    dm = CIFAR10DataModule(root=str(tmp_path), num_clients=2, val_fraction=0.0)
    with pytest.raises(DataUnavailableError) as err:
        dm.setup("fit")
    assert not marker.exists()
    message = str(err.value)
    assert message.startswith(f"{crafted} is not a valid CIFAR python batch (it asks for pathlib")
    assert "replace it with the file from the official cifar-10-python.tar.gz" in message
    assert message.count(". ") == 0 and message.endswith(".") and "\n" not in message


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x80\x04garbage",
        pickle.dumps([1, 2]),
        pickle.dumps({b"data": np.zeros((2, 5), np.uint8), b"labels": [0, 1]}),
    ],
    ids=["empty", "garbage", "not_a_dict", "wrong_image_size"],
)
def test_malformed_batches_stop_with_one_sentence(tmp_path: Path, content: bytes) -> None:
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    _fake_batches(tmp_path, "cifar-10-batches-py", files, "labels", 4, 10)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(content)
    with pytest.raises(DataUnavailableError, match=r"test_batch (is not|holds a).*official"):
        CIFAR10DataModule(root=str(tmp_path), num_clients=2, val_fraction=0.0).setup("fit")


def test_protocol_2_batches_as_the_official_files_load(tmp_path: Path) -> None:
    """The official batches are protocol-2 pickles with bytes keys; they pass the restricted unpickler."""
    (tmp_path / "cifar-10-batches-py").mkdir()
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (12, 3072), dtype=np.uint8)
    for i, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        part = {
            b"batch_label": b"batch",
            b"labels": [i] * 2,
            b"data": data[2 * i : 2 * i + 2],
            b"filenames": [b"a", b"b"],
        }
        (tmp_path / "cifar-10-batches-py" / name).write_bytes(pickle.dumps(part, protocol=2))
    dm = CIFAR10DataModule(root=str(tmp_path), num_clients=2, val_fraction=0.0)
    dm.setup("fit")
    loaded = np.argsort(dm.train_index)  # stored client by client; back in the order the files hold them
    x, y = (t[loaded] for t in dm._train_tensors())
    assert torch.equal(x.reshape(10, -1), torch.from_numpy(data[:10])) and y.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
