"""EMNIST (Cohen et al., 2017, arXiv:1702.05373) and federated EMNIST by writer (FEMNIST).

:class:`EMNISTDataModule` reads torchvision's layout ``<root>/EMNIST/raw/emnist-<split>-{train,
test}-{images-idx3,labels-idx1}-ubyte`` (decompressed, or ``.gz``) for the six official splits,
transposes the images upright, and maps ``letters`` labels 1..26 to 0..25. Reading never
writes into ``root``. A train split that is only present as a subset
(``emnist-<split>-train-subset-*``, e.g. the offline copy's 9,120 of the 112,800 balanced
training images) is served with a "subset: n of N" notice. When a split's training files are
missing, loading stops with an error naming the file, unless ``train_from="test"`` is set:
then a random ``1 - test_holdout_fraction`` of the official *test* split is used for training
and the rest for testing, with a notice saying so (numbers are then not comparable to papers).
Symmetrically, ``test_from="train"`` tests on a held-out part of the training files when a
split's test files are missing (the offline copy has no balanced test split).

:class:`FEMNISTDataModule` reads the writer-partitioned versions: TFF's HDF5
(``fed_emnist_{train,test}.h5``: ``examples/<writer>/{pixels,label}``, 3,400 writers, 62 classes)
or LEAF's JSON (``{train,test}/*.json`` with ``user_data[u] = {"x": [784 floats], "y": [labels]}``,
3,550 writers). Both store white-background pixels in [0, 1]; they are inverted (``1 - p``) to
MNIST's ink-is-high convention unless ``invert=False``. ``partition=natural`` gives one client per
writer (LEAF, arXiv:1812.01097).
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import DataUnavailableError, FederatedDataModule
from fedlightning.datamodules.mnist import read_idx

__all__ = ["EMNIST_SPLITS", "EMNISTDataModule", "FEMNISTDataModule", "emnist_classes"]

log = logging.getLogger(__name__)

#: Classes per split and official train/test sizes.
EMNIST_SPLITS: dict[str, tuple[int, int, int]] = {
    "byclass": (62, 697_932, 116_323),
    "bymerge": (47, 697_932, 116_323),
    "balanced": (47, 112_800, 18_800),
    "letters": (26, 124_800, 20_800),
    "digits": (10, 240_000, 40_000),
    "mnist": (10, 60_000, 10_000),
}
#: Mean and standard deviation of pixels scaled to [0, 1], measured on the byclass test split.
MEAN, STD = 0.1736, 0.3317
#: NIST's ``gzip.zip`` (about 536 MiB), what torchvision downloads.
EMNIST_URL = "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"

_DIGITS = "0123456789"
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_MERGED_LOWER = "abdefghnqrt"  # the lower-case letters bymerge/balanced keep apart from upper case


def emnist_classes(split: str) -> list[str]:
    """Character of each label of ``split`` (after mapping ``letters`` to 0..25).

    Example:
        >>> emnist_classes("balanced")[9:12], len(emnist_classes("byclass")), emnist_classes("letters")[0]
        (['9', 'A', 'B'], 62, 'A')
    """
    if split in ("digits", "mnist"):
        return list(_DIGITS)
    if split == "letters":
        return list(_UPPER)
    if split == "byclass":
        return list(_DIGITS + _UPPER + _UPPER.lower())
    if split in ("bymerge", "balanced"):
        return list(_DIGITS + _UPPER + _MERGED_LOWER)
    raise ValueError(f"data.split must be one of {', '.join(EMNIST_SPLITS)} (got {split!r}).")


def _read_any(path: Path) -> np.ndarray:
    """Read an IDX file, decompressing ``.gz`` in memory."""
    if path.suffix == ".gz":
        tmp = gzip.decompress(path.read_bytes())
        from tempfile import NamedTemporaryFile

        with NamedTemporaryFile(suffix="-ubyte") as f:  # read_idx takes a path; never next to the data
            f.write(tmp)
            f.flush()
            return read_idx(Path(f.name)).copy()
    return read_idx(path)


def _to_input(images: np.ndarray) -> Tensor:
    """``uint8 (N, 28, 28)`` in the official transposed orientation -> upright, normalised ``(N, 1, 28, 28)``."""
    x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 2, 1))).float()
    return x.div_(255.0).sub_(MEAN).div_(STD).unsqueeze(1)


class EMNISTDataModule(FederatedDataModule):
    """EMNIST, one of ``byclass, bymerge, balanced, letters, digits, mnist``; images 1×28×28, upright.

    Takes the keyword arguments of :class:`FederatedDataModule` and:

    Args:
        split: The official split (``data.split``).
        train_from: ``"train"`` (default) or ``"test"``: carve training data out of the official
            test split when its training files are unavailable (labelled in the notice).
        test_from: ``"test"`` (default) or ``"train"``: hold out part of the training files for
            testing when the split's test files are unavailable (labelled in the notice).
        test_holdout_fraction: With ``train_from="test"`` or ``test_from="train"``, the share
            of the split that is carved into the test set.
        **kwargs: :class:`FederatedDataModule` arguments (``root`` holds ``EMNIST/raw``).
    """

    name = "emnist"
    input_shape = (1, 28, 28)

    def __init__(
        self,
        *,
        split: str = "balanced",
        train_from: str = "train",
        test_from: str = "test",
        test_holdout_fraction: float = 0.2,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.classes = emnist_classes(split)
        if train_from not in ("train", "test"):
            raise ValueError(f"data.train_from must be 'train' or 'test' (got {train_from!r}).")
        if test_from not in ("train", "test") or (train_from, test_from) == ("test", "train"):
            raise ValueError(
                f"data.test_from must be 'test' or 'train', and not 'train' together with data.train_from=test "
                f"(got test_from={test_from!r}, train_from={train_from!r})."
            )
        self.test_from = test_from
        if not 0.0 < test_holdout_fraction < 1.0:
            raise ValueError(f"data.test_holdout_fraction must be in (0, 1) (got {test_holdout_fraction}).")
        self.split = split
        self.num_classes = len(self.classes)
        self.train_from = train_from
        self.test_holdout_fraction = float(test_holdout_fraction)

    @property
    def raw_folder(self) -> Path:
        """``<root>/EMNIST/raw`` (torchvision's layout)."""
        return self.root / "EMNIST" / "raw"

    def _file(self, part: str, kind: str) -> Path | None:
        """The images or labels file of ``part`` (``train``, ``train-subset``, ``test``), if present."""
        stem = f"emnist-{self.split}-{part}-{'images-idx3' if kind == 'images' else 'labels-idx1'}-ubyte"
        for path in (self.raw_folder / stem, self.raw_folder / f"{stem}.gz"):
            if path.is_file():
                return path
        return None

    def _unavailable(self, part: str, why: str = "") -> DataUnavailableError:
        expected = self.raw_folder / f"emnist-{self.split}-{part}-images-idx3-ubyte"
        hint = {
            "train": " or data.train_from=test to train on part of the test split",
            "test": " or data.test_from=train to test on part of the training split",
        }.get(part, "")
        return DataUnavailableError(
            f"EMNIST ({self.split}) not found: expected {expected}{why} under data.root={self.root}; point data.root "
            f"at a folder holding EMNIST/raw, set data.download=true when online{hint}."
        )

    def _download(self) -> None:
        has_test = self._file("test", "images") or self.test_from == "train"
        if has_test and (self._file("train", "images") or self.train_from == "test"):
            return
        from torchvision.datasets import EMNIST  # only needed online

        try:
            EMNIST(str(self.root), split=self.split, train=True, download=True)
        except Exception as err:  # any network or IO failure means the same to the user
            raise self._unavailable("train", f" and downloading {EMNIST_URL} failed ({type(err).__name__})") from err

    def _pair(self, part: str) -> tuple[np.ndarray, np.ndarray] | None:
        images, labels = self._file(part, "images"), self._file(part, "labels")
        if images is None or labels is None:
            return None
        x, y = _read_any(images), _read_any(labels).astype(np.int64)
        if len(x) != len(y):
            raise DataUnavailableError(f"EMNIST files {images} and {labels} hold {len(x)} images but {len(y)} labels.")
        if self.split == "letters":
            y = y - 1  # official labels are 1..26
        if y.min(initial=0) < 0 or y.max(initial=0) >= self.num_classes:
            raise DataUnavailableError(f"EMNIST file {labels} has labels outside [0, {self.num_classes}).")
        return x, y

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        _, n_train, n_test = EMNIST_SPLITS[self.split]
        test = self._pair("test") if self.test_from == "test" else None
        if test is None and self.test_from == "test":
            raise self._unavailable("test")
        if self.train_from == "test":
            assert test is not None
            train, test = self._carve(test, "test", "data.train_from=test")
        else:
            official = self._pair("train")
            if official is None:
                subset = self._pair("train-subset")
                if subset is None:
                    raise self._unavailable("train")
                train = subset
                self._add_notice(f"subset: {len(train[1]):,} of {n_train:,} {self.split} training images")
            else:
                train = official
            if len(train[1]) != n_train and official is not None:
                self._add_notice(f"subset: {len(train[1]):,} of {n_train:,} {self.split} training images")
            if test is None:
                train, test = self._carve(train, "training", "data.test_from=train")
            elif len(test[1]) != n_test:
                self._add_notice(f"subset: {len(test[1]):,} of {n_test:,} {self.split} test images")
        return (
            (_to_input(train[0]), torch.from_numpy(train[1])),
            (_to_input(test[0]), torch.from_numpy(test[1])),
        )

    def _carve(
        self, data: tuple[np.ndarray, np.ndarray], what: str, option: str
    ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Split ``data`` at random into (train, test) with ``test_holdout_fraction`` for testing."""
        perm = np.random.default_rng([self.seed, 3]).permutation(len(data[1]))
        n_hold = round(self.test_holdout_fraction * len(perm))
        hold, rest = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
        self._dataset_rows = (len(perm), rest)  # saved partitions index all images loaded
        self._add_notice(
            f"{option}: training on {len(rest):,} and testing on {len(hold):,} of the {len(perm):,} {what} images "
            "loaded, not on the official train/test split: not comparable to published EMNIST results"
        )
        return (data[0][rest], data[1][rest]), (data[0][hold], data[1][hold])


class FEMNISTDataModule(FederatedDataModule):
    """Federated EMNIST: handwritten characters grouped by writer (62 classes; 10 with ``only_digits``).

    Takes the keyword arguments of :class:`FederatedDataModule` and:

    Args:
        source: ``auto`` (TFF HDF5 if present, else LEAF JSON), ``tff`` or ``leaf``.
        only_digits: Read TFF's digits-only files (``fed_emnist_digitsonly_*.h5``, 10 classes).
        invert: Map white-background pixels ``p`` to ``1 - p`` (ink high, as in MNIST).
        **kwargs: :class:`FederatedDataModule` arguments; ``root`` holds ``femnist/`` with the
            HDF5 files or LEAF's ``train/`` and ``test/`` JSON folders.

    With ``partition=natural``, ``data.num_clients`` must be the number of writers or fewer.
    """

    name = "femnist"
    input_shape = (1, 28, 28)

    def __init__(self, *, source: str = "auto", only_digits: bool = False, invert: bool = True, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if source not in ("auto", "tff", "leaf"):
            raise ValueError(f"data.source must be auto, tff or leaf (got {source!r}).")
        self.source = source
        self.only_digits = only_digits
        self.invert = invert
        self.num_classes = 10 if only_digits else 62
        self.classes = emnist_classes("digits" if only_digits else "byclass")
        self.client_names: list[str] = []
        self._groups: np.ndarray | None = None

    @property
    def folder(self) -> Path:
        """``<root>/femnist``."""
        return self.root / "femnist"

    def _tff_files(self) -> list[Path]:
        stem = "fed_emnist_digitsonly" if self.only_digits else "fed_emnist"
        return [self.folder / f"{stem}_{s}.h5" for s in ("train", "test")]

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        tff = all(p.is_file() for p in self._tff_files())
        leaf = (self.folder / "train").is_dir() and any((self.folder / "train").glob("*.json"))
        source = self.source if self.source != "auto" else ("tff" if tff else "leaf" if leaf else "")
        if source == "tff" and tff:
            (xs, ys, names), (tx, ty, _) = (self._read_tff(p) for p in self._tff_files())
        elif source == "leaf" and leaf:
            (xs, ys, names), (tx, ty, _) = (self._read_leaf(self.folder / s) for s in ("train", "test"))
        else:
            raise DataUnavailableError(
                f"FEMNIST not found: looked for {self._tff_files()[0]} (TFF) and {self.folder / 'train'}/*.json "
                f"(LEAF) under data.root={self.root}; FEMNIST needs writer ids, which only these federated "
                "versions carry (download them online), or use data=emnist."
            )
        self.client_names = names
        self._groups = np.repeat(np.arange(len(ys)), [len(y) for y in ys])
        log.info("femnist (%s): %d writers", source, len(names))
        return (self._tensors(xs, ys), self._tensors(tx, ty))

    def _tensors(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[Tensor, Tensor]:
        x = torch.from_numpy(np.concatenate(xs).astype(np.float32).reshape(-1, 1, 28, 28))
        if self.invert:
            x = 1.0 - x
        y = torch.from_numpy(np.concatenate(ys).astype(np.int64))
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise DataUnavailableError(f"FEMNIST labels fall outside [0, {self.num_classes}); check data.only_digits.")
        return x.sub_(MEAN).div_(STD), y

    def _read_tff(self, path: Path) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
        import h5py

        with h5py.File(path, "r") as f:
            examples = f["examples"]
            names = sorted(examples)
            xs = [examples[c]["pixels"][()] for c in names]
            ys = [examples[c]["label"][()].reshape(-1) for c in names]
        return xs, ys, names

    def _read_leaf(self, folder: Path) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
        xs, ys, names = [], [], []
        for path in sorted(folder.glob("*.json")):
            raw = json.loads(path.read_text())
            for user in raw["users"]:
                data = raw["user_data"][user]
                names.append(user)
                xs.append(np.asarray(data["x"], dtype=np.float32).reshape(-1, 28, 28))
                ys.append(np.asarray(data["y"], dtype=np.int64))
        if not names:
            raise DataUnavailableError(f"FEMNIST LEAF folder {folder} holds no users.")
        return xs, ys, names

    def natural_groups(self) -> np.ndarray | None:
        """Writer index of every training sample (``client_names`` gives the writer ids)."""
        return self._groups
