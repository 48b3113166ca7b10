"""MNIST (LeCun, Cortes and Burges), read from torchvision's layout ``<root>/MNIST/raw``.

The decompressed IDX files are parsed here directly (and checked against their canonical
md5s), so reading never writes into ``root``: a read-only copy works. torchvision is only
used to download, when ``download`` is true and the files are missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import DataUnavailableError, FederatedDataModule

__all__ = ["MNISTDataModule", "read_idx"]

MEAN, STD = 0.1307, 0.3081

# Canonical md5 of the decompressed files.
FILES = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}


def read_idx(path: Path) -> np.ndarray:
    """Read an unsigned-byte IDX file (big-endian header: magic, then one size per dim).

    Args:
        path: The decompressed file.

    Returns:
        A ``uint8`` array of the shape the header states.

    Raises:
        ValueError: If the header is not that of a ``uint8`` IDX file or sizes disagree.
    """
    raw = path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number).")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} holds {data.size} bytes of data but its header says {shape}.")
    return data.reshape(shape)


class MNISTDataModule(FederatedDataModule):
    """MNIST: 60,000 train and 10,000 test 28×28 digits, normalised with mean 0.1307, std 0.3081.

    Takes the keyword arguments of :class:`FederatedDataModule`; ``root`` is the folder that
    holds ``MNIST/raw`` (torchvision's layout).
    """

    name = "mnist"
    num_classes = 10
    input_shape = (1, 28, 28)

    @property
    def raw_folder(self) -> Path:
        """``<root>/MNIST/raw``."""
        return self.root / "MNIST" / "raw"

    def _missing(self) -> list[Path]:
        return [self.raw_folder / f for f in FILES if not (self.raw_folder / f).is_file()]

    def _unavailable(self, path: Path, why: str = "") -> DataUnavailableError:
        return DataUnavailableError(
            f"MNIST not found: expected {path}{why}; set data.root to a folder holding MNIST/raw "
            "(torchvision layout) or data.download=true when online."
        )

    def _download(self) -> None:
        missing = self._missing()
        if not missing:
            return
        from torchvision.datasets import MNIST  # only needed online

        try:
            MNIST(str(self.root), train=True, download=True)
        except Exception as err:  # any network or IO failure means the same to the user
            raise self._unavailable(missing[0], f" and the download failed ({type(err).__name__})") from err

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        missing = self._missing()
        if missing:
            raise self._unavailable(missing[0])
        for f, md5 in FILES.items():
            if hashlib.md5((self.raw_folder / f).read_bytes()).hexdigest() != md5:
                raise DataUnavailableError(
                    f"MNIST file {self.raw_folder / f} is corrupt (md5 differs from {md5}); "
                    "replace it with the decompressed original or set data.download=true after deleting it."
                )
        return self._split("train"), self._split("t10k")

    def _split(self, prefix: str) -> tuple[Tensor, Tensor]:
        images = read_idx(self.raw_folder / f"{prefix}-images-idx3-ubyte")
        labels = read_idx(self.raw_folder / f"{prefix}-labels-idx1-ubyte")
        x = torch.from_numpy(images.astype(np.float32)).div_(255.0).sub_(MEAN).div_(STD)
        return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))
