"""Many clients: 100,000 registered clients cost their index arrays only; client data are slices of the training set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlightning.datamodules.partition import ClientPartition, iid_partition
from fedlightning.datamodules.synthetic_logistic import SyntheticLogisticDataModule
from fedlightning.run import run

from .conftest import compose_config


def test_client_partition_packs_views_of_one_flat_array() -> None:
    parts = ClientPartition.from_parts([np.array([4, 7]), np.array([], dtype=np.int64), np.array([1, 2, 3])])
    assert len(parts) == 3
    assert parts.offsets.tolist() == [0, 2, 2, 5] and parts.sizes.tolist() == [2, 0, 3]
    assert [p.tolist() for p in parts] == [[4, 7], [], [1, 2, 3]]
    assert parts[-1].tolist() == [1, 2, 3] and [p.tolist() for p in parts[0:2]] == [[4, 7], []]
    assert parts[2].base is not None  # a view, not a copy
    assert ClientPartition.from_parts(parts) is parts
    with pytest.raises(IndexError, match=r"client 3 is out of range \[0, 3\)"):
        parts[3]
    with pytest.raises(ValueError, match="offsets must start at 0"):
        ClientPartition(indices=np.arange(3), offsets=np.array([0, 2]))
    with pytest.raises(ValueError):
        parts.indices[0] = 5  # read-only: a partition is never edited in place


def test_iid_partition_of_100k_clients_is_packed_and_exact() -> None:
    parts = iid_partition(np.zeros(1_000_000), 100_000, seed=0)
    assert isinstance(parts, ClientPartition) and len(parts) == 100_000
    assert (parts.sizes == 10).all()
    assert np.array_equal(np.sort(parts.indices), np.arange(1_000_000))
    assert all((np.diff(parts[k]) > 0).all() for k in (0, 50_000, 99_999))  # sorted inside each client


def test_100k_clients_are_slices_of_one_training_set_holding_their_loaded_rows() -> None:
    dm = SyntheticLogisticDataModule(num_clients=100_000, num_samples=200_000, dim=2, val_fraction=0.0)
    dm.setup("fit")
    assert isinstance(dm._parts, ClientPartition)
    assert len(dm.client_sizes) == 100_000 and sum(dm.client_sizes) == 200_000
    (loaded_x, loaded_y), _ = dm._load()
    x = dm._train_tensors()[0]
    for cid in (0, 54_321, 99_999):
        cx, cy = dm.client_tensors(cid)
        assert cx.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # no per-client copy
        rows = torch.from_numpy(dm.train_index[dm.client_indices(cid)])
        assert len(rows) == dm.client_sizes[cid]
        assert torch.equal(cx, loaded_x[rows]) and torch.equal(cy, loaded_y[rows])
    with pytest.raises(IndexError, match=r"client id 100000 is out of range"):
        dm.client_tensors(100_000)


def test_clients_whose_samples_are_apart_in_the_training_set_are_gathered() -> None:
    dm = SyntheticLogisticDataModule(num_clients=4, num_samples=40, dim=3, val_fraction=0.0)
    dm.setup("fit")
    x, y = dm._train_tensors()
    dm._parts = [np.arange(k, 40, 4) for k in range(4)]  # as a subclass's own setup might leave them
    cx, cy = dm.client_tensors(1)
    assert torch.equal(cx, x[1::4]) and torch.equal(cy, y[1::4])


@pytest.mark.slow
def test_fedavg_run_over_100k_registered_clients_completes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = compose_config(
        [
            "data=synthetic_logistic",
            "data.num_clients=100000",
            "data.num_samples=200000",
            "model=logreg",
            "partition=iid",
            "sampler=uniform",
            "clients_per_round=10",
            "rounds=2",
            "checkpoint_every=0",
            "save_partition=false",
            "logger=csv",
        ]
    )
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and 0.0 <= summary["test/acc"] <= 1.0
