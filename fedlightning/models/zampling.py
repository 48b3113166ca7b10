"""The Zampling parameterisation w = Q·z of any ``nn.Module`` (arXiv 2503.14246).

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246 (§"Our Framework"). Names follow the paper:

* ``m``: number of weights of the network (weights *and* biases, in ``parameters()`` order);
* ``n``: number of trainable parameters p ∈ [0,1]^n (the compression factor is m/n);
* ``d``: weight degree, the number of non-zeros of every row of Q;
* ``Q``: fixed m × n matrix, row i has d non-zeros at distinct random columns with values
  N(0, 6/(d·n_ℓ)), n_ℓ the fan-in of the neuron that weight i feeds (biases use the fan-in of
  their layer). Q is generated from a seed that server and clients share and is never sent;
* ``z`` ∈ {0,1}^n: a mask sampled from Bernoulli(p); the network's weights are w = Q·z
  (the *expected network* uses w = Q·p).

Q is stored by row and by column (CSC), each O(m·d). :class:`ZampledWeights`
computes w for consecutive masks incrementally (w ← w + Q·(z_new − z_old) over the columns
that changed), and its backward pass computes Qᵀ·∂L/∂w only for the columns that are still
free (0 < p < 1). On the CPU the products run on compiled kernels
(:mod:`fedlightning.models.zampling_kernels`); on other devices, and on the reference path
the tests compare against, on ``torch.mv`` over CSR layouts
(``benchmarks/zampling_speed.py --kernels`` measures every formulation).

Example:
    >>> from fedlightning.models.mlp import MLP
    >>> net = MLP(in_features=4, hidden=[3], num_classes=2)
    >>> q = zampling_q(row_fan_in(net), n=5, d=2, seed=0)
    >>> q.shape, q.d, int(q.row_degree().min()), int(q.row_degree().max())
    ((23, 5), 2, 2, 2)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.errors import ConfigError

__all__ = [
    "SparseQ",
    "ZampledNetwork",
    "ZampledWeights",
    "bernoulli_draw",
    "diagonal_q",
    "draw_distinct_columns",
    "glorot_std",
    "q_product",
    "row_fan_in",
    "row_fan_out",
    "zampling_q",
    "zampling_std",
]


def _csr_tensor(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    """A sparse CSR tensor built without PyTorch's two one-time warnings.

    PyTorch warns once per process that sparse CSR support is "in beta state" and that
    invariant checks are implicitly disabled. Q's layout is built here by construction
    (sorted, in-range indices, checked by the tests), so the checks are explicitly opted out
    and the beta notice is filtered locally (a module-level filter would be reset by pytest).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


# ---------------------------------------------------------------------------------- fan-in
def _module_fans(module: nn.Module) -> tuple[int, int]:
    """(fan_in, fan_out) of the neurons of a module with a ≥2-D ``weight`` (1, 1 otherwise)."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() >= 2:
        receptive = math.prod(weight.shape[2:])
        return int(weight.shape[1]) * receptive, int(weight.shape[0]) * receptive
    return 1, 1


def _row_fans(model: nn.Module, which: int) -> Tensor:
    out: list[Tensor] = []
    for module in model.modules():
        fans = _module_fans(module)
        for _, p in module.named_parameters(recurse=False):
            out.append(torch.full((p.numel(),), float(fans[which])))
    return torch.cat(out) if out else torch.zeros(0)


def row_fan_in(model: nn.Module) -> Tensor:
    """Fan-in n_ℓ of the neuron each weight feeds, one entry per weight in ``parameters()`` order.

    A weight of shape (out, in, k…) feeds a neuron with in·∏k inputs; a bias uses the fan-in
    of its layer (the paper leaves bias rows unspecified). Parameters of modules without a
    ≥2-D weight (normalisation layers) get fan-in 1.

    >>> from fedlightning.models.mlp import MLP
    >>> row_fan_in(MLP(in_features=3, hidden=[], num_classes=2)).tolist()
    [3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    """
    return _row_fans(model, 0)


def row_fan_out(model: nn.Module) -> Tensor:
    """Fan-out of each weight's layer (for Glorot initialisation), in ``parameters()`` order."""
    return _row_fans(model, 1)


def zampling_std(fan_in: Tensor, d: int) -> Tensor:
    """Standard deviation σ_i = sqrt(6 / (d·n_ℓ)) of Q's non-zeros in row i.

    >>> zampling_std(torch.tensor([6.0]), d=1).item()
    1.0
    """
    return torch.sqrt(6.0 / (d * fan_in))


def glorot_std(fan_in: Tensor, fan_out: Tensor) -> Tensor:
    """Glorot-normal standard deviation sqrt(2 / (fan_in + fan_out)) (Zhou et al.'s default).

    >>> glorot_std(torch.tensor([1.0]), torch.tensor([1.0])).item()
    1.0
    """
    return torch.sqrt(2.0 / (fan_in + fan_out))


# ---------------------------------------------------------------------------------- Q
def draw_distinct_columns(m: int, n: int, d: int, generator: torch.Generator) -> Tensor:
    """An (m, d) int64 tensor: for each row, d distinct columns in [0, n), sorted.

    Draws with replacement, then redraws only the duplicated entries until none remain
    (each round removes all but a d/n fraction of them); for d > n/2 it takes the top-d of
    uniform keys instead, which is exact and cheap because n is then small.

    >>> cols = draw_distinct_columns(4, 5, 5, torch.Generator().manual_seed(0))
    >>> cols.tolist()[0]
    [0, 1, 2, 3, 4]
    """
    if not 1 <= d <= n:
        raise ConfigError(f"method.d must be between 1 and n={n} (got d={d}); lower method.d or method.compression.")
    if 2 * d > n:
        out = torch.empty((m, d), dtype=torch.int64)
        chunk = max(1, 2**22 // n)
        for start in range(0, m, chunk):
            rows = min(chunk, m - start)
            keys = torch.rand((rows, n), generator=generator)
            out[start : start + rows] = keys.topk(d, dim=1).indices.sort(dim=1).values
        return out
    cols = torch.randint(0, n, (m, d), generator=generator).sort(dim=1).values
    while True:
        dup = torch.zeros_like(cols, dtype=torch.bool)
        dup[:, 1:] = cols[:, 1:] == cols[:, :-1]
        count = int(dup.sum())
        if count == 0:
            return cols
        cols[dup] = torch.randint(0, n, (count,), generator=generator)
        cols = cols.sort(dim=1).values


Backend = Literal["auto", "compiled", "torch"]


@dataclass
class SparseQ:
    """The m × n matrix Q with exactly ``d`` non-zeros per row.

    Products run on compiled kernels (:mod:`fedlightning.models.zampling_kernels`) for CPU
    tensors, over Q row by row and its CSC, and on ``torch.mv`` over CSR
    layouts elsewhere (GPU) or when asked (``backend="torch"``, the reference path). Every
    layout is O(m·d) and built on first use.

    Attributes:
        cols: (m, d) int64 column indices of each row (sorted, distinct).
        vals: (m, d) float32 values.
        n: number of columns.
    """

    cols: Tensor
    vals: Tensor
    n: int

    def __post_init__(self) -> None:
        m, d = self.cols.shape
        self.m, self.d = int(m), int(d)
        flat_cols = self.cols.reshape(-1)
        order = torch.argsort(flat_cols, stable=True)
        counts = torch.bincount(flat_cols, minlength=self.n)
        self.col_ptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=counts.device), counts.cumsum(0)])
        self.col_rows = (order // self.d).to(torch.int32)  # row of each entry, column-major (CSC)
        self.col_vals = self.vals.reshape(-1).to(torch.float32)[order]
        self._csr: Tensor | None = None
        self._csr_t: Tensor | None = None
        self._rows: tuple[np.ndarray, np.ndarray] | None = None
        self._csc: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._padded: tuple[Tensor, Tensor] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(m, n)."""
        return (self.m, self.n)

    @property
    def csr(self) -> Tensor:
        """Q as a sparse CSR tensor (int32 indices)."""
        if self._csr is None:
            crow = torch.arange(0, self.m * self.d + 1, self.d, dtype=torch.int32, device=self.cols.device)
            flat = self.cols.reshape(-1).to(torch.int32)
            self._csr = _csr_tensor(crow, flat, self.vals.reshape(-1).to(torch.float32), (self.m, self.n))
        return self._csr

    @property
    def csr_t(self) -> Tensor:
        """Qᵀ as a sparse CSR tensor (the CSC of Q)."""
        if self._csr_t is None:
            self._csr_t = _csr_tensor(self.col_ptr.to(torch.int32), self.col_rows, self.col_vals, (self.n, self.m))
        return self._csr_t

    def row_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(cols, vals), each (m, d): row i's non-zeros; unsigned column indices (CPU only), made once.

        >>> q = SparseQ(cols=torch.tensor([[0, 2], [1, 2]]), vals=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), n=3)
        >>> cols, vals = q.row_arrays()
        >>> cols.tolist(), cols.dtype.name, vals.tolist()
        ([[0, 2], [1, 2]], 'uint16', [[1.0, 2.0], [3.0, 4.0]])
        """
        if self._rows is None:
            index = np.uint16 if self.n <= 2**16 else np.uint32
            cols = np.ascontiguousarray(self.cols.cpu().numpy(), dtype=index)
            vals = np.ascontiguousarray(self.vals.cpu().to(torch.float32).numpy())
            self._rows = (cols, vals)
        return self._rows

    def csc_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(col_ptr, col_rows as uint32, col_vals): the CSC as the compiled kernels take it (CPU only), made once."""
        if self._csc is None:
            self._csc = (self.col_ptr.numpy(), self.col_rows.numpy().view(np.uint32), self.col_vals.numpy())
        return self._csc

    def compiled(self, backend: Backend = "auto") -> bool:
        """Whether products run on the compiled kernels: CPU tensors unless ``backend="torch"``."""
        if backend not in ("auto", "compiled", "torch"):
            raise ConfigError(f"Unknown Q backend {backend!r}; use 'auto', 'compiled' or 'torch'.")
        on_cpu = self.cols.device.type == "cpu"
        if backend == "compiled" and not on_cpu:
            raise ConfigError("The compiled Q kernels run on the CPU only; use backend='auto' on a GPU.")
        return on_cpu and backend != "torch"

    def row_degree(self) -> Tensor:
        """Number of distinct column indices of each row (exactly d by construction)."""
        return 1 + (self.cols[:, 1:] != self.cols[:, :-1]).sum(dim=1)

    def to_dense(self) -> Tensor:
        """Q as a dense m × n tensor (tests and tiny models only)."""
        dense = torch.zeros(self.m, self.n, device=self.vals.device)
        dense.scatter_add_(1, self.cols, self.vals.to(torch.float32))
        return dense

    def _check_length(self, x: Tensor, expected: int, what: str) -> Tensor:
        if x.numel() != expected:
            raise ValueError(f"Q is {self.m} x {self.n}, so {what} needs {expected} values, not {x.numel()}.")
        return x.detach().reshape(-1).to(torch.float32)

    def matvec(self, z: Tensor, *, backend: Backend = "auto") -> Tensor:
        """Q·z for a length-n vector (float32)."""
        z = self._check_length(z, self.n, "Q·z")
        if not self.compiled(backend):
            return torch.mv(self.csr, z)  # faster than a one-column ``@`` (measured)
        out = torch.empty(self.m)
        _kernels().row_matvec(*self.row_arrays(), z.contiguous().numpy(), out.numpy())
        return out

    def matmat(self, z: Tensor, *, backend: Backend = "auto") -> Tensor:
        """Q·z for a batch of B masks: ``z`` is (B, n), the result (B, m) (float32), row b = Q·z[b].

        >>> q = SparseQ(cols=torch.tensor([[0, 2], [1, 2]]), vals=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), n=3)
        >>> q.matmat(torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])).tolist()
        [[3.0, 4.0], [0.0, 3.0]]
        """
        if z.dim() != 2 or z.shape[1] != self.n:
            raise ValueError(
                f"Q is {self.m} x {self.n}, so a batch of masks must be (B, {self.n}), not {tuple(z.shape)}."
            )
        z = z.detach().to(torch.float32)
        if not self.compiled(backend):
            return (self.csr @ z.T).T.contiguous()
        out = torch.empty(self.m, z.shape[0])
        _kernels().row_matmat(*self.row_arrays(), z.T.contiguous().numpy(), out.numpy())
        return out.T.contiguous()

    def rmatvec(self, g: Tensor, *, backend: Backend = "auto") -> Tensor:
        """Qᵀ·g for a length-m vector (float32)."""
        g = self._check_length(g, self.m, "Qᵀ·g")
        if not self.compiled(backend):
            return (self.csr_t @ g.reshape(-1, 1)).reshape(-1)
        out = torch.empty(self.n)
        _kernels().row_rmatvec(*self.row_arrays(), g.contiguous().numpy(), out.numpy())
        return out

    def rmatmat(self, g: Tensor, *, backend: Backend = "auto") -> Tensor:
        """Qᵀ·g for a batch of B gradients: ``g`` is (B, m), the result (B, n) (float32), row b = Qᵀ·g[b].

        The backward of :meth:`matmat` (the straight-through gradients of B stacked clients). On the
        compiled kernels each row is :meth:`rmatvec`'s own product; elsewhere one sparse-dense product.

        >>> q = SparseQ(cols=torch.tensor([[0, 2], [1, 2]]), vals=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), n=3)
        >>> q.rmatmat(torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist()
        [[1.0, 0.0, 2.0], [0.0, 3.0, 4.0]]
        """
        if g.dim() != 2 or g.shape[1] != self.m:
            raise ValueError(
                f"Q is {self.m} x {self.n}, so a batch of gradients must be (B, {self.m}), not {tuple(g.shape)}."
            )
        g = g.detach().to(torch.float32)
        if not self.compiled(backend):
            return (self.csr_t @ g.T).T.contiguous()
        g = g.contiguous()
        out = torch.empty(g.shape[0], self.n)
        arrays = self.row_arrays()
        for b in range(g.shape[0]):
            _kernels().row_rmatvec(*arrays, g[b].numpy(), out[b].numpy())
        return out

    def free_rmatvec(self, g: Tensor, p: Tensor) -> tuple[Tensor, int]:
        """Qᵀ·g on the free columns (0 < p < 1), 0 elsewhere, and their number (compiled kernel; CPU only).

        >>> q = SparseQ(cols=torch.tensor([[0], [1], [1]]), vals=torch.tensor([[1.0], [2.0], [3.0]]), n=2)
        >>> out, free = q.free_rmatvec(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 0.5]))
        >>> out.tolist(), free
        ([0.0, 5.0], 1)
        """
        g = self._check_length(g, self.m, "Qᵀ·g")
        if p.shape != (self.n,) or p.dtype != torch.float32:
            raise ValueError(f"free_rmatvec needs the {self.n} probabilities as float32.")
        if not self.compiled("compiled"):
            raise ConfigError("free_rmatvec runs on the compiled CPU kernels; use masked products on a GPU.")
        return self._free_rmatvec_unchecked(g.contiguous(), p.contiguous())

    def _free_rmatvec_unchecked(self, g: Tensor, p: Tensor) -> tuple[Tensor, int]:
        """:meth:`free_rmatvec` for contiguous float32 CPU tensors of the right lengths."""
        out = torch.empty(self.n)
        return out, int(_kernels().free_rmatvec(*self.csc_arrays(), p.numpy(), g.numpy(), out.numpy()))

    def column_block(self, columns: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(ptr, rows, vals) of the CSR of Qᵀ restricted to ``columns`` (int64, sorted or not)."""
        counts = self.col_ptr[columns + 1] - self.col_ptr[columns]
        ptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=counts.device), counts.cumsum(0)])
        total = int(ptr[-1])
        offsets = torch.arange(total, device=counts.device) - torch.repeat_interleave(ptr[:-1], counts)
        positions = torch.repeat_interleave(self.col_ptr[columns], counts) + offsets
        return ptr, self.col_rows[positions], self.col_vals[positions]

    def add_columns_(self, w: Tensor, columns: Tensor, coef: Tensor, *, backend: Backend = "auto") -> None:
        """w ← w + Σ_t coef[t]·Q[:, columns[t]] in place (the incremental update for changed z).

        >>> q = SparseQ(cols=torch.tensor([[0], [0], [1]]), vals=torch.tensor([[1.0], [2.0], [3.0]]), n=2)
        >>> w = torch.zeros(3)
        >>> q.add_columns_(w, torch.tensor([0, 1]), torch.tensor([1.0, -1.0]))  # z: (0, 1) → (1, 0)
        >>> w.tolist()
        [1.0, 2.0, -3.0]
        """
        if not columns.numel():
            return
        self._check_length(w, self.m, "w")
        if columns.shape != coef.shape or int(columns.min()) < 0 or int(columns.max()) >= self.n:
            raise ValueError(f"add_columns_ needs one coefficient per column index in [0, {self.n}).")
        self._add_columns_unchecked(w, columns, coef, backend=backend)

    def _add_changed_columns_unchecked(self, w: Tensor, z: Tensor, z_old: Tensor, *, max_changed: int) -> int:
        """w ← w + Q·(z − z_old) and z_old ← z in place, if they differ in at most ``max_changed`` coordinates.

        Returns how many differ; when more than ``max_changed`` do, nothing is written. One
        compiled pass, the same sums as :meth:`add_columns_` over the changed columns in
        ascending order. The kernel checks no bounds: the caller passes contiguous float32 CPU
        tensors, z and z_old of length n and w of length m.

        >>> q = SparseQ(cols=torch.tensor([[0], [0], [1]]), vals=torch.tensor([[1.0], [2.0], [3.0]]), n=2)
        >>> w, z, z_old = torch.zeros(3), torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
        >>> q._add_changed_columns_unchecked(w, z, z_old, max_changed=2), w.tolist(), z_old.tolist()
        (2, [1.0, 2.0, -3.0], [1.0, 0.0])
        """
        return int(
            _kernels().add_changed_columns(*self.csc_arrays(), z.numpy(), z_old.numpy(), w.numpy(), int(max_changed))
        )

    def _add_drawn_columns_unchecked(self, w: Tensor, p: Tensor, u: Tensor, z_old: Tensor, *, max_changed: int) -> int:
        """u ← z = (u < p), then :meth:`_add_changed_columns_unchecked` with z; −1 if some p is outside [0, 1].

        For uniforms u from ``torch.rand`` z is the mask ``torch.bernoulli(p)`` draws from the
        same uniforms. Unchecked as :meth:`_add_changed_columns_unchecked` is; p and u are
        contiguous float32 CPU tensors of length n as well.

        >>> q = SparseQ(cols=torch.tensor([[0], [0], [1]]), vals=torch.tensor([[1.0], [2.0], [3.0]]), n=2)
        >>> w, p, u = torch.zeros(3), torch.tensor([0.9, 0.0]), torch.tensor([0.5, 0.5])
        >>> q._add_drawn_columns_unchecked(w, p, u, torch.tensor([0.0, 1.0]), max_changed=2), w.tolist(), u.tolist()
        (2, [1.0, 2.0, -3.0], [1.0, 0.0])
        """
        return int(
            _kernels().add_drawn_columns(
                *self.csc_arrays(), p.numpy(), u.numpy(), z_old.numpy(), w.numpy(), int(max_changed)
            )
        )

    def _add_columns_unchecked(self, w: Tensor, columns: Tensor, coef: Tensor, *, backend: Backend) -> None:
        """:meth:`add_columns_` for arguments known to be valid (indices from ``nonzero`` of a length-n vector)."""
        if self.compiled(backend) and w.dtype == torch.float32 and w.is_contiguous():
            _kernels().add_columns(
                *self.csc_arrays(), columns.to(torch.int64).numpy(), coef.to(torch.float32).numpy(), w.numpy()
            )
            return
        rows, vals = self.padded_columns()
        w.index_add_(
            0,
            rows.index_select(0, columns).view(-1),
            (vals.index_select(0, columns) * coef.to(vals.dtype).unsqueeze(1)).view(-1),
        )

    def padded_columns(self) -> tuple[Tensor, Tensor]:
        """Column-major table of Q: (rows, vals), each (n, L), L the largest column count.

        Row j lists column j's row indices (int32) and values; the unused slots hold row 0
        with value 0.0, so scattering whole padded columns adds exactly 0.0 there. Built once,
        on first use; its size is n·L, about 1.2·m·d at m/n = 32, d = 10 (L = 389 vs a mean
        column count of 320).

        >>> q = SparseQ(cols=torch.tensor([[0], [0], [1]]), vals=torch.tensor([[1.0], [2.0], [3.0]]), n=2)
        >>> rows, vals = q.padded_columns()
        >>> rows.tolist(), vals.tolist()
        ([[0, 1], [2, 0]], [[1.0, 2.0], [3.0, 0.0]])
        """
        if self._padded is None:
            device = self.col_rows.device
            counts = self.col_ptr[1:] - self.col_ptr[:-1]
            width = max(1, int(counts.max())) if self.n else 1
            column = torch.repeat_interleave(torch.arange(self.n, device=device), counts)
            start = torch.repeat_interleave(self.col_ptr[:-1], counts)
            slot = torch.arange(self.col_rows.numel(), device=device) - start
            rows = torch.zeros((self.n, width), dtype=torch.int32, device=device)
            vals = torch.zeros((self.n, width), dtype=torch.float32, device=device)
            rows[column, slot] = self.col_rows
            vals[column, slot] = self.col_vals
            self._padded = (rows, vals)
        return self._padded

    def free_block(self, columns: Tensor) -> Tensor:
        """CSR of Qᵀ restricted to ``columns``, over whole padded columns: shape (len(columns), m + 1).

        ``torch.mv(block, g_ext)`` with g_ext = (g, 0) gives Qᵀ[columns]·g: the padding slots
        point to the extra row m (value 0), so they read the appended 0 whatever g holds.
        Built with two contiguous row gathers, so rebuilding it is cheap.
        """
        rows, vals = self.padded_columns()
        k, width = int(columns.numel()), rows.shape[1]
        counts = self.col_ptr[columns + 1] - self.col_ptr[columns]
        padding = torch.arange(width, device=rows.device) >= counts.unsqueeze(1)
        block_rows = rows.index_select(0, columns).masked_fill_(padding, self.m)
        crow = torch.arange(0, k * width + 1, width, dtype=torch.int32, device=rows.device)
        return _csr_tensor(crow, block_rows.view(-1), vals.index_select(0, columns).view(-1), (k, self.m + 1))

    def to(self, device: torch.device | str) -> SparseQ:
        """A copy on ``device``."""
        return SparseQ(cols=self.cols.to(device), vals=self.vals.to(device), n=self.n)


def _kernels() -> ModuleType:
    """The compiled kernels, imported on first use (numba's import and compilation are not free)."""
    from fedlightning.models import zampling_kernels

    return zampling_kernels


def bernoulli_draw(p: Tensor, generator: torch.Generator) -> Tensor:
    """z ~ Bernoulli(p) drawn on the generator's device and returned on p's.

    The streams of :meth:`fedlightning.federated.module.FederatedModule.generator` are CPU
    generators, so the masks are the same whichever device trains.

    >>> bernoulli_draw(torch.tensor([0.0, 1.0]), torch.Generator().manual_seed(0)).tolist()
    [0.0, 1.0]
    """
    return torch.bernoulli(p.detach().to(generator.device), generator=generator).to(p.device)


def zampling_q(fan_in: Tensor, *, n: int, d: int, seed: int) -> SparseQ:
    """The paper's Q: d distinct random columns per row, values N(0, 6/(d·fan_in)), from ``seed``.

    Args:
        fan_in: length-m fan-in of each row's neuron (see :func:`row_fan_in`).
        n: number of trainable parameters (columns).
        d: non-zeros per row; must satisfy 1 ≤ d ≤ n.
        seed: the shared seed; the same seed gives the same Q bit for bit.
    """
    if n < 1:
        raise ConfigError(f"method.n must be at least 1 (got {n}); lower method.compression.")
    gen = torch.Generator().manual_seed(int(seed))
    cols = draw_distinct_columns(int(fan_in.numel()), n, d, gen)
    vals = torch.randn(cols.shape, generator=gen) * zampling_std(fan_in, d).unsqueeze(1)
    return SparseQ(cols=cols, vals=vals, n=n)


def diagonal_q(values: Tensor) -> SparseQ:
    """Q = diag(values): d = 1, n = m, each weight masked by its own bit (supermask, FedPM)."""
    m = values.numel()
    cols = torch.arange(m, device=values.device).unsqueeze(1)
    return SparseQ(cols=cols, vals=values.reshape(m, 1).to(torch.float32), n=m)


# ---------------------------------------------------------------------------------- Q·z
class _QProduct(torch.autograd.Function):
    """w = Q·z with the value precomputed; backward gives Qᵀ·g on the free columns only.

    ``w`` is a fresh tensor from :meth:`ZampledWeights.weights_for` that is never modified
    afterwards, so it is returned as a view instead of a copy.

    Straight-through: the gradient with respect to the sample z is handed to the
    probability input ``p`` (dL/dp := dL/dz), optionally multiplied by p (FedPM's estimator),
    and zero on frozen columns.
    """

    @staticmethod
    def forward(ctx, p: Tensor, w: Tensor, weights: ZampledWeights) -> Tensor:  # type: ignore[override]
        ctx.weights = weights
        ctx.save_for_backward(p)
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad_w: Tensor) -> tuple[Tensor | None, None, None]:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        return ctx.weights.straight_through(grad_w, p), None, None


def q_product(p: Tensor, z: Tensor, q: SparseQ) -> Tensor:
    """w = Q·z with the straight-through gradient ∂L/∂p = Qᵀ·∂L/∂w (no masking, no cache).

    >>> q = SparseQ(cols=torch.tensor([[0], [1]]), vals=torch.tensor([[2.0], [3.0]]), n=2)
    >>> p = torch.tensor([0.5, 0.5], requires_grad=True)
    >>> q_product(p, torch.tensor([1.0, 0.0]), q).sum().backward()
    >>> p.grad.tolist()
    [2.0, 3.0]
    """
    weights = ZampledWeights(q, mask_frozen=False)
    return weights(p, z)


class ZampledWeights:
    """w = Q·z for a stream of masks, with incremental updates and a masked backward.

    Keeps the last mask and its w; a new mask that differs in at most
    ``incremental_fraction``·n coordinates is applied as w ← w + Q·(z_new − z_old) over the
    changed columns only (:meth:`SparseQ.add_columns_`), otherwise w is recomputed in full
    (also every ``refresh_every`` incremental steps, bounding float drift). With
    per-mini-batch resampling a free coordinate flips with probability 2p(1 − p), so about
    n/3 bits flip at p ~ U(0,1) (the full product is faster there) and far fewer once most p
    sit at 0 or 1.

    With ``mask_frozen`` the backward computes Qᵀ·g only on columns with 0 < p < 1 (the
    paper's gradient mask): when fewer than ``dense_backward_fraction``·n are free, on the
    compiled kernels by one gather over the free columns of Q's CSC
    (:meth:`SparseQ.free_rmatvec`, nothing cached), and with ``torch`` over a cached CSR block
    of the free columns (:meth:`SparseQ.free_block`), rebuilt when a column outside it became
    free or the free set shrank by ``rebuild_fraction``; otherwise by the full product, then
    masked. (``benchmarks/zampling_speed.py --kernels`` times both formulations.)

    ``fast=False`` disables both shortcuts and uses ``torch.mv`` on CSR for the full products
    every step (full Qᵀ·g, then masked): an independent reference path for the tests.

    Args:
        q: the matrix.
        mask_frozen: zero the gradient where p is exactly 0 or 1 (Zampling's rule).
        scale_by_p: multiply the gradient by p (FedPM's estimator).
        fast: use the incremental forward and the free-column backward.
        backend: ``"auto"`` (compiled kernels on the CPU, ``torch.mv`` elsewhere), ``"compiled"``
            or ``"torch"``; the reference path (``fast=False``) always uses ``"torch"``.
        incremental_fraction: largest share of changed coordinates updated incrementally;
            ``None``: 0.3 with the compiled kernels, 0.15 with ``torch`` (where the incremental
            update stops being cheaper than the full product).
        refresh_every: full recomputation after this many incremental updates.
        rebuild_fraction: rebuild the free-column block (``torch`` backend) when the free set shrank by this share.
        dense_backward_fraction: use the full Qᵀ·g when at least this share of columns is free;
            ``None``: 0.45 with the compiled kernels, 0.9 with ``torch.mv``.
    """

    def __init__(
        self,
        q: SparseQ,
        *,
        mask_frozen: bool = True,
        scale_by_p: bool = False,
        fast: bool = True,
        backend: Backend = "auto",
        incremental_fraction: float | None = None,
        refresh_every: int = 256,
        rebuild_fraction: float = 0.1,
        dense_backward_fraction: float | None = None,
    ) -> None:
        self.q = q
        self.mask_frozen = mask_frozen
        self.scale_by_p = scale_by_p
        self.fast = fast
        self.backend: Backend = backend if fast else "torch"
        compiled = self._compiled = q.compiled(self.backend)
        if incremental_fraction is None:
            incremental_fraction = 0.3 if compiled else 0.15
        self.incremental_fraction = incremental_fraction if fast else -1.0
        self.refresh_every = refresh_every
        self.rebuild_fraction = rebuild_fraction
        if dense_backward_fraction is None:
            dense_backward_fraction = 0.45 if compiled else 0.9
        self.dense_backward_fraction = dense_backward_fraction if fast else 0.0
        self.reset()

    def reset(self) -> None:
        """Forget the cached mask (call when Q's input changes discontinuously)."""
        self._z: Tensor | None = None
        self._w: Tensor | None = None
        self._since_refresh = 0
        self._p: Tensor | None = None
        self._free: Tensor | None = None
        self._free_before = self.q.n  # free columns at the last compiled masked backward
        self._block: tuple[Tensor, Tensor, Tensor] | None = None  # (columns, membership, CSR block)
        self.stats = {"full": 0, "incremental": 0, "flipped": 0, "block_builds": 0, "free_gathers": 0}

    def weights_for(self, z: Tensor, *, in_place: bool = False) -> Tensor:
        """Q·z, reusing the previous product when few coordinates changed (no autograd).

        By default every call returns a new tensor (the incremental path copies the cached w
        and updates the copy), so a w still referenced by an autograd graph is never modified
        in place. With ``in_place`` the incremental path updates the cached w itself and
        returns it: valid until the next call (a step that keeps no graph of w).
        """
        z = z.detach().to(torch.float32)
        previous = self._z
        if self.fast and previous is not None and self._w is not None and self._since_refresh < self.refresh_every:
            if self._compiled and z.shape == previous.shape and z.is_contiguous() and self._w.is_contiguous():
                w = self._w if in_place else self._w.clone()
                limit = self._max_changed()
                flipped = self.q._add_changed_columns_unchecked(w, z, previous, max_changed=limit)  # previous ← z
                if flipped <= limit:
                    return self._updated(w, flipped)
                return self._full_product(z)
            changed = torch.nonzero(z != previous).squeeze(1)
            if changed.numel() <= self.incremental_fraction * self.q.n:
                w = self._w if in_place else self._w.clone()
                if changed.numel():
                    self.q._add_columns_unchecked(
                        w, changed, (z - previous).index_select(0, changed), backend=self.backend
                    )
                self._z = z.clone()
                return self._updated(w, int(changed.numel()))
        return self._full_product(z)

    def draw_weights(self, p: Tensor, generator: torch.Generator) -> Tensor:
        """Q·z for a fresh mask z ~ Bernoulli(p), as :meth:`weights_for` (``in_place``) gives it for that mask.

        The mask is the one :func:`bernoulli_draw` draws (``torch.bernoulli``), bit for bit. On
        the compiled incremental path it is made inside the update's kernel from
        ``torch.rand``'s uniforms (z = u < p, the comparison ``torch.bernoulli`` makes), which
        spares the draw's own pass (its cost grows with the share of p strictly inside (0, 1)).

        Raises:
            ValueError: some p is NaN or outside [0, 1] (a diverged score).
        """
        previous, w = self._z, self._w
        if not (
            self._compiled
            and self.fast
            and previous is not None
            and w is not None
            and self._since_refresh < self.refresh_every
            and generator.device.type == "cpu"
            and p.dtype == torch.float32
            and p.device.type == "cpu"
            and p.shape == previous.shape
            and p.is_contiguous()
        ):
            return self.weights_for(bernoulli_draw(p, generator), in_place=True)
        u = torch.rand(p.shape, generator=generator)
        limit = self._max_changed()
        flipped = self.q._add_drawn_columns_unchecked(w, p.detach(), u, previous, max_changed=limit)  # u ← z
        if flipped < 0:
            raise ValueError(
                "A mask probability p is NaN or outside [0, 1], so the scores diverged; "
                "lower method.client_optimizer.lr."
            )
        if flipped <= limit:
            return self._updated(w, flipped)
        return self._full_product(u)

    def _max_changed(self) -> int:
        """The most changed coordinates the incremental update takes (``incremental_fraction``·n)."""
        return int(self.incremental_fraction * self.q.n)

    def _updated(self, w: Tensor, flipped: int) -> Tensor:
        """Record an incremental update of w over ``flipped`` changed coordinates; returns w."""
        self._w = w
        self._since_refresh += 1
        self.stats["incremental"] += 1
        self.stats["flipped"] += flipped
        return w

    def _full_product(self, z: Tensor) -> Tensor:
        self._w = self.q.matvec(z, backend=self.backend)
        self._z = z.clone()
        self._since_refresh = 0
        self.stats["full"] += 1
        return self._w

    def set_free(self, p: Tensor) -> None:
        """Record p, whose free columns (0 < p < 1) the next backward passes keep."""
        self._p = p.detach() if self.mask_frozen else None
        self._free = None

    def _free_mask(self) -> Tensor:
        """0 < p < 1 for the p of :meth:`set_free` (made once per p)."""
        if self._free is None:
            assert self._p is not None
            self._free = (self._p > 0) & (self._p < 1)
        return self._free

    def masked_rmatvec(self, g: Tensor) -> Tensor:
        """Qᵀ·g, zero on frozen columns, computed only over (a superset of) the free ones."""
        if self._p is None:
            return self.q.rmatvec(g, backend=self.backend)
        dense_from = self.dense_backward_fraction * self.q.n
        p = self._p
        flat_float32 = g.dtype == p.dtype == torch.float32 and g.is_contiguous() and p.is_contiguous()
        if self._compiled and flat_float32 and g.numel() == self.q.m:
            return self._free_gather(g.view(-1), p, dense_from)
        free = self._free_mask()
        num_free = int(free.sum())
        if num_free >= dense_from:
            return self.q.rmatvec(g, backend=self.backend) * free.to(g.dtype)
        block = self._block
        if (
            block is None
            or num_free < (1.0 - self.rebuild_fraction) * block[0].numel()
            or bool((free & ~block[1]).any())
        ):
            columns = torch.nonzero(free).squeeze(1)
            block = self._block = (columns, free.clone(), self.q.free_block(columns))
            self.stats["block_builds"] += 1
        columns, _, csr = block
        out = torch.zeros(self.q.n, dtype=g.dtype, device=g.device)
        if columns.numel():
            out[columns] = torch.mv(csr, torch.cat([g.reshape(-1), g.new_zeros(1)]))
        return out if num_free == columns.numel() else out * free.to(g.dtype)

    def _free_gather(self, g: Tensor, p: Tensor, dense_from: float) -> Tensor:
        """The compiled free-column gather where fewer than ``dense_from`` columns are free, else Qᵀ·g masked.

        The gather counts the free columns as it runs. After a step with too many of them for
        it they are counted first (the free set changes slowly), so which product is taken
        depends on this step's count alone.
        """
        if self._free_before < dense_from:
            out, self._free_before = self.q._free_rmatvec_unchecked(g, p)
            if self._free_before < dense_from:
                self.stats["free_gathers"] += 1
                return out
        free = self._free_mask()
        self._free_before = int(free.sum())
        if self._free_before < dense_from:
            self.stats["free_gathers"] += 1
            return self.q._free_rmatvec_unchecked(g, p)[0]
        return self.q.rmatvec(g, backend=self.backend) * free.to(g.dtype)

    def straight_through(self, grad_w: Tensor, p: Tensor) -> Tensor:
        """∂L/∂p from ∂L/∂w: Qᵀ·∂L/∂w (masked where p ∈ {0, 1}), times p for FedPM's estimator."""
        grad = self.masked_rmatvec(grad_w.contiguous())
        return grad * p if self.scale_by_p else grad

    def __call__(self, p: Tensor, z: Tensor) -> Tensor:
        """w = Q·z whose gradient flows to ``p`` (straight-through, masked where p ∈ {0, 1})."""
        self.set_free(p.detach())
        w = self.weights_for(z)
        return _QProduct.apply(p, w, self)


# ---------------------------------------------------------------------------------- network
class ZampledNetwork:
    """Runs an ``nn.Module`` with its parameters replaced by slices of a flat weight vector.

    The module's own parameters are untouched; ``forward(x, w)`` calls it functionally.

    Args:
        model: the architecture (its parameter order defines the rows of Q).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names = [name for name, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]
        self.m = sum(self.sizes)
        starts = np.cumsum([0, *self.sizes[:-1]]).tolist()
        self._places = {id(p): (start, p.shape) for start, p in zip(starts, model.parameters(), strict=True)}

    def view_of(self, w: Tensor, parameter: Tensor) -> Tensor:
        """The slice of ``w`` (or of a gradient laid out like it) that stands for one of the model's parameters.

        >>> from fedlightning.models.mlp import MLP
        >>> net = ZampledNetwork(MLP(in_features=2, hidden=[], num_classes=2))
        >>> net.view_of(torch.arange(6.0), net.model.net[1].bias).tolist()
        [4.0, 5.0]
        """
        start, shape = self._places[id(parameter)]
        return w[start : start + shape.numel()].view(shape)

    def views(self, w: Tensor) -> dict[str, Tensor]:
        """Name → view of ``w`` shaped like that parameter."""
        if w.numel() != self.m:
            raise ValueError(f"A weight vector of {w.numel()} values cannot fill a model with {self.m} parameters.")
        return {
            name: chunk.view(shape)
            for name, chunk, shape in zip(self.names, w.split(self.sizes), self.shapes, strict=True)
        }

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        """The model's output on ``x`` with weights ``w``."""
        return functional_call(self.model, self.views(w), (x,))

    def forward_many(self, x: Tensor, w: Tensor) -> Tensor:
        """The outputs of B networks on the same ``x``: ``w`` is (B, m), the result (B, *output).

        One ``vmap`` over the functional call, so each layer runs as one batched product over the
        B weight sets (an ``nn.Linear`` becomes a ``bmm``) instead of B separate calls.
        """
        if w.dim() != 2 or w.shape[1] != self.m:
            raise ValueError(f"forward_many needs weights of shape (B, {self.m}), not {tuple(w.shape)}.")
        return torch.func.vmap(lambda row: self.forward(x, row))(w)

    def parameters_iter(self) -> Iterator[Tensor]:
        """The wrapped module's parameters (not used by the functional forward)."""
        return iter(self.model.parameters())
