"""Compiled CPU loops of the round engine (numba, one thread, cached on disk).

:func:`fold_float32` is the aggregators' accumulation Σ ← Σ + c·x of a float32 upload into
float64 sums. PyTorch's ``sums.add_(x, alpha=c)`` across the two dtypes computes the same
fused multiply-add per entry but converts through a slower mixed-dtype loop; the compiled loop
reads x once and gives the same bits (``tests/test_aggregation.py`` checks it against
``add_``). Imported on first use by :func:`fedlightning.federated.aggregators.fold_into_`,
only for uploads large enough to repay numba's import.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fold_float32"]


@njit(fastmath={"contract"}, boundscheck=False, nogil=True, cache=True)
def fold_float32(x: np.ndarray, sums: np.ndarray, weight: float) -> None:
    """sums[i] ← sums[i] + weight·x[i] in float64, one fused multiply-add per entry (x float32)."""
    for i in range(x.shape[0]):
        sums[i] = sums[i] + weight * np.float64(x[i])
