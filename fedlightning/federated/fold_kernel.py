"""The compiled inner loop of :class:`fedlightning.federated.aggregators.WeightedMean`.

``sums[i] += weight · float64(x[i])`` for float64 ``sums`` and a float32 upload ``x``: the
product is rounded once to float64 and then added (no fused multiply-add, no ``fastmath``),
so the result is the one ``sums + weight * x.double()`` gives, bit for bit. The loop reads
each vector once, where PyTorch's mixed-dtype ``add_`` is about twice as slow (timings in
``benchmarks/results/performance.md``). The module imports numba, so
:mod:`fedlightning.federated.aggregators` imports it only for uploads large enough to gain;
compiled code is cached on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fold_float32"]


@njit(cache=True, nogil=True, boundscheck=False)
def fold_float32(sums: np.ndarray, x: np.ndarray, weight: float) -> None:  # pragma: no cover - compiled
    """sums ← sums + weight · x, elementwise, in float64 (``sums`` float64, ``x`` float32, same length)."""
    for i in range(sums.shape[0]):
        sums[i] += weight * np.float64(x[i])
