"""Partitioners: exactly-once assignment, no empty client, determinism, skew, speed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlightning.datamodules.partition import (
    MAX_DRAWS,
    DirichletPartition,
    FilePartition,
    IIDPartition,
    NaturalPartition,
    QuantitySkewPartition,
    ShardPartition,
    dirichlet_partition,
    iid_partition,
    natural_partition,
    partition_summary,
    quantity_skew_partition,
    shard_partition,
)
from fedlightning.plotting import plot_label_distribution

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
        a: mean_label_entropy(labels, dirichlet_partition(labels, 20, seed=1, alpha=a), 10) for a in (0.05, 1.0, 100.0)
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


def test_min_partition_size_one_is_the_default_draw() -> None:
    labels = np.random.default_rng(1).integers(0, 10, 500)
    a = dirichlet_partition(labels, 30, seed=9, alpha=0.05)
    b = dirichlet_partition(labels, 30, seed=9, alpha=0.05, min_partition_size=1)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("which", "call"),
    [
        ("dirichlet", lambda y, m: dirichlet_partition(y, 20, seed=0, alpha=0.3, min_partition_size=m)),
        ("shards", lambda y, m: shard_partition(y, 7, seed=0, shards_per_client=3, min_partition_size=m)),
        ("quantity_skew", lambda y, m: quantity_skew_partition(y, 20, seed=0, alpha=0.1, min_partition_size=m)),
        ("natural", lambda y, m: natural_partition(y, 4, seed=0, groups=np.arange(y.size) % 13)),
    ],
)
def test_min_partition_size_is_met_by_redrawing(which: str, call: Callable[..., list[np.ndarray]]) -> None:
    labels = np.random.default_rng(2).integers(0, 10, 400)
    small = min(len(p) for p in call(labels, 1))
    wanted = {"dirichlet": 8, "shards": 57, "quantity_skew": 10, "natural": 90}[which]
    parts = call(labels, wanted)
    check_valid(parts, 400, len(parts))
    assert min(len(p) for p in parts) >= wanted
    if which == "dirichlet":  # the first draw had a smaller client, so a redraw happened
        assert small < wanted


def test_quantity_skew_gives_every_client_min_partition_size_first() -> None:
    sizes = [len(p) for p in quantity_skew_partition(np.zeros(1000), 10, seed=3, alpha=0.05, min_partition_size=40)]
    assert min(sizes) >= 40 and sum(sizes) == 1000 and max(sizes) > 200


def test_unreachable_min_partition_size_is_refused_in_one_sentence() -> None:
    labels = np.repeat(np.arange(10), 10)
    with pytest.raises(ValueError) as info:
        dirichlet_partition(labels, 10, seed=0, alpha=1e-4, min_partition_size=9)
    assert str(info.value).startswith(f"After {MAX_DRAWS} random splits the smallest client still had ")
    assert "lower partition.min_partition_size, raise partition.alpha or lower data.num_clients." in str(info.value)
    with pytest.raises(ValueError, match=r"min_partition_size=11 with data\.num_clients=10 needs 110"):
        iid_partition(labels, 10, seed=0, min_partition_size=11)
    with pytest.raises(ValueError, match=r"3 natural groups have fewer than partition\.min_partition_size=5"):
        groups = np.r_[np.zeros(20), [1, 1], [2], [3, 3, 3, 3]]
        natural_partition(groups, 4, seed=0, groups=groups, min_partition_size=5)
    with pytest.raises(ValueError, match=r"partition\.min_partition_size must be an integer >= 1"):
        IIDPartition(min_partition_size=0)


def test_the_wrappers_call_the_functions_and_their_own_seed_wins() -> None:
    labels = np.random.default_rng(3).integers(0, 10, 300)
    expected = dirichlet_partition(labels, 6, seed=7, alpha=0.2, min_partition_size=3)
    wrapper = DirichletPartition(alpha=0.2, seed=7, min_partition_size=3)
    for got in (wrapper(labels, 6, seed=0), wrapper(labels, 6)):
        assert all(np.array_equal(u, v) for u, v in zip(expected, got, strict=True))
    unseeded = ShardPartition(shards_per_client=3)(labels, 6, seed=7)
    same = shard_partition(labels, 6, seed=7, shards_per_client=3)
    assert all(np.array_equal(u, v) for u, v in zip(unseeded, same, strict=True))
    with pytest.raises(ValueError, match=r"IIDPartition needs a seed: pass seed= or set partition\.seed"):
        IIDPartition()(labels, 6)
    groups = np.arange(300) % 5
    natural = NaturalPartition(seed=1)(labels, 3, groups=groups)
    direct = natural_partition(labels, 3, seed=1, groups=groups)
    assert all(np.array_equal(u, v) for u, v in zip(natural, direct, strict=True))
    with pytest.raises(ValueError, match=r"partition=file reuses the clients saved in data\.partition_file"):
        FilePartition()(labels, 6, seed=0)


@pytest.mark.parametrize(("clients", "classes"), [(10, 10), (100, 10), (300, 62)])
def test_plot_label_distribution_writes_a_png(tmp_path: Path, clients: int, classes: int) -> None:
    labels = np.random.default_rng(0).integers(0, classes, 20 * clients)
    parts = dirichlet_partition(labels, clients, seed=0, alpha=0.5)
    path = plot_label_distribution(labels, parts, tmp_path / "labels.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="class_names has 2 names for"):
        plot_label_distribution(labels, parts, tmp_path / "x.png", class_names=["a", "b"])
