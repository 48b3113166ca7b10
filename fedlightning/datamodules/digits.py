"""The 8×8 digits data set, shipped inside the package: the embedded default that needs no download.

``data/digits.npz`` holds the 1,797 images and labels of the test set of the UCI "Optical
Recognition of Handwritten Digits" data set (E. Alpaydin and C. Kaynak, 1998; CC BY 4.0), in
the order and with the values of the copy scikit-learn ships as ``load_digits`` (a test checks
both). Reading it needs numpy only: importing scikit-learn (and the parts of scipy it loads)
cost more than a second of the command's start-up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import FederatedDataModule
from fedlightning.datamodules.partition import grouped_holdout

__all__ = ["DIGITS_FILE", "DigitsDataModule", "load_digits_arrays"]

DIGITS_FILE = Path(__file__).with_name("data") / "digits.npz"


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 images ``(N, 8, 8)`` with integer pixels ``0..16`` and their labels, both uint8."""
    with np.load(DIGITS_FILE) as saved:
        return saved["images"], saved["target"]


class DigitsDataModule(FederatedDataModule):
    """1,797 8×8 handwritten digits (10 classes), embedded in the package.

    Pixels are scaled from ``0..16`` to ``[0, 1]``; images have shape ``(1, 8, 8)``. The test
    split holds out ``round(0.2 · n_c)`` digits of each class c, drawn from ``seed`` (359 of
    1,797); ``root`` and ``download`` are ignored. Takes the keyword arguments of
    :class:`FederatedDataModule`.
    """

    name = "digits"
    num_classes = 10
    input_shape = (1, 8, 8)
    test_fraction = 0.2

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        images, target = load_digits_arrays()
        x = (images.astype(np.float32) / 16).reshape(-1, *self.input_shape)
        y = target.astype(np.int64)
        perm = np.random.default_rng([self.seed, 3]).permutation(len(y))
        idx_te, idx_tr = (np.sort(part) for part in grouped_holdout(y, self.test_fraction, perm))
        self._dataset_rows = (len(y), idx_tr)  # saved partitions index the 1,797 digits
        return (torch.from_numpy(x[idx_tr]), torch.from_numpy(y[idx_tr])), (
            torch.from_numpy(x[idx_te]),
            torch.from_numpy(y[idx_te]),
        )
