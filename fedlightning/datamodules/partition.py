"""Partitioners: split a data set's sample indices across federated clients.

Every partitioner has one signature::

    xxx_partition(labels, num_clients, *, seed, min_partition_size=1, **params) -> ClientPartition

``labels`` is the class label of every sample (only its length matters to the label-blind
``iid`` and ``quantity_skew`` splits), ``seed`` an ``int`` (or a ``numpy.random.Generator``
to continue) and ``params`` the partitioner's own hyperparameters (``alpha``,
``shards_per_client``, ``groups``). Each returns one sorted ``int64`` index array per client,
packed in a :class:`ClientPartition` (a sequence of views into one flat array, so 100,000
clients cost no object per client);
together they hold every index ``0..N-1`` exactly once, and every client holds at least
``min_partition_size`` samples: a random split is drawn again (at most ``MAX_DRAWS`` times)
while some client is smaller, and a split that cannot reach the minimum raises a
``ValueError`` naming the keys to change. With ``min_partition_size=1`` (the default) the
first draw always succeeds. All of them are vectorised, so 10,000 clients over 100,000
samples take well under a second.

The frozen dataclasses below wrap the functions for Hydra (``_target_``), e.g.
``partition: {_target_: fedlightning.datamodules.DirichletPartition, alpha: 0.1}``; they are
called like the functions, ``DirichletPartition(alpha=0.1)(labels, 10, seed=0)``.
:func:`fedlightning.plotting.plot_label_distribution` draws the per-client label histogram of any split.

Example:
    >>> parts = iid_partition(np.zeros(10), 3, seed=0)
    >>> [len(p) for p in parts]
    [4, 3, 3]
    >>> np.sort(np.concatenate(parts)).tolist() == list(range(10))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MAX_DRAWS",
    "ClientPartition",
    "DirichletPartition",
    "FilePartition",
    "IIDPartition",
    "NaturalPartition",
    "QuantitySkewPartition",
    "Seed",
    "ShardPartition",
    "dirichlet_partition",
    "grouped_holdout",
    "iid_partition",
    "natural_partition",
    "partition_summary",
    "quantity_skew_partition",
    "shard_partition",
]

#: A partitioner's randomness: an integer seed, or a generator whose stream is continued.
Seed = int | np.random.Generator

#: Most random splits drawn while a client is below ``min_partition_size``.
MAX_DRAWS = 100


def _rng(seed: Seed) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer | np.random.Generator):
        raise ValueError(f"A partitioner's seed must be an integer or a numpy Generator (got {seed!r}).")
    return np.random.default_rng(seed)


def _labels(labels: ArrayLike) -> np.ndarray:
    return np.asarray(labels).reshape(-1)


def _check_min_size(min_partition_size: int) -> None:
    if isinstance(min_partition_size, bool) or int(min_partition_size) != min_partition_size or min_partition_size < 1:
        raise ValueError(
            f"partition.min_partition_size must be an integer >= 1 (got {min_partition_size!r}); "
            "use e.g. partition.min_partition_size=1"
        )


def _check_counts(num_samples: int, num_clients: int, min_partition_size: int = 1) -> None:
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"data.num_clients must be an integer >= 1 (got {num_clients!r}).")
    _check_min_size(min_partition_size)
    if num_samples < num_clients:
        raise ValueError(
            f"Cannot give each of data.num_clients={num_clients} clients at least one sample: "
            f"only {num_samples} training samples; lower data.num_clients."
        )
    if num_samples < num_clients * min_partition_size:
        raise ValueError(
            f"partition.min_partition_size={min_partition_size} with data.num_clients={num_clients} needs "
            f"{num_clients * min_partition_size} training samples but there are only {num_samples}; "
            "lower partition.min_partition_size or data.num_clients."
        )


def _check_alpha(alpha: float) -> None:
    if not alpha > 0 or not np.isfinite(alpha):
        raise ValueError(f"partition.alpha must be > 0 (got {alpha}); use e.g. partition.alpha=0.5")


def _check_shards(shards_per_client: int) -> None:
    if isinstance(shards_per_client, bool) or int(shards_per_client) != shards_per_client:
        raise ValueError(
            f"partition.shards_per_client must be an integer (got {shards_per_client!r}); "
            "use e.g. partition.shards_per_client=2"
        )
    if shards_per_client < 1:
        raise ValueError(
            f"partition.shards_per_client must be >= 1 (got {shards_per_client}); "
            "use e.g. partition.shards_per_client=2"
        )


class ClientPartition(Sequence[np.ndarray]):
    """Per-client index arrays stored as one flat array and offsets (no object per client).

    ``parts[k]`` is a read-only view ``indices[offsets[k]:offsets[k + 1]]``, so a federation of
    100,000 clients costs two ``int64`` arrays, not 100,000 array objects. It behaves as the
    ``list[np.ndarray]`` every partitioner returns (``len``, indexing, iteration).

    Example:
        >>> parts = ClientPartition.from_parts([np.array([0, 2]), np.array([1])])
        >>> len(parts), parts[0].tolist(), parts.sizes.tolist()
        (2, [0, 2], [2, 1])
    """

    __slots__ = ("indices", "offsets")

    def __init__(self, *, indices: np.ndarray, offsets: np.ndarray) -> None:
        indices = np.asarray(indices, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != indices.size:
            raise ValueError("ClientPartition offsets must start at 0 and end at the number of indices.")
        if (np.diff(offsets) < 0).any():
            raise ValueError("ClientPartition offsets must be non-decreasing.")
        indices.setflags(write=False)
        offsets.setflags(write=False)
        self.indices = indices
        self.offsets = offsets

    @classmethod
    def from_parts(cls, parts: Sequence[ArrayLike]) -> ClientPartition:
        """Pack per-client index arrays (any sequence of array-likes; itself if already packed)."""
        if isinstance(parts, ClientPartition):
            return parts
        arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate(arrays) if arrays else np.empty(0, np.int64)
        return cls(indices=flat, offsets=np.concatenate([[0], np.cumsum(sizes)]))

    @property
    def sizes(self) -> np.ndarray:
        """Samples per client, ``int64`` of shape ``(K,)``."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, k):  # type: ignore[no-untyped-def, override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = int(k)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"client {k} is out of range [0, {len(self)}).")
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for k in range(len(self)):
            yield self.indices[self.offsets[k] : self.offsets[k + 1]]

    def __repr__(self) -> str:
        return f"ClientPartition({len(self)} clients, {self.indices.size} samples)"


def _group(assignment: np.ndarray, num_clients: int) -> ClientPartition:
    """Turn a client id per sample into sorted per-client index arrays (packed)."""
    # A stable argsort of the client ids keeps the indices ascending inside each client.
    order = np.argsort(assignment, kind="stable").astype(np.int64, copy=False)
    sizes = np.bincount(assignment, minlength=num_clients)
    return ClientPartition(indices=order, offsets=np.concatenate([[0], np.cumsum(sizes)]))


def _draw_until_large_enough(
    draw: Callable[[np.random.Generator], np.ndarray],
    rng: np.random.Generator,
    num_clients: int,
    min_partition_size: int,
    fix: str,
) -> np.ndarray:
    """Call ``draw(rng)`` (a client id per sample) until every client has ``min_partition_size``."""
    smallest = 0
    for _ in range(MAX_DRAWS):
        assignment = draw(rng)
        smallest = int(np.bincount(assignment, minlength=num_clients).min())
        if smallest >= min_partition_size:
            return assignment
    raise ValueError(
        f"After {MAX_DRAWS} random splits the smallest client still had {smallest} samples, fewer than "
        f"partition.min_partition_size={min_partition_size}; lower partition.min_partition_size, {fix}."
    )


def _dirichlet(rng: np.random.Generator, alpha: float, k: int, size: int | None = None) -> np.ndarray:
    """Dirichlet draws that stay finite for tiny ``alpha`` (rows sum to 1)."""
    p = np.nan_to_num(rng.dirichlet(np.full(k, alpha), size=size), nan=0.0)
    p = np.atleast_2d(p)
    dead = p.sum(axis=1) <= 0
    if dead.any():  # underflow: all mass on one random client, the limit as alpha -> 0
        p[dead] = 0.0
        p[dead, rng.integers(k, size=int(dead.sum()))] = 1.0
    p /= p.sum(axis=1, keepdims=True)
    return p if size is not None else p[0]


def iid_partition(labels: ArrayLike, num_clients: int, *, seed: Seed, min_partition_size: int = 1) -> ClientPartition:
    """Shuffle the samples and deal them into equal shares.

    Args:
        labels: One entry per sample (only the count ``N`` is used).
        num_clients: Number of clients ``K``.
        seed: Seed or generator of the shuffle.
        min_partition_size: Fewest samples per client; the shares are ``floor(N/K)`` or
            ``ceil(N/K)``, so this only refuses a ``K`` too large for ``N``.

    Returns:
        ``K`` sorted ``int64`` index arrays whose sizes differ by at most one.

    Raises:
        ValueError: If ``N < K * min_partition_size``.
    """
    num_samples = _labels(labels).size
    _check_counts(num_samples, num_clients, min_partition_size)
    rng = _rng(seed)
    sizes = np.full(num_clients, num_samples // num_clients)
    sizes[: num_samples % num_clients] += 1
    assignment = np.empty(num_samples, dtype=np.int64)
    assignment[rng.permutation(num_samples)] = np.repeat(np.arange(num_clients), sizes)
    return _group(assignment, num_clients)


def dirichlet_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    seed: Seed,
    min_partition_size: int = 1,
    alpha: float = 0.5,
) -> ClientPartition:
    """Label skew: each class is spread over the clients by a Dirichlet draw.

    For every class ``c`` we draw ``q_c ~ Dir(alpha * 1_K)`` and cut the class's shuffled
    indices at the cumulative proportions ``floor(cumsum(q_c) * n_c)``. Small ``alpha``
    gives each client few classes; large ``alpha`` tends to IID (Hsu et al., 2019,
    arXiv:1909.06335). Clients left empty are then repaired, one at a time, by moving one
    random sample from whichever client is currently the largest, so sizes and histograms
    change by at most one sample per empty client. A split whose smallest client is still
    below ``min_partition_size`` is drawn again from the continued stream.

    Args:
        labels: Integer class label per sample, shape ``(N,)``.
        num_clients: Number of clients ``K``.
        seed: Seed or generator of the draws.
        min_partition_size: Fewest samples per client (redraws at most ``MAX_DRAWS`` times).
        alpha: Dirichlet concentration, ``> 0``.

    Returns:
        ``K`` sorted ``int64`` index arrays of at least ``min_partition_size`` samples.

    Raises:
        ValueError: If ``alpha <= 0``, ``N < K * min_partition_size``, or no draw reaches
            ``min_partition_size``.
    """
    _check_alpha(alpha)
    labels = _labels(labels)
    n = labels.size
    _check_counts(n, num_clients, min_partition_size)
    rng = _rng(seed)
    classes, inverse = np.unique(labels, return_inverse=True)
    class_sizes = np.bincount(inverse, minlength=classes.size)

    def draw(rng: np.random.Generator) -> np.ndarray:
        # Samples grouped by class, in random order inside each class.
        perm = rng.permutation(n)
        by_class = perm[np.argsort(inverse[perm], kind="stable")]
        q = _dirichlet(rng, alpha, num_clients, size=classes.size)  # C x K
        cuts = np.floor(np.cumsum(q, axis=1) * class_sizes[:, None]).astype(np.int64)
        cuts[:, -1] = class_sizes  # guard against rounding below n_c
        counts = np.diff(cuts, axis=1, prepend=0)  # C x K, samples of class c on client k
        assignment = np.empty(n, dtype=np.int64)
        assignment[by_class] = np.repeat(np.tile(np.arange(num_clients), classes.size), counts.ravel())
        _repair_empty(assignment, num_clients, rng)
        return assignment

    fix = "raise partition.alpha or lower data.num_clients"
    return _group(_draw_until_large_enough(draw, rng, num_clients, min_partition_size, fix), num_clients)


def _repair_empty(assignment: np.ndarray, num_clients: int, rng: np.random.Generator) -> None:
    """Give each empty client one random sample of the currently largest client (in place)."""
    sizes = np.bincount(assignment, minlength=num_clients)
    empty = np.flatnonzero(sizes == 0)
    if empty.size == 0:
        return
    # Members of each client in random order; a donor gives away its last remaining one.
    perm = rng.permutation(assignment.size)
    order = perm[np.argsort(assignment[perm], kind="stable")]
    ends = np.cumsum(sizes)
    for k in empty:
        donor = int(np.argmax(sizes))
        sizes[donor] -= 1
        sizes[k] = 1
        ends[donor] -= 1
        assignment[order[ends[donor]]] = k


def shard_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    seed: Seed,
    min_partition_size: int = 1,
    shards_per_client: int = 2,
) -> ClientPartition:
    """Pathological non-IID split of FedAvg (McMahan et al., 2017, arXiv:1602.05629).

    The samples are sorted by label, cut into ``num_clients * shards_per_client``
    contiguous shards of (nearly) equal size, and the shards are dealt to clients at
    random, ``shards_per_client`` each (dealt again while a client is below
    ``min_partition_size``, which only the one-sample-smaller shards can cause).

    Args:
        labels: Integer class label per sample, shape ``(N,)``.
        num_clients: Number of clients ``K``.
        seed: Seed or generator of the deal.
        min_partition_size: Fewest samples per client.
        shards_per_client: Shards per client, ``>= 1``.

    Returns:
        ``K`` sorted ``int64`` index arrays of at least ``min_partition_size`` samples.

    Raises:
        ValueError: If ``shards_per_client < 1``, there are fewer samples than shards, or
            no deal reaches ``min_partition_size``.
    """
    _check_shards(shards_per_client)
    shards_per_client = int(shards_per_client)
    labels = _labels(labels)
    n = labels.size
    _check_counts(n, num_clients, min_partition_size)
    num_shards = num_clients * shards_per_client
    if n < num_shards:
        raise ValueError(
            f"partition.shards_per_client={shards_per_client} with data.num_clients={num_clients} "
            f"needs {num_shards} shards but there are only {n} training samples; "
            "lower partition.shards_per_client."
        )
    rng = _rng(seed)
    order = np.argsort(labels, kind="stable")
    shard_sizes = np.full(num_shards, n // num_shards)
    shard_sizes[: n % num_shards] += 1

    def draw(rng: np.random.Generator) -> np.ndarray:
        owner = rng.permutation(num_shards) // shards_per_client
        assignment = np.empty(n, dtype=np.int64)
        assignment[order] = np.repeat(owner, shard_sizes)
        return assignment

    fix = "or data.num_clients"
    return _group(_draw_until_large_enough(draw, rng, num_clients, min_partition_size, fix), num_clients)


def quantity_skew_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    seed: Seed,
    min_partition_size: int = 1,
    alpha: float = 1.0,
) -> ClientPartition:
    """Quantity skew: client sizes follow ``Dir(alpha)``; labels stay IID.

    Each client first gets ``min_partition_size`` samples; the other
    ``N - K * min_partition_size`` are spread by a multinomial draw with Dirichlet
    proportions. Samples are assigned after a random shuffle.

    Args:
        labels: One entry per sample (only the count ``N`` is used).
        num_clients: Number of clients ``K``.
        seed: Seed or generator of the draws.
        min_partition_size: Samples every client gets before the Dirichlet share.
        alpha: Dirichlet concentration, ``> 0`` (small means very unequal sizes).

    Returns:
        ``K`` sorted ``int64`` index arrays of at least ``min_partition_size`` samples.

    Raises:
        ValueError: If ``alpha <= 0`` or ``N < K * min_partition_size``.
    """
    _check_alpha(alpha)
    num_samples = _labels(labels).size
    _check_counts(num_samples, num_clients, min_partition_size)
    rng = _rng(seed)
    q = _dirichlet(rng, alpha, num_clients)
    sizes = min_partition_size + rng.multinomial(num_samples - num_clients * min_partition_size, q)
    assignment = np.empty(num_samples, dtype=np.int64)
    assignment[rng.permutation(num_samples)] = np.repeat(np.arange(num_clients), sizes)
    return _group(assignment, num_clients)


def natural_partition(
    labels: ArrayLike,
    num_clients: int,
    *,
    seed: Seed,
    min_partition_size: int = 1,
    groups: ArrayLike,
) -> ClientPartition:
    """Natural partition: the samples of each group (speaking role, writer) stay together.

    With ``K`` equal to the number of groups ``G`` each client is one group, in ascending
    group-id order. With ``K < G`` the groups are shuffled and dealt round-robin, so each
    client holds ``floor(G/K)`` or ``ceil(G/K)`` whole groups (dealt again while a client is
    below ``min_partition_size``).

    Args:
        labels: One entry per sample (only the count ``N`` is checked against ``groups``).
        num_clients: Number of clients ``K <= G``.
        seed: Seed or generator of the deal (used only when ``K < G``).
        min_partition_size: Fewest samples per client.
        groups: Integer group id per sample, shape ``(N,)``; every id present is a group.

    Returns:
        ``K`` sorted, non-empty ``int64`` index arrays.

    Raises:
        ValueError: If ``K`` exceeds the number of groups, ``groups`` and ``labels`` differ
            in length, or a client stays below ``min_partition_size``.

    Example:
        >>> groups = np.array([5, 2, 5, 2, 9])
        >>> [p.tolist() for p in natural_partition(groups, 3, seed=0, groups=groups)]
        [[1, 3], [0, 2], [4]]
    """
    groups = np.asarray(groups).reshape(-1)
    n = _labels(labels).size
    if groups.size != n:
        raise ValueError(f"natural_partition got {groups.size} group ids for {n} samples.")
    ids, inverse = np.unique(groups, return_inverse=True)
    if num_clients > ids.size or num_clients < 1:
        raise ValueError(
            f"partition=natural gives at most one client per natural group and this data has {ids.size}; "
            f"set data.num_clients={ids.size} (or fewer, to merge whole groups)."
        )
    _check_counts(n, num_clients, min_partition_size)
    rng = _rng(seed)
    if num_clients == ids.size:
        sizes = np.bincount(inverse, minlength=ids.size)
        if sizes.min() < min_partition_size:
            raise ValueError(
                f"{int((sizes < min_partition_size).sum())} natural groups have fewer than "
                f"partition.min_partition_size={min_partition_size} samples (the smallest has {sizes.min()}); "
                "lower partition.min_partition_size or data.num_clients to merge groups."
            )
        return _group(inverse.astype(np.int64), num_clients)

    def draw(rng: np.random.Generator) -> np.ndarray:
        owner = rng.permutation(ids.size) % num_clients
        return owner[inverse].astype(np.int64)

    fix = "or data.num_clients"
    return _group(_draw_until_large_enough(draw, rng, num_clients, min_partition_size, fix), num_clients)


def grouped_holdout(groups: np.ndarray, fraction: float, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``round(fraction * n_g)`` samples of each group, but never a group's last one.

    Args:
        groups: Group id per sample, shape ``(N,)``.
        fraction: Share to hold out, in ``[0, 1)``.
        perm: A random permutation of ``range(N)``; within a group, the samples that come
            first in ``perm`` are held out.

    Returns:
        ``(held_out, kept)`` index arrays (unsorted); every group keeps at least one sample.

    Example:
        >>> held, kept = grouped_holdout(np.array([0, 0, 0, 0, 1]), 0.5, np.arange(5))
        >>> held.tolist(), sorted(kept.tolist())
        ([0, 1], [2, 3, 4])
    """
    groups = np.asarray(groups).reshape(-1)
    _, inverse = np.unique(groups, return_inverse=True)
    g = inverse[perm]
    order = np.argsort(g, kind="stable")  # perm order kept inside each group
    sizes = np.bincount(g)
    starts = np.cumsum(sizes) - sizes
    rank = np.empty(len(perm), dtype=np.int64)
    rank[order] = np.arange(len(perm)) - np.repeat(starts, sizes)
    quota = np.minimum(np.round(fraction * sizes).astype(np.int64), sizes - 1)
    held = rank < quota[g]
    return perm[held], perm[~held]


def partition_summary(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Label histogram of a partition.

    Args:
        labels: Integer class label per sample, values in ``[0, num_classes)``.
        parts: Per-client index arrays.
        num_classes: Number of classes ``C``.

    Returns:
        ``int64`` array of shape ``(K, C)``: samples of class ``c`` held by client ``k``.

    Example:
        >>> partition_summary(np.array([0, 1, 1]), [np.array([0, 1]), np.array([2])], 2)
        array([[1, 1],
               [0, 1]])
    """
    labels = np.asarray(labels).reshape(-1)
    packed = ClientPartition.from_parts(parts)
    k, sizes, idx = len(packed), packed.sizes, packed.indices
    client = np.repeat(np.arange(k), sizes)
    flat = client * num_classes + labels[idx].astype(np.int64)
    return np.bincount(flat, minlength=k * num_classes).reshape(k, num_classes)


@dataclass(frozen=True, kw_only=True)
class _Partition:
    """Common fields and call of the Hydra partition wrappers.

    Attributes:
        seed: Seed of this partition's draws (``partition.seed``); ``None`` (default) uses the
            seed the caller passes, which a datamodule sets to its own ``seed``.
        min_partition_size: Fewest samples per client (``partition.min_partition_size``).
    """

    seed: int | None = None
    min_partition_size: int = 1

    def __post_init__(self) -> None:
        if self.seed is not None and (isinstance(self.seed, bool) or int(self.seed) != self.seed):
            raise ValueError(f"partition.seed must be an integer or null (got {self.seed!r}).")
        _check_min_size(self.min_partition_size)

    def _seed(self, seed: Seed | None) -> Seed:
        chosen = int(self.seed) if self.seed is not None else seed
        if chosen is None:
            raise ValueError(f"{type(self).__name__} needs a seed: pass seed= or set partition.seed.")
        return chosen

    def _params(self) -> dict[str, Any]:
        return {}

    def _function(self) -> Callable[..., Sequence[np.ndarray]]:
        raise NotImplementedError

    def __call__(self, labels: ArrayLike, num_clients: int, *, seed: Seed | None = None) -> Sequence[np.ndarray]:
        """Partition ``labels`` over ``num_clients`` clients (``self.seed`` wins over ``seed``)."""
        return self._function()(
            labels, num_clients, seed=self._seed(seed), min_partition_size=self.min_partition_size, **self._params()
        )


@dataclass(frozen=True, kw_only=True)
class IIDPartition(_Partition):
    """Hydra-friendly wrapper of :func:`iid_partition` (``partition=iid``)."""

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return "iid"

    def _function(self) -> Callable[..., Sequence[np.ndarray]]:
        return iid_partition


@dataclass(frozen=True, kw_only=True)
class DirichletPartition(_Partition):
    """Hydra-friendly wrapper of :func:`dirichlet_partition` (``partition=dirichlet``).

    Attributes:
        alpha: Dirichlet concentration (``partition.alpha``), ``> 0``.
    """

    alpha: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alpha(self.alpha)

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"dirichlet_alpha{self.alpha:g}"

    def _function(self) -> Callable[..., Sequence[np.ndarray]]:
        return dirichlet_partition

    def _params(self) -> dict[str, Any]:
        return {"alpha": float(self.alpha)}


@dataclass(frozen=True, kw_only=True)
class ShardPartition(_Partition):
    """Hydra-friendly wrapper of :func:`shard_partition` (``partition=shards``).

    Attributes:
        shards_per_client: Label-sorted shards per client (``partition.shards_per_client``).
    """

    shards_per_client: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_shards(self.shards_per_client)

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"shard{self.shards_per_client}"

    def _function(self) -> Callable[..., Sequence[np.ndarray]]:
        return shard_partition

    def _params(self) -> dict[str, Any]:
        return {"shards_per_client": int(self.shards_per_client)}


@dataclass(frozen=True, kw_only=True)
class QuantitySkewPartition(_Partition):
    """Hydra-friendly wrapper of :func:`quantity_skew_partition` (``partition=quantity_skew``).

    Attributes:
        alpha: Dirichlet concentration of client sizes (``partition.alpha``), ``> 0``.
    """

    alpha: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alpha(self.alpha)

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"quantity_skew_alpha{self.alpha:g}"

    def _function(self) -> Callable[..., Sequence[np.ndarray]]:
        return quantity_skew_partition

    def _params(self) -> dict[str, Any]:
        return {"alpha": float(self.alpha)}


@dataclass(frozen=True, kw_only=True)
class NaturalPartition(_Partition):
    """``partition=natural``: clients are the data set's own groups (roles, writers).

    The datamodule supplies the groups through
    :meth:`~fedlightning.datamodules.base.FederatedDataModule.natural_groups`; data sets
    without natural clients reject this partition with a clear error.
    """

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return "natural"

    def __call__(  # type: ignore[override]
        self,
        labels: ArrayLike,
        num_clients: int,
        *,
        seed: Seed | None = None,
        groups: ArrayLike | None = None,
    ) -> Sequence[np.ndarray]:
        """Partition by ``groups`` (one group id per sample), see :func:`natural_partition`."""
        if groups is None:
            raise ValueError(
                "partition=natural needs the natural client of every sample, which only data sets with "
                "natural clients provide (data=shakespeare, data=femnist); choose another partition."
            )
        return natural_partition(
            labels, num_clients, seed=self._seed(seed), min_partition_size=self.min_partition_size, groups=groups
        )


@dataclass(frozen=True, kw_only=True)
class FilePartition:
    """``partition=file``: the clients (and hold-out) saved in ``data.partition_file``.

    A marker: the datamodule reads the file written by
    :meth:`~fedlightning.datamodules.base.FederatedDataModule.save_partition` instead of
    drawing a split, and refuses ``data.partition_file`` with any other partition.
    """

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return "file"

    def __call__(self, labels: ArrayLike, num_clients: int, *, seed: Seed | None = None) -> Sequence[np.ndarray]:
        """Not a draw: a datamodule with ``partition_file`` set reads the saved clients."""
        raise ValueError(
            "partition=file reuses the clients saved in data.partition_file; "
            "set data.partition_file=<run folder>/partition.json."
        )
