"""Keep ``torch.cuda.is_available()`` cheap on machines without NVML.

Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` when it is imported, so that
``torch.cuda.is_available()`` asks NVML for the device count instead of initialising CUDA
(which would poison later forks). Where the NVML library cannot be loaded (a CPU machine with
torch's default CUDA build), torch then tries to load it on every call and falls back to the
CUDA runtime's count, the very call the variable was meant to avoid. Adam-type optimisers call
``torch.accelerator.is_available()`` on every ``step()`` (their graph-capture check), so each
local step of an Adam client paid a failed library load. On such a machine the variable
protects nothing, and :func:`drop_unusable_nvml_check` removes it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, MutableMapping

__all__ = ["NVML_CHECK", "drop_unusable_nvml_check", "nvml_loads"]

#: The variable that makes torch count CUDA devices through NVML.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def nvml_loads() -> bool:
    """Whether the NVML library (``libnvidia-ml.so.1``) can be loaded in this process."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def drop_unusable_nvml_check(
    environ: MutableMapping[str, str] | None = None, *, nvml_available: Callable[[], bool] = nvml_loads
) -> bool:
    """Remove ``PYTORCH_NVML_BASED_CUDA_CHECK`` from ``environ`` (default ``os.environ``) when NVML
    cannot be loaded; returns whether it was removed. Where NVML loads, the variable is kept."""
    environ = os.environ if environ is None else environ
    if environ.get(NVML_CHECK) != "1" or nvml_available():
        return False
    del environ[NVML_CHECK]
    return True
