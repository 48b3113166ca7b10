"""scikit-learn's bundled digits data set: the embedded default that needs no download."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import FederatedDataModule

__all__ = ["DigitsDataModule"]


class DigitsDataModule(FederatedDataModule):
    """1,797 8×8 handwritten digits (10 classes), shipped with scikit-learn.

    Pixels are scaled from ``0..16`` to ``[0, 1]``; images have shape ``(1, 8, 8)``. A
    stratified 20% test split is fixed by ``seed``; ``root`` and ``download`` are ignored.
    Takes the keyword arguments of :class:`FederatedDataModule`.
    """

    name = "digits"
    num_classes = 10
    input_shape = (1, 8, 8)
    test_fraction = 0.2

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        # scikit-learn (and the parts of scipy it loads) only when digits are used: importing
        # this module (every run imports the data package) stays cheap.
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.images / 16.0).astype(np.float32).reshape(-1, *self.input_shape)
        y = digits.target.astype(np.int64)
        idx_tr, idx_te = train_test_split(
            np.arange(len(y)), test_size=self.test_fraction, stratify=y, random_state=self.seed
        )
        self._dataset_rows = (len(y), idx_tr)  # saved partitions index scikit-learn's 1,797 digits
        return (torch.from_numpy(x[idx_tr]), torch.from_numpy(y[idx_tr])), (
            torch.from_numpy(x[idx_te]),
            torch.from_numpy(y[idx_te]),
        )
