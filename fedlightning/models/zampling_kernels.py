"""Compiled CPU kernels for Zampling's sparse products w = Q·z and Qᵀ·g (arXiv 2503.14246).

Q (m × n, exactly d non-zeros per row) is read in two layouts:

* **rows**: ``cols``/``vals`` of shape (m, d), row i's d non-zeros side by side; column indices
  are unsigned (uint16 when n ≤ 65,536, else uint32), which spares the compiled loop the
  negative-index wrap-around check and, at uint16, a quarter of the bytes per entry. The full
  products read it once, in order, and touch each entry of the m-long vector (w, or ∂L/∂w) once;
* **CSC** (the rows of Qᵀ): ``col_ptr``, ``col_rows`` (uint32), ``col_vals``, for the work on a
  few columns: the incremental update and the free-column backward.

Each kernel is a plain loop compiled by numba (``fastmath`` unless noted, no bounds checks,
one thread), so it runs at the speed of a C loop (``benchmarks/zampling_speed.py --kernels``
times them against ``torch.mv`` on CSR; results in ``benchmarks/results/``). Callers check
shapes and dtypes (:class:`fedlightning.models.zampling.SparseQ`); the kernels do not.
Compiled code is cached on disk, so only the first process pays the compilation.

Example:
    >>> import numpy as np
    >>> cols = np.array([[0], [1]], dtype=np.uint16)      # d = 1, m = 2: Q = [[2, 0], [0, 3]]
    >>> vals = np.array([[2.0], [3.0]], dtype=np.float32)
    >>> w = np.empty(2, np.float32)
    >>> row_matvec(cols, vals, np.array([1.0, 1.0], np.float32), w)
    >>> w.tolist()
    [2.0, 3.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = [
    "add_changed_columns",
    "add_columns",
    "add_drawn_columns",
    "free_rmatvec",
    "row_matmat",
    "row_matvec",
    "row_rmatvec",
]

_JIT: dict[str, Any] = {"fastmath": True, "boundscheck": False, "nogil": True, "cache": True}


@njit(**_JIT)
def row_matvec(cols: np.ndarray, vals: np.ndarray, z: np.ndarray, out: np.ndarray) -> None:
    """out ← Q·z: out[i] = Σ_k vals[i, k]·z[cols[i, k]], row by row (each out[i] written once)."""
    m, d = cols.shape
    for i in range(m):
        acc = vals[i, 0] * z[cols[i, 0]]
        for k in range(1, d):
            acc += vals[i, k] * z[cols[i, k]]
        out[i] = acc


@njit(**_JIT)
def row_matmat(cols: np.ndarray, vals: np.ndarray, z: np.ndarray, out: np.ndarray) -> None:
    """out ← Q·Z for B masks at once: z is (n, B), out (m, B); each gathered row z[j, :] is contiguous.

    One pass over Q's non-zeros serves all B masks, so the gather cost of Q·z is paid once per
    B networks (the per-round evaluation of many sampled networks).
    """
    m, d = cols.shape
    b = z.shape[1]
    for i in range(m):
        v = vals[i, 0]
        j = cols[i, 0]
        for c in range(b):
            out[i, c] = v * z[j, c]
        for k in range(1, d):
            v = vals[i, k]
            j = cols[i, k]
            for c in range(b):
                out[i, c] += v * z[j, c]


@njit(**_JIT)
def row_rmatvec(cols: np.ndarray, vals: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """out ← Qᵀ·g: scatter vals[i, k]·g[i] into out[cols[i, k]] (out, n floats, stays in cache)."""
    m, d = cols.shape
    out[:] = 0.0
    for i in range(m):
        gi = g[i]
        for k in range(d):
            out[cols[i, k]] += vals[i, k] * gi


@njit(**_JIT)
def add_columns(
    col_ptr: np.ndarray,
    col_rows: np.ndarray,
    col_vals: np.ndarray,
    columns: np.ndarray,
    coef: np.ndarray,
    w: np.ndarray,
) -> None:
    """w ← w + Σ_t coef[t]·Q[:, columns[t]] in place (the incremental update w + Q·(z_new − z_old))."""
    for t in range(columns.shape[0]):
        j = columns[t]
        c = coef[t]
        for e in range(col_ptr[j], col_ptr[j + 1]):
            w[col_rows[e]] += c * col_vals[e]


@njit(**_JIT)
def add_changed_columns(
    col_ptr: np.ndarray,
    col_rows: np.ndarray,
    col_vals: np.ndarray,
    z: np.ndarray,
    z_old: np.ndarray,
    w: np.ndarray,
    max_changed: int,
) -> int:
    """w ← w + Q·(z − z_old) and z_old ← z, over the coordinates where they differ; returns their number.

    When more than ``max_changed`` differ, nothing is written (the caller recomputes Q·z in
    full). Each changed column is added as :func:`add_columns` adds it, in ascending order.
    """
    changed = 0
    for j in range(z.shape[0]):
        if z[j] != z_old[j]:
            changed += 1
    if changed > max_changed:
        return changed
    for j in range(z.shape[0]):
        if z[j] != z_old[j]:
            c = z[j] - z_old[j]
            for e in range(col_ptr[j], col_ptr[j + 1]):
                w[col_rows[e]] += c * col_vals[e]
            z_old[j] = z[j]
    return changed


@njit(boundscheck=False, nogil=True, cache=True)  # no fastmath: NaN must fail the range check
def add_drawn_columns(
    col_ptr: np.ndarray,
    col_rows: np.ndarray,
    col_vals: np.ndarray,
    p: np.ndarray,
    u: np.ndarray,
    z_old: np.ndarray,
    w: np.ndarray,
    max_changed: int,
) -> int:
    """u ← z = (u < p) as 0/1, then :func:`add_changed_columns` with z; returns its count, or −1.

    With u uniform on [0, 1) (``torch.rand``) z is a Bernoulli(p) mask: the one
    ``torch.bernoulli(p)`` draws from the same uniforms. Returns −1, writing nothing else, when
    some p lies outside [0, 1] or is NaN.
    """
    for j in range(p.shape[0]):
        if not (0.0 <= p[j] <= 1.0):
            return -1
    for j in range(p.shape[0]):
        u[j] = np.float32(1.0) if u[j] < p[j] else np.float32(0.0)
    return add_changed_columns(col_ptr, col_rows, col_vals, u, z_old, w, max_changed)


@njit(**_JIT)
def free_rmatvec(
    col_ptr: np.ndarray,
    col_rows: np.ndarray,
    col_vals: np.ndarray,
    p: np.ndarray,
    g: np.ndarray,
    out: np.ndarray,
) -> int:
    """out[j] ← (Qᵀ·g)[j] where 0 < p[j] < 1, else 0; returns the number of such free columns.

    The masked backward of Zampling's straight-through gradient (columns with p ∈ {0, 1} get
    none), with no per-step index list or cached block: its cost is the free columns' non-zeros.
    """
    free = 0
    for j in range(p.shape[0]):
        if 0.0 < p[j] < 1.0:
            free += 1
            acc = np.float32(0.0)
            for e in range(col_ptr[j], col_ptr[j + 1]):
                acc += col_vals[e] * g[col_rows[e]]
            out[j] = acc
        else:
            out[j] = np.float32(0.0)
    return free
