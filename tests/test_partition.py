"""Partitioners: exactly-once assignment, no empty client, determinism, skew, speed."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlightning.datamodules.partition import (
    MAX_DRAWS,
    DirichletPartition,
    FilePartition,
    NaturalPartition,
    IIDPartition,
    QuantitySkewPartition,
    ShardPartition,
    dirichlet_partition,
    iid_partition,
    natural_partition,
    partition_summary,
    plot_label_distribution,
    quantity_skew_partition,
    shard_partition,
)

Partitioner = Callable[..., list[np.ndarray]]

PARTITIONERS: dict[str, Partitioner] = {
    "iid": IIDPartition(),
    "dirichlet_0.1": DirichletPartition(alpha=0.1),
    "dirichlet_1e-4": DirichletPartition(alpha=1e-4),
    "dirichlet_100": DirichletPartition(alpha=100.0),
    "shard": ShardPartition(shards_per_client=2),
    "quantity": QuantitySkewPartition(alpha=0.2),
}


def check_valid(parts: list[np.ndarray], n: int, k: int) -> None:
    assert len(parts) == k
    assert all(p.dtype == np.int64 and p.size > 0 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no duplicates inside
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


@settings(max_examples=40, deadline=None, database=None)
@given(
    k=st.integers(1, 40),
    extra=st.integers(0, 300),
    classes=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    which=st.sampled_from(sorted(PARTITIONERS)),
)
def test_exactly_once_and_no_empty_client(k: int, extra: int, classes: int, seed: int, which: str) -> None:
    n = 2 * k + extra  # shards need n >= 2k
    labels = np.random.default_rng(seed).integers(0, classes, n) * 3 + 1  # non-contiguous class ids
    check_valid(PARTITIONERS[which](labels, k, seed=seed), n, k)


@pytest.mark.parametrize("which", sorted(PARTITIONERS))
def test_deterministic_per_seed(which: str) -> None:
    labels = np.random.default_rng(0).integers(0, 10, 1000)

    def run(seed: int) -> list[np.ndarray]:
        return PARTITIONERS[which](labels, 20, seed=seed)

    assert all(np.array_equal(a, b) for a, b in zip(run(3), run(3), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(run(3), run(4), strict=True))


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in iid_partition(np.zeros(103), 10, seed=0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 103


def mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray], c: int) -> float:
    hist = partition_summary(labels, parts, c).astype(float)
    p = hist / hist.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    return float(h.mean())


def test_dirichlet_small_alpha_is_more_skewed() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 5000)
    ent = {
        a: mean_label_entropy(labels, dirichlet_partition(labels, 20, seed=1, alpha=a), 10)
        for a in (0.05, 1.0, 100.0)
    }
    assert ent[0.05] < ent[1.0] < ent[100.0]
    assert ent[100.0] > 0.95 * np.log(10)  # near IID


def test_shard_clients_see_few_labels() -> None:
    labels = np.repeat(np.arange(10), 100)
    hist = partition_summary(labels, shard_partition(labels, 50, seed=0, shards_per_client=2), 10)
    assert ((hist > 0).sum(axis=1) <= 2).all()


def test_quantity_skew_keeps_labels_iid_and_sizes_skewed() -> None:
    n, k = 20_000, 20
    sizes = [len(p) for p in quantity_skew_partition(np.zeros(n), k, seed=0, alpha=0.3)]
    assert max(sizes) > 4 * n / k > min(sizes) >= 1


def test_partition_summary_counts() -> None:
    labels = np.array([0, 2, 2, 1])
    hist = partition_summary(labels, [np.array([0, 1]), np.array([2, 3])], 3)
    np.testing.assert_array_equal(hist, [[1, 0, 1], [0, 1, 1]])


@pytest.mark.parametrize("which", sorted(PARTITIONERS))
def test_more_clients_than_samples_raises(which: str) -> None:
    with pytest.raises(ValueError, match=r"data\.num_clients"):
        PARTITIONERS[which](np.zeros(5, dtype=np.int64), 6, seed=0)


def test_invalid_parameters_name_the_config_key() -> None:
    with pytest.raises(
        ValueError,
        match=r"partition.alpha must be > 0 \(got -1.0\); use e.g. partition.alpha=0.5",
    ):
        DirichletPartition(alpha=-1.0)
    with pytest.raises(ValueError, match=r"partition\.alpha"):
        QuantitySkewPartition(alpha=0.0)
    with pytest.raises(ValueError, match=r"partition\.shards_per_client"):
        ShardPartition(shards_per_client=0)
    with pytest.raises(ValueError, match=r"partition\.shards_per_client"):
        shard_partition(np.zeros(10, dtype=np.int64), 4, seed=0, shards_per_client=3)


def test_names() -> None:
    assert IIDPartition().name == "iid"
    assert DirichletPartition(alpha=0.5).name == "dirichlet_alpha0.5"
    assert ShardPartition().name == "shard2"
    assert QuantitySkewPartition().name == "quantity_skew_alpha1"


@pytest.mark.parametrize("which", sorted(PARTITIONERS))
def test_fast_for_10k_clients(which: str) -> None:
    n, k = 100_000, 10_000
    labels = np.random.default_rng(0).integers(0, 10, n)
    start = time.perf_counter()
    parts = PARTITIONERS[which](labels, k, seed=0)
    assert time.perf_counter() - start < 5.0
    check_valid(parts, n, k)


# Outputs of every partitioner for one fixed seed, recorded before the keyword-only
# ``seed=`` signature replaced ``rng``: (client sizes, client 0's first indices, a checksum
# sum_k (k + 1) * sum(indices of client k)). The new API must reproduce them exactly.
PINNED_LABELS = np.random.default_rng(0).integers(0, 10, 300)
PINNED: dict[str, tuple[list[int], list[int], int]] = {
    "iid": ([43, 43, 43, 43, 43, 43, 42], [0, 3, 12, 19, 26, 29], 173112),
    "dirichlet_0.3": ([64, 36, 67, 52, 15, 37, 29], [0, 3, 4, 24, 28, 29], 149704),
    "dirichlet_1e-3": ([74, 58, 1, 29, 41, 35, 62], [3, 8, 20, 31, 37, 38], 170818),
    "shards_2": ([43, 43, 42, 44, 43, 43, 42], [11, 14, 19, 38, 39, 40], 182455),
    "quantity_skew_0.5": ([77, 119, 2, 57, 3, 12, 30], [0, 2, 3, 6, 15, 16], 123653),
    "natural_4": ([90, 90, 60, 60], [60, 61, 62, 63, 64, 65], 93705),
}


def _pinned_run(which: str) -> list[np.ndarray]:
    groups = np.repeat(np.arange(10), 30)
    calls: dict[str, Callable[[], list[np.ndarray]]] = {
        "iid": lambda: iid_partition(PINNED_LABELS, 7, seed=42),
        "dirichlet_0.3": lambda: dirichlet_partition(PINNED_LABELS, 7, seed=42, alpha=0.3),
        "dirichlet_1e-3": lambda: dirichlet_partition(PINNED_LABELS, 7, seed=42, alpha=1e-3),
        "shards_2": lambda: shard_partition(PINNED_LABELS, 7, seed=42, shards_per_client=2),
        "quantity_skew_0.5": lambda: quantity_skew_partition(PINNED_LABELS, 7, seed=42, alpha=0.5),
        "natural_4": lambda: natural_partition(PINNED_LABELS, 4, seed=42, groups=groups),
    }
    return calls[which]()


@pytest.mark.parametrize("which", sorted(PINNED))
def test_seed_42_reproduces_the_recorded_partition(which: str) -> None:
    parts = _pinned_run(which)
    sizes, head, checksum = PINNED[which]
    assert [len(p) for p in parts] == sizes
    assert parts[0][:6].tolist() == head
    assert int(sum((k + 1) * p.sum() for k, p in enumerate(parts))) == checksum
