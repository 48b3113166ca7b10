"""Where the package finds its own files (the Hydra config folder) and keeps its caches.

Configs live in the top-level ``configs/`` folder of a source checkout and are shipped inside
the wheel as ``fedlightning/configs``, so both the command (:mod:`fedlightning.cli`) and
:func:`fedlightning.run.run` read the same tree.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "config_dir"]

CACHE_ENV = "FEDLIGHTNING_CACHE"
"""The environment variable that moves the cache folder (:func:`cache_dir`)."""


def config_dir() -> str:
    """The config folder: the wheel's packaged copy, else the checkout's ``configs/``.

    >>> (Path(config_dir()) / "train.yaml").is_file()
    True
    """
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "configs")


def cache_dir() -> Path:
    """The folder of the package's caches: ``$FEDLIGHTNING_CACHE``, else ``~/.cache/fedlightning``.

    It holds what can be rebuilt (decoded CIFAR-10 JPEGs, the pre-flight's target index), never results.
    """
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fedlightning").expanduser()
