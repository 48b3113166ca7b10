"""CIFAR-10 and CIFAR-100 (Krizhevsky, 2009), with the standard crop-and-flip augmentation.

Sources, read without writing next to the data:

* ``python`` — torchvision's ``<root>/cifar-10-batches-py`` (``cifar-100-python`` for CIFAR-100)
  pickles; ``download=True`` fetches the official archive through torchvision. The batches are
  read with a restricted unpickler that builds only the containers and NumPy arrays an official
  batch holds, so a crafted file cannot run code; anything else stops with one sentence.
* ``jpeg`` (CIFAR-10 only) — ``<root>/cifar10/cifar10-jpeg-q75.tar`` holding
  ``{train,test}/<class>/NNNN.jpg``, read straight from the tar. JPEG quality 75 is **lossy**:
  fine for pipeline tests and demos, not for comparisons with papers (a notice says so). The
  decoded arrays of a full load are cached under ``cache_dir`` (default
  ``~/.cache/fedlightning/cifar10-jpeg``), never next to the data. Samples are ordered by
  split, class, then file number.
* ``png`` (CIFAR-10 only) — the 200 lossless training images ``<root>/cifar10/small-png``
  (``train/N.png``, ``trainLabels.csv``); ``test_holdout_fraction`` of them form the test set.

``auto`` picks the first of these that exists (``jpeg`` and ``png`` with a warning notice).
Images are kept as ``uint8 (N, 3, 32, 32)``; :meth:`CIFAR10DataModule.transform` normalises a
batch with the usual per-channel mean and standard deviation, and
:meth:`CIFAR10DataModule.augment` first applies a random 32×32 crop of the image zero-padded
by 4 and a horizontal flip with probability 1/2 (He et al., 2016, arXiv:1512.03385), each
switchable, drawing only from the client's generator.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlightning.datamodules.base import DataUnavailableError, FederatedDataModule, subset_indices
from fedlightning.folder_lock import write_failure
from fedlightning.paths import cache_dir as package_cache_dir

__all__ = ["CIFAR10_CLASSES", "CIFAR10DataModule", "CIFAR100DataModule", "random_crop_flip"]

log = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
JPEG_TAR = Path("cifar10") / "cifar10-jpeg-q75.tar"
PNG_DIR = Path("cifar10") / "small-png"


def random_crop_flip(
    x: Tensor, generator: torch.Generator, *, padding: int = 4, crop: bool = True, flip: bool = True
) -> Tensor:
    """Random ``H×W`` crops of the zero-padded batch and random horizontal flips, per image.

    Args:
        x: Images ``(B, C, H, W)`` of any dtype, on any device.
        generator: CPU generator all the draws come from.
        padding: Zero padding on every side before cropping.
        crop: Apply the random crop.
        flip: Apply the flip with probability 1/2.

    Returns:
        A new batch of the same shape and dtype.

    Example:
        >>> x = torch.arange(4.0).view(1, 1, 2, 2)
        >>> out = random_crop_flip(x, torch.Generator().manual_seed(0), padding=1)
        >>> out.shape, bool(set(out.flatten().tolist()) <= {0.0, 1.0, 2.0, 3.0})
        (torch.Size([1, 1, 2, 2]), True)
    """
    b, c, h, w = x.shape
    if crop and padding > 0:
        xp = F.pad(x, (padding, padding, padding, padding))
        off = torch.randint(0, 2 * padding + 1, (b, 2), generator=generator).to(x.device)
        rows = off[:, :1] + torch.arange(h, device=x.device)
        cols = off[:, 1:] + torch.arange(w, device=x.device)
        x = xp[
            torch.arange(b, device=x.device)[:, None, None, None],
            torch.arange(c, device=x.device)[None, :, None, None],
            rows[:, None, :, None],
            cols[:, None, None, :],
        ]
    if flip:
        mask = (torch.rand(b, generator=generator) < 0.5).to(x.device)
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x


_BATCH_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),  # NumPy < 2 spelling (the official batches)
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),  # pickle protocol 5 arrays
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),  # bytes in a protocol-2 pickle written by Python 3
    }
)
"""The only callables a CIFAR python batch (a dict of arrays, lists, bytes) needs to be rebuilt."""


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that resolves only :data:`_BATCH_GLOBALS`; any other global is refused before it is imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _BATCH_GLOBALS:
            raise pickle.UnpicklingError(f"it asks for {module}.{name}, which no CIFAR batch contains")
        return super().find_class(module, name)


def _write_cache(cache: Path, **arrays: np.ndarray) -> None:
    """Save ``arrays`` to ``cache`` (``.npz``) through a temporary file renamed into place.

    A cache that cannot be written (full, read-only) stops the run with one sentence naming it,
    and leaves no temporary file behind.
    """
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}.npz")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
        tmp.replace(cache)
    except OSError as exc:
        if exc.filename is None or exc.filename == str(tmp):
            exc.filename = str(cache)
        fix = (
            "free space there, point FEDLIGHTNING_CACHE or data.cache_dir at a writable folder, "
            "or set data.cache_dir='' to decode without a cache"
        )
        failure = write_failure(exc, path=cache, fix=fix)
        if failure is None:
            raise
        raise failure from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _read_pickle(path: Path) -> dict[str, object]:
    """A CIFAR python batch as a dict with str keys, read without executing anything from the file."""
    fix = (
        "replace it with the file from the official cifar-10-python.tar.gz / cifar-100-python.tar.gz "
        "(or delete the folder and set data.download=true)"
    )
    try:
        with path.open("rb") as f:
            raw = _BatchUnpickler(f, encoding="latin1").load()
    except Exception as err:  # nothing from the file can run, so any failure means a malformed batch
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataUnavailableError(
            f"{path} is not a valid CIFAR python batch ({why}), so it was not loaded; {fix}."
        ) from None
    if not isinstance(raw, dict):
        raise DataUnavailableError(f"{path} holds a {type(raw).__name__}, not a CIFAR batch dict; {fix}.")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}


def _batch_arrays(path: Path, raw: dict[str, object], label_key: str, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images ``uint8 (N, 3, 32, 32)`` and labels ``int64 (N,)`` of a batch, or one sentence saying what is wrong."""
    data, labels = raw.get("data"), raw.get(label_key)
    y = None
    if isinstance(labels, list | np.ndarray) and all(isinstance(v, int | np.integer) for v in labels):
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != 3 * 32 * 32
        or y is None
        or y.size != data.shape[0]
        or (y.size and (int(y.min()) < 0 or int(y.max()) >= classes))
    ):
        raise DataUnavailableError(
            f"{path} is not a CIFAR python batch (it needs 'data' as uint8 (N, 3072) and N '{label_key}' in "
            f"[0, {classes})); replace it with the file from the official archive."
        )
    return data.reshape(-1, 3, 32, 32), y


class CIFAR10DataModule(FederatedDataModule):
    """CIFAR-10: 50,000 train and 10,000 test 3×32×32 colour images, 10 classes.

    Takes the keyword arguments of :class:`FederatedDataModule` (``max_train_samples`` and
    ``max_test_samples`` select images before any JPEG is decoded) and:

    Args:
        source: ``auto``, ``python``, ``jpeg`` or ``png`` (see the module docstring).
        random_crop: Random crop with padding 4 in :meth:`augment`.
        horizontal_flip: Random horizontal flip in :meth:`augment`.
        cache_dir: Where decoded JPEG arrays are cached (``None``: ``$FEDLIGHTNING_CACHE`` or
            ``~/.cache/fedlightning``); ``""`` disables the cache.
        test_holdout_fraction: Share of the 200 PNG images used as the test set (``png``).
        **kwargs: :class:`FederatedDataModule` arguments.
    """

    name = "cifar10"
    num_classes = 10
    input_shape = (3, 32, 32)
    feature_dtype = None  # keep uint8; normalised per batch
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    folder_name = "cifar-10-batches-py"
    lossless_only = False

    def __init__(
        self,
        *,
        source: str = "auto",
        random_crop: bool = True,
        horizontal_flip: bool = True,
        cache_dir: str | None = None,
        test_holdout_fraction: float = 0.2,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        allowed = ("auto", "python") if self.lossless_only else ("auto", "python", "jpeg", "png")
        if source not in allowed:
            raise ValueError(f"data.source must be one of {', '.join(allowed)} for data={self.name} (got {source!r}).")
        if not 0.0 < test_holdout_fraction < 1.0:
            raise ValueError(f"data.test_holdout_fraction must be in (0, 1) (got {test_holdout_fraction}).")
        self.source = source
        self.random_crop = random_crop
        self.horizontal_flip = horizontal_flip
        self.cache_dir = cache_dir
        self.test_holdout_fraction = float(test_holdout_fraction)
        self._mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        self._std = torch.tensor(self.std).view(1, 3, 1, 1)

    # -- batch hooks -----------------------------------------------------------------------

    def transform(self, x: Tensor) -> Tensor:
        """``uint8`` images to normalised ``float32``."""
        mean, std = self._mean.to(x.device), self._std.to(x.device)
        return (x.float() / 255.0 - mean) / std

    def augment(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Random crop (padding 4) and horizontal flip as configured, then :meth:`transform`."""
        x = random_crop_flip(x, generator, crop=self.random_crop, flip=self.horizontal_flip)
        return self.transform(x)

    # -- sources ---------------------------------------------------------------------------

    @property
    def python_folder(self) -> Path:
        """``<root>/cifar-10-batches-py`` (torchvision's layout)."""
        return self.root / self.folder_name

    def _python_files(self) -> tuple[list[Path], Path]:
        return [self.python_folder / f"data_batch_{i}" for i in range(1, 6)], self.python_folder / "test_batch"

    def _resolve_source(self) -> str:
        if self.source != "auto":
            return self.source
        train, test = self._python_files()
        if all(p.is_file() for p in [*train, test]):
            return "python"
        if not self.lossless_only and (self.root / JPEG_TAR).is_file():
            return "jpeg"
        if not self.lossless_only and (self.root / PNG_DIR / "trainLabels.csv").is_file():
            return "png"
        raise self._unavailable(test)

    def _unavailable(self, path: Path, why: str = "") -> DataUnavailableError:
        return DataUnavailableError(
            f"{self.name.upper()} not found: expected {path}{why} under data.root={self.root}; point data.root at a "
            f"folder holding {self.folder_name}/ or set data.download=true when online."
        )

    def _download(self) -> None:
        train, test = self._python_files()
        if self.source not in ("auto", "python") or all(p.is_file() for p in [*train, test]):
            return
        if self.source == "auto" and self._resolve_source_offline():
            return
        from torchvision import datasets  # only needed online

        cls = datasets.CIFAR100 if self.lossless_only else datasets.CIFAR10
        try:
            cls(str(self.root), train=True, download=True)
        except Exception as err:  # any network or IO failure means the same to the user
            raise self._unavailable(test, f" and the download failed ({type(err).__name__})") from err

    def _resolve_source_offline(self) -> bool:
        return not self.lossless_only and ((self.root / JPEG_TAR).is_file() or (self.root / PNG_DIR).is_dir())

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        source = self._resolve_source()
        if source == "python":
            return self._load_python()
        if source == "jpeg":
            self._add_notice(
                "LOSSY source: CIFAR-10 decoded from JPEG quality 75 (cifar10-jpeg-q75.tar); fine for pipeline tests, "
                "not for accuracy comparisons with papers"
            )
            return self._load_jpeg()
        return self._load_png()

    def _load_python(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        train_files, test_file = self._python_files()
        label_key = "labels" if not self.lossless_only else "fine_labels"
        out = []
        for files in (train_files, [test_file]):
            xs, ys = [], []
            for path in files:
                if not path.is_file():
                    raise self._unavailable(path)
                x, y = _batch_arrays(path, _read_pickle(path), label_key, self.num_classes)
                xs.append(x)
                ys.append(y)
            out.append((torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))))
        return out[0], out[1]

    def _jpeg_cache_path(self, tar_path: Path) -> Path | None:
        if self.cache_dir == "":
            return None
        base = Path(self.cache_dir) if self.cache_dir else package_cache_dir()
        st = tar_path.stat()
        return base.expanduser() / "cifar10-jpeg" / f"{tar_path.name}-{st.st_size}-{st.st_mtime_ns}.npz"

    def _load_jpeg(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        tar_path = self.root / JPEG_TAR
        if not tar_path.is_file():
            raise self._unavailable(tar_path)
        full = self.max_train_samples is None and self.max_test_samples is None
        cache = self._jpeg_cache_path(tar_path) if full else None
        if cache is not None and cache.is_file():
            with np.load(cache) as z:
                log.info("cifar10: decoded JPEGs read from cache %s", cache)
                return (
                    (torch.from_numpy(z["x_train"]), torch.from_numpy(z["y_train"])),
                    (torch.from_numpy(z["x_test"]), torch.from_numpy(z["y_test"])),
                )
        from PIL import Image

        with tarfile.open(tar_path) as tf:
            members: dict[str, list[tuple[int, str, tarfile.TarInfo]]] = {"train": [], "test": []}
            for m in tf.getmembers():
                parts = m.name.split("/")
                if m.isfile() and len(parts) == 3 and parts[0] in members and parts[1] in CIFAR10_CLASSES:
                    members[parts[0]].append((CIFAR10_CLASSES.index(parts[1]), parts[2], m))
            out = []
            for split, limit in (("train", self.max_train_samples), ("test", self.max_test_samples)):
                items = sorted(members[split], key=lambda t: (t[0], t[1]))
                if not items:
                    raise DataUnavailableError(f"{tar_path} holds no {split}/<class>/*.jpg images.")
                keep = subset_indices(len(items), limit, self.seed)
                chosen = items if keep is None else [items[i] for i in keep]
                x = np.empty((len(chosen), 32, 32, 3), dtype=np.uint8)
                for i, (_, _, m) in enumerate(chosen):
                    f = tf.extractfile(m)
                    assert f is not None
                    x[i] = np.asarray(Image.open(io.BytesIO(f.read())).convert("RGB"))
                y = np.fromiter((c for c, _, _ in chosen), dtype=np.int64, count=len(chosen))
                if keep is not None:
                    if split == "train":  # saved partitions index the full split
                        self._dataset_rows = (len(items), keep)
                    what = "training" if split == "train" else "test"
                    self._add_notice(f"subset: {len(chosen):,} of {len(items):,} {what} JPEGs decoded")
                out.append((np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y))
        if cache is not None:
            _write_cache(cache, x_train=out[0][0], y_train=out[0][1], x_test=out[1][0], y_test=out[1][1])
            log.info("cifar10: decoded JPEGs cached at %s", cache)
        (x_tr, y_tr), (x_te, y_te) = out
        return (torch.from_numpy(x_tr), torch.from_numpy(y_tr)), (torch.from_numpy(x_te), torch.from_numpy(y_te))

    def _load_png(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        from PIL import Image

        folder = self.root / PNG_DIR
        labels_csv = folder / "trainLabels.csv"
        if not labels_csv.is_file():
            raise self._unavailable(labels_csv)
        with labels_csv.open(newline="") as f:
            rows = [(int(Path(r[0]).stem), r[1]) for r in csv.reader(f) if r and r[0] != "id"]
        rows.sort()
        x = np.stack([np.asarray(Image.open(folder / "train" / f"{i}.png").convert("RGB")) for i, _ in rows])
        y = np.array([CIFAR10_CLASSES.index(c) for _, c in rows], dtype=np.int64)
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        perm = np.random.default_rng([self.seed, 3]).permutation(len(y))
        n_hold = round(self.test_holdout_fraction * len(y))
        hold, rest = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
        self._dataset_rows = (len(y), rest)  # saved partitions index the PNGs
        self._add_notice(
            f"subset: {len(y)} of 60,000 CIFAR-10 images (lossless PNGs of the first training batch); "
            f"{len(rest)} for training and {len(hold)} held out as the test set"
        )
        return (
            (torch.from_numpy(x[rest]), torch.from_numpy(y[rest])),
            (torch.from_numpy(x[hold]), torch.from_numpy(y[hold])),
        )


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (100 fine classes) from torchvision's ``<root>/cifar-100-python`` (``train``, ``test``)."""

    name = "cifar100"
    num_classes = 100
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    folder_name = "cifar-100-python"
    lossless_only = True

    def _python_files(self) -> tuple[list[Path], Path]:
        return [self.python_folder / "train"], self.python_folder / "test"
