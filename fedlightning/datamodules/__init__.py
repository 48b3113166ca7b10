"""Data: federated data modules and partitioners (usable without the federated engine)."""

from fedlightning.datamodules.base import (
    DataUnavailableError,
    FederatedDataModule,
    default_data_root,
)
from fedlightning.datamodules.cifar import CIFAR10DataModule, CIFAR100DataModule
from fedlightning.datamodules.digits import DigitsDataModule
from fedlightning.datamodules.emnist import EMNISTDataModule, FEMNISTDataModule
from fedlightning.datamodules.mnist import MNISTDataModule
from fedlightning.datamodules.partition import (
    DirichletPartition,
    FilePartition,
    IIDPartition,
    NaturalPartition,
    QuantitySkewPartition,
    ShardPartition,
    dirichlet_partition,
    grouped_holdout,
    iid_partition,
    natural_partition,
    partition_summary,
    quantity_skew_partition,
    shard_partition,
)
from fedlightning.datamodules.shakespeare import ShakespeareDataModule

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "DataUnavailableError",
    "DigitsDataModule",
    "DirichletPartition",
    "EMNISTDataModule",
    "FEMNISTDataModule",
    "FederatedDataModule",
    "FilePartition",
    "IIDPartition",
    "MNISTDataModule",
    "NaturalPartition",
    "QuantitySkewPartition",
    "ShakespeareDataModule",
    "ShardPartition",
    "default_data_root",
    "dirichlet_partition",
    "grouped_holdout",
    "iid_partition",
    "natural_partition",
    "partition_summary",
    "quantity_skew_partition",
    "shard_partition",
]
