"""Data: federated data modules and partitioners (usable without the federated engine)."""

from fedlightning.datamodules.base import (
    DataUnavailableError,
    FederatedDataModule,
    default_data_root,
)
from fedlightning.datamodules.digits import DigitsDataModule
from fedlightning.datamodules.mnist import MNISTDataModule
from fedlightning.datamodules.partition import (
    DirichletPartition,
    IIDPartition,
    QuantitySkewPartition,
    ShardPartition,
    dirichlet_partition,
    iid_partition,
    partition_summary,
    quantity_skew_partition,
    shard_partition,
)

__all__ = [
    "DataUnavailableError",
    "DigitsDataModule",
    "DirichletPartition",
    "FederatedDataModule",
    "IIDPartition",
    "MNISTDataModule",
    "QuantitySkewPartition",
    "ShardPartition",
    "default_data_root",
    "dirichlet_partition",
    "iid_partition",
    "partition_summary",
    "quantity_skew_partition",
    "shard_partition",
]
