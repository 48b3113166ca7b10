"""Where the package finds its own files: the Hydra config folder.

Configs live in the top-level ``configs/`` folder of a source checkout and are shipped inside
the wheel as ``fedlightning/configs``, so both the command (:mod:`fedlightning.cli`) and
:func:`fedlightning.run.run` read the same tree.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["config_dir"]


def config_dir() -> str:
    """The config folder: the wheel's packaged copy, else the checkout's ``configs/``.

    >>> (Path(config_dir()) / "train.yaml").is_file()
    True
    """
    packaged = Path(__file__).resolve().parent / "configs"
    if packaged.is_dir():
        return str(packaged)
    return str(Path(__file__).resolve().parents[1] / "configs")
