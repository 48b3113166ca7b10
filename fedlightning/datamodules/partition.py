"""Partitioners: split a data set's sample indices across federated clients.

Every partitioner is a pure function of its inputs and a ``numpy.random.Generator``. It
returns one sorted ``int64`` index array per client; together they hold every sample
index ``0..N-1`` exactly once, and no client is empty (a ``ValueError`` is raised when
``N < num_clients`` makes that impossible). All of them are vectorised, so 10,000 clients
over 100,000 samples take well under a second.

The small dataclasses at the bottom wrap the functions for Hydra (``_target_``), e.g.
``partition: {_target_: fedlightning.datamodules.DirichletPartition, alpha: 0.1}``.

Example:
    >>> rng = np.random.default_rng(0)
    >>> parts = iid_partition(10, 3, rng)
    >>> [len(p) for p in parts]
    [4, 3, 3]
    >>> np.sort(np.concatenate(parts)).tolist() == list(range(10))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DirichletPartition",
    "IIDPartition",
    "NaturalPartition",
    "QuantitySkewPartition",
    "ShardPartition",
    "dirichlet_partition",
    "grouped_holdout",
    "iid_partition",
    "natural_partition",
    "partition_summary",
    "quantity_skew_partition",
    "shard_partition",
]


def _check_counts(num_samples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"data.num_clients must be >= 1 (got {num_clients}).")
    if num_samples < num_clients:
        raise ValueError(
            f"Cannot give each of data.num_clients={num_clients} clients at least one sample: "
            f"only {num_samples} training samples; lower data.num_clients."
        )


def _check_alpha(alpha: float) -> None:
    if not alpha > 0 or not np.isfinite(alpha):
        raise ValueError(f"partition.alpha must be > 0 (got {alpha}); use e.g. partition.alpha=0.5")


def _group(assignment: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Turn a client id per sample into sorted per-client index arrays."""
    # A stable argsort of the client ids keeps the indices ascending inside each client.
    order = np.argsort(assignment, kind="stable").astype(np.int64, copy=False)
    sizes = np.bincount(assignment, minlength=num_clients)
    return np.split(order, np.cumsum(sizes)[:-1])


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


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle the samples and deal them into equal shares.

    Args:
        num_samples: Number of samples ``N``.
        num_clients: Number of clients ``K``.
        rng: Source of randomness.

    Returns:
        ``K`` sorted ``int64`` index arrays whose sizes differ by at most one.

    Raises:
        ValueError: If ``N < K``.
    """
    _check_counts(num_samples, num_clients)
    sizes = np.full(num_clients, num_samples // num_clients)
    sizes[: num_samples % num_clients] += 1
    assignment = np.empty(num_samples, dtype=np.int64)
    assignment[rng.permutation(num_samples)] = np.repeat(np.arange(num_clients), sizes)
    return _group(assignment, num_clients)


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label skew: each class is spread over the clients by a Dirichlet draw.

    For every class ``c`` we draw ``q_c ~ Dir(alpha * 1_K)`` and cut the class's shuffled
    indices at the cumulative proportions ``floor(cumsum(q_c) * n_c)``. Small ``alpha``
    gives each client few classes; large ``alpha`` tends to IID (Hsu et al., 2019,
    arXiv:1909.06335). Clients left empty are then repaired, one at a time, by moving one
    random sample from whichever client is currently the largest, so sizes and histograms
    change by at most one sample per empty client.

    Args:
        labels: Integer class label per sample, shape ``(N,)``.
        num_clients: Number of clients ``K``.
        alpha: Dirichlet concentration, ``> 0``.
        rng: Source of randomness.

    Returns:
        ``K`` sorted, non-empty ``int64`` index arrays.

    Raises:
        ValueError: If ``alpha <= 0`` or ``N < K``.
    """
    _check_alpha(alpha)
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    _check_counts(n, num_clients)
    classes, inverse = np.unique(labels, return_inverse=True)
    # Samples grouped by class, in random order inside each class.
    perm = rng.permutation(n)
    by_class = perm[np.argsort(inverse[perm], kind="stable")]
    class_sizes = np.bincount(inverse, minlength=classes.size)
    q = _dirichlet(rng, alpha, num_clients, size=classes.size)  # C x K
    cuts = np.floor(np.cumsum(q, axis=1) * class_sizes[:, None]).astype(np.int64)
    cuts[:, -1] = class_sizes  # guard against rounding below n_c
    counts = np.diff(cuts, axis=1, prepend=0)  # C x K, samples of class c on client k
    assignment = np.empty(n, dtype=np.int64)
    assignment[by_class] = np.repeat(np.tile(np.arange(num_clients), classes.size), counts.ravel())
    _repair_empty(assignment, num_clients, rng)
    return _group(assignment, num_clients)


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
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Pathological non-IID split of FedAvg (McMahan et al., 2017, arXiv:1602.05629).

    The samples are sorted by label, cut into ``num_clients * shards_per_client``
    contiguous shards of (nearly) equal size, and the shards are dealt to clients at
    random, ``shards_per_client`` each.

    Args:
        labels: Integer class label per sample, shape ``(N,)``.
        num_clients: Number of clients ``K``.
        shards_per_client: Shards per client, ``>= 1``.
        rng: Source of randomness.

    Returns:
        ``K`` sorted, non-empty ``int64`` index arrays.

    Raises:
        ValueError: If ``shards_per_client < 1`` or there are fewer samples than shards.
    """
    if shards_per_client < 1:
        raise ValueError(
            f"partition.shards_per_client must be >= 1 (got {shards_per_client}); "
            "use e.g. partition.shards_per_client=2"
        )
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    _check_counts(n, num_clients)
    num_shards = num_clients * shards_per_client
    if n < num_shards:
        raise ValueError(
            f"partition.shards_per_client={shards_per_client} with data.num_clients={num_clients} "
            f"needs {num_shards} shards but there are only {n} training samples; "
            "lower partition.shards_per_client."
        )
    order = np.argsort(labels, kind="stable")
    shard_sizes = np.full(num_shards, n // num_shards)
    shard_sizes[: n % num_shards] += 1
    owner = rng.permutation(num_shards) // shards_per_client
    assignment = np.empty(n, dtype=np.int64)
    assignment[order] = np.repeat(owner, shard_sizes)
    return _group(assignment, num_clients)


def quantity_skew_partition(
    num_samples: int, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Quantity skew: client sizes follow ``Dir(alpha)``; labels stay IID.

    Each client first gets one sample; the other ``N - K`` are spread by a multinomial
    draw with Dirichlet proportions. Samples are assigned after a random shuffle.

    Args:
        num_samples: Number of samples ``N``.
        num_clients: Number of clients ``K``.
        alpha: Dirichlet concentration, ``> 0`` (small means very unequal sizes).
        rng: Source of randomness.

    Returns:
        ``K`` sorted, non-empty ``int64`` index arrays.

    Raises:
        ValueError: If ``alpha <= 0`` or ``N < K``.
    """
    _check_alpha(alpha)
    _check_counts(num_samples, num_clients)
    q = _dirichlet(rng, alpha, num_clients)
    sizes = 1 + rng.multinomial(num_samples - num_clients, q)
    assignment = np.empty(num_samples, dtype=np.int64)
    assignment[rng.permutation(num_samples)] = np.repeat(np.arange(num_clients), sizes)
    return _group(assignment, num_clients)


def natural_partition(groups: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Natural partition: the samples of each group (speaking role, writer) stay together.

    With ``K`` equal to the number of groups ``G`` each client is one group, in ascending
    group-id order. With ``K < G`` the groups are shuffled and dealt round-robin, so each
    client holds ``floor(G/K)`` or ``ceil(G/K)`` whole groups.

    Args:
        groups: Integer group id per sample, shape ``(N,)``; every id present is a group.
        num_clients: Number of clients ``K <= G``.
        rng: Source of randomness (used only when ``K < G``).

    Returns:
        ``K`` sorted, non-empty ``int64`` index arrays.

    Raises:
        ValueError: If ``K`` exceeds the number of groups.

    Example:
        >>> [p.tolist() for p in natural_partition(np.array([5, 2, 5, 2, 9]), 3, np.random.default_rng(0))]
        [[1, 3], [0, 2], [4]]
    """
    groups = np.asarray(groups).reshape(-1)
    ids, inverse = np.unique(groups, return_inverse=True)
    if num_clients > ids.size or num_clients < 1:
        raise ValueError(
            f"partition=natural gives at most one client per natural group and this data has {ids.size}; "
            f"set data.num_clients={ids.size} (or fewer, to merge whole groups)."
        )
    owner = np.arange(ids.size) if num_clients == ids.size else rng.permutation(ids.size) % num_clients
    return _group(owner[inverse].astype(np.int64), num_clients)


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


def partition_summary(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
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
    k = len(parts)
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=k)
    idx = np.concatenate(parts).astype(np.int64) if k else np.empty(0, np.int64)
    client = np.repeat(np.arange(k), sizes)
    flat = client * num_classes + labels[idx].astype(np.int64)
    return np.bincount(flat, minlength=k * num_classes).reshape(k, num_classes)


@dataclass(frozen=True, kw_only=True)
class IIDPartition:
    """Hydra-friendly wrapper of :func:`iid_partition`."""

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return "iid"

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Partition ``len(labels)`` samples IID over ``num_clients`` clients."""
        return iid_partition(len(labels), num_clients, rng)


@dataclass(frozen=True, kw_only=True)
class DirichletPartition:
    """Hydra-friendly wrapper of :func:`dirichlet_partition`.

    Attributes:
        alpha: Dirichlet concentration (``partition.alpha``), ``> 0``.
    """

    alpha: float = 0.5

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"dirichlet_alpha{self.alpha:g}"

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Partition with Dirichlet label skew."""
        return dirichlet_partition(labels, num_clients, self.alpha, rng)


@dataclass(frozen=True, kw_only=True)
class ShardPartition:
    """Hydra-friendly wrapper of :func:`shard_partition`.

    Attributes:
        shards_per_client: Label-sorted shards per client (``partition.shards_per_client``).
    """

    shards_per_client: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.shards_per_client, bool) or int(self.shards_per_client) != self.shards_per_client:
            raise ValueError(
                f"partition.shards_per_client must be an integer (got {self.shards_per_client!r}); "
                "use e.g. partition.shards_per_client=2"
            )
        if self.shards_per_client < 1:
            raise ValueError(
                f"partition.shards_per_client must be >= 1 (got {self.shards_per_client}); "
                "use e.g. partition.shards_per_client=2"
            )

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"shard{self.shards_per_client}"

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Partition into label-sorted shards."""
        return shard_partition(labels, num_clients, int(self.shards_per_client), rng)


@dataclass(frozen=True, kw_only=True)
class QuantitySkewPartition:
    """Hydra-friendly wrapper of :func:`quantity_skew_partition`.

    Attributes:
        alpha: Dirichlet concentration of client sizes (``partition.alpha``), ``> 0``.
    """

    alpha: float = 1.0

    def __post_init__(self) -> None:
        _check_alpha(self.alpha)

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return f"quantity_skew_alpha{self.alpha:g}"

    def __call__(self, labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Partition with Dirichlet-distributed client sizes and IID labels."""
        return quantity_skew_partition(len(labels), num_clients, self.alpha, rng)


@dataclass(frozen=True, kw_only=True)
class NaturalPartition:
    """``partition=natural``: clients are the data set's own groups (roles, writers).

    The datamodule supplies the groups through
    :meth:`~fedlightning.datamodules.base.FederatedDataModule.natural_groups`; data sets
    without natural clients reject this partition with a clear error.
    """

    @property
    def name(self) -> str:
        """Short name for run folders and logs."""
        return "natural"

    def __call__(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        *,
        groups: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Partition by ``groups`` (one group id per sample), see :func:`natural_partition`."""
        if groups is None:
            raise ValueError(
                "partition=natural needs the natural client of every sample, which only data sets with "
                "natural clients provide (data=shakespeare, data=femnist); choose another partition."
            )
        return natural_partition(groups, num_clients, rng)
