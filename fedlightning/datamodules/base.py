"""``FederatedDataModule``: one data set, split across clients by a partitioner.

The module has no dependency on the federated engine: it is an ordinary
``LightningDataModule`` whose ``train_dataloader`` serves the union of all clients, so a
plain ``lightning.Trainer`` can train on it centrally. The engine uses the per-client API
(``client_tensors``, ``client_dataloader``, ``client_sizes``).

Subclasses implement :meth:`FederatedDataModule._load` and set ``name``, ``num_classes``
and ``input_shape``. A data set with natural clients (Shakespeare roles, FEMNIST writers)
also implements :meth:`FederatedDataModule.natural_groups`, which ``partition=natural``
(:class:`~fedlightning.datamodules.partition.NaturalPartition`) uses. Data kept compactly in
memory (``feature_dtype``, e.g. ``uint8``) is turned into model input per batch by
:meth:`FederatedDataModule.transform` (evaluation and centralised loaders) and
:meth:`FederatedDataModule.augment` (client batches).
"""

from __future__ import annotations

import csv
import inspect
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset, default_collate

from fedlightning.datamodules.partition import (
    ClientPartition,
    FilePartition,
    IIDPartition,
    NaturalPartition,
    grouped_holdout,
    partition_summary,
)
from fedlightning.datamodules.partition_files import (
    PartitionRecord,
    check_v1_partition,
    read_partition_file,
    rows_of_saved_split,
    sorted_clients,
    write_partition_file,
)
from fedlightning.datamodules.tensor_loader import device_loader, tensor_loader
from fedlightning.errors import FedLightningError

__all__ = ["DataUnavailableError", "FederatedDataModule", "default_data_root", "subset_indices"]

log = logging.getLogger(__name__)

#: ``partition(labels, num_clients, *, seed) -> list of index arrays``, e.g. a partition
#: dataclass or ``functools.partial(dirichlet_partition, alpha=0.3)``.
Partitioner = Callable[..., Sequence[np.ndarray]]

#: Frozen, hence safe to share as a default argument.
DEFAULT_PARTITION = IIDPartition()


class DataUnavailableError(FedLightningError, RuntimeError):
    """A data set's files are missing and cannot be downloaded."""


def subset_indices(total: int, limit: int | None, seed: int) -> np.ndarray | None:
    """Sorted random indices of a ``limit``-sample subset of ``total`` samples, or ``None`` for all.

    The draw depends only on ``(seed, total, limit)``, so a loader can pick the subset before
    decoding anything (CIFAR-10 JPEGs) and get the same one the base class would.

    Example:
        >>> subset_indices(10, 3, 0).tolist() == subset_indices(10, 3, 0).tolist()
        True
        >>> subset_indices(10, None, 0) is None and subset_indices(10, 20, 0) is None
        True
    """
    if limit is None or limit >= total:
        return None
    if limit < 1:
        raise ValueError(f"data.max_train_samples / data.max_test_samples must be >= 1 (got {limit}).")
    return np.sort(np.random.default_rng([seed, 2, total]).choice(total, size=limit, replace=False))


def default_data_root() -> Path:
    """Return ``$FEDLIGHTNING_DATA`` if set, else ``~/.cache/fedlightning/data``."""
    env = os.environ.get("FEDLIGHTNING_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedlightning" / "data"


class FederatedDataModule(L.LightningDataModule):
    """Base class: loads a data set once, holds out validation, partitions the rest.

    Args:
        root: Folder holding the data set; ``None`` means :func:`default_data_root`.
        num_clients: Number of clients ``K`` (``data.num_clients``).
        partition: Callable ``(labels, num_clients, *, seed) -> list of index arrays``, e.g.
            :class:`~fedlightning.datamodules.partition.DirichletPartition`; ``None`` means
            IID, or the saved clients when ``partition_file`` is set.
        batch_size: Default client and centralised training batch size.
        eval_batch_size: Batch size of the validation and test loaders.
        val_fraction: Share of the training set held out for validation, in ``[0, 1)``.
            With ``0`` the validation loader serves the test set (logged).
        seed: Seeds the validation split and the partition.
        download: Allow ``prepare_data`` to download missing files.
        partition_file: A file written by :meth:`save_partition` whose clients and hold-out
            are reused instead of drawing a split; combine it only with no partition or
            :class:`~fedlightning.datamodules.partition.FilePartition` (``partition=file``).
        max_train_samples: Keep a random subset of this many training samples (before the
            validation split), e.g. for fast tests; logged as a subset. ``None``: all.
        max_test_samples: Likewise for the test set.
        num_workers: ``DataLoader`` worker processes of every loader this module creates
            (``0``: load in the main process).
        pin_memory: Page-locked batches for faster host-to-GPU copies.
        persistent_workers: Keep the workers alive between epochs (needs ``num_workers >= 1``).

    Example:
        >>> from fedlightning.datamodules import DigitsDataModule, DirichletPartition
        >>> dm = DigitsDataModule(num_clients=5, partition=DirichletPartition(alpha=0.3))
        >>> dm.setup("fit")
        >>> sum(dm.client_sizes) == dm.num_train_samples
        True
    """

    name: str = "base"
    num_classes: int
    input_shape: tuple[int, ...]
    #: Set by a subclass whose data is a subset or lossy copy; logged as a warning in setup.
    notice: str = ""
    #: "classification" (integer labels, accuracy) or "regression" (float targets, R²).
    task: str = "classification"
    #: dtype the features are stored in after ``_load``; ``None`` keeps the loaded dtype
    #: (e.g. ``uint8`` pixels or character indices, converted per batch by ``transform``).
    feature_dtype: torch.dtype | None = torch.float32
    #: True when an input is a window of token ids (an embedding's input), not features.
    token_inputs: bool = False
    #: True for generated data (the samples themselves change with ``seed``): a saved partition
    #: is then reused only under the seed it was saved with.
    data_depends_on_seed: bool = False

    def __init__(
        self,
        *,
        root: str | None = None,
        num_clients: int = 10,
        partition: Partitioner | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 1024,
        val_fraction: float = 0.1,
        seed: int = 0,
        download: bool = False,
        partition_file: str | None = None,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
            raise ValueError(f"data.num_clients must be an integer >= 1 (got {num_clients!r}).")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(
                f"data.val_fraction must be in [0, 1) (got {val_fraction}); use e.g. data.val_fraction=0.1"
            )
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(
                f"data.batch_size and data.eval_batch_size must be >= 1 (got {batch_size}, {eval_batch_size})."
            )
        if isinstance(num_workers, bool) or int(num_workers) != num_workers or num_workers < 0:
            raise ValueError(f"data.num_workers must be an integer >= 0 (got {num_workers!r}).")
        if persistent_workers and num_workers == 0:
            raise ValueError(
                "data.persistent_workers=true keeps DataLoader workers alive, but data.num_workers=0 starts none; "
                "set data.num_workers >= 1 or data.persistent_workers=false."
            )
        _check_partition_choice(partition, partition_file)
        self.root = Path(root).expanduser() if root else default_data_root()
        self.num_clients = int(num_clients)
        self.partition: Partitioner = DEFAULT_PARTITION if partition is None else partition
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_fraction = float(val_fraction)
        self.seed = seed
        self.download = download
        self.partition_file = partition_file
        for key, value in (("max_train_samples", max_train_samples), ("max_test_samples", max_test_samples)):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"data.{key} must be an integer >= 1 or null (got {value!r}).")
        self.max_train_samples = None if max_train_samples is None else int(max_train_samples)
        self.max_test_samples = None if max_test_samples is None else int(max_test_samples)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = bool(persistent_workers)
        #: Set by a ``_load`` whose training rows are not simply ``0..n-1`` of the data set
        #: (a test split carved from it, a subset decoded): (number of samples of the data set,
        #: the data set's index of each training row returned), so saved partitions use the
        #: data set's own indices.
        self._dataset_rows: tuple[int, np.ndarray] | None = None
        self._train: tuple[Tensor, Tensor] | None = None
        self._val: tuple[Tensor, Tensor] | None = None
        self._test: tuple[Tensor, Tensor] | None = None
        self._partition = ClientPartition.from_parts([])
        self._client_sizes: list[int] | None = None
        self._clients_are_slices = True

    # -- to implement -------------------------------------------------------------------

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """Return ``((x_train, y_train), (x_test, y_test))``: float32 features, int64 labels.

        Raises:
            DataUnavailableError: If the files are missing.
        """
        raise NotImplementedError

    def _download(self) -> None:
        """Fetch the data set into ``self.root`` (only called when ``download`` is true)."""

    def natural_groups(self) -> np.ndarray | None:
        """Natural client (role, writer) of each sample ``_load`` returned, or ``None`` if none.

        Called after ``_load``; returns an integer array of the training set's length.
        ``partition=natural`` gives one client per group (or whole groups per client).
        """
        return None

    def transform(self, x: Tensor) -> Tensor:
        """Turn a batch of stored features into model input (default: unchanged).

        Used by the validation, test and centralised loaders and by the default
        :meth:`augment`; a module storing ``uint8`` data normalises here. It runs where the
        batch is: on an accelerator, the engine's client and held-out batches are on the device.
        """
        return x

    # -- Lightning hooks ----------------------------------------------------------------

    def prepare_data(self) -> None:
        """Download the data set if ``download`` is true; nothing else."""
        if self.download:
            self._download()

    def setup(self, stage: str | None = None) -> None:
        """Load, split off validation, and partition the training set (once).

        With ``partition_file`` set, the hold-out and the clients are the file's (see
        :meth:`save_partition`) instead of being drawn from ``seed``.
        """
        if self._train is not None:
            return
        (x, y), test = self._load()
        x = self._cast(x)
        self.refuse_nonfinite(
            f"its files (data.root={self.root})",
            training_features=x,
            training_targets=y,
            test_features=test[0],
            test_targets=test[1],
        )
        y = y.long()
        num_dataset, origin = self._dataset_rows or (len(y), np.arange(len(y), dtype=np.int64))
        origin = np.asarray(origin, dtype=np.int64)
        saved = self._read_partition(Path(self.partition_file)) if self.partition_file else None
        natural = isinstance(self.partition, NaturalPartition)
        groups = self._natural_groups(len(y)) if natural else None
        keep = subset_indices(len(y), self.max_train_samples, self.seed)
        if keep is not None:
            self._add_notice(f"subset: {len(keep):,} of {len(y):,} training samples (data.max_train_samples)")
            x, y = x[torch.from_numpy(keep)], y[torch.from_numpy(keep)]
            groups = groups[keep] if groups is not None else None
            origin = origin[keep]
        keep = subset_indices(len(test[1]), self.max_test_samples, self.seed)
        if keep is not None:
            self._add_notice(f"subset: {len(keep):,} of {len(test[1]):,} test samples (data.max_test_samples)")
            test = (test[0][torch.from_numpy(keep)], test[1][torch.from_numpy(keep)])
        n = len(y)
        if self.notice:
            log.warning("%s: %s", self.name, self.notice)
        if saved is not None and saved["version"] >= 2:
            val_sel, train_sel = self._rows_of_saved_split(saved, origin, num_dataset)
        else:
            n_val = round(self.val_fraction * n)
            # A stream of its own, so changing val_fraction does not shift the partition's draws.
            perm = np.random.default_rng([self.seed, 1]).permutation(n)
            if groups is None:
                val_sel, train_sel = perm[:n_val], perm[n_val:]
            else:  # hold out within each natural client, never its last sample
                val_sel, train_sel = grouped_holdout(groups, self.val_fraction, perm)
        n_val = len(val_sel)
        val_idx = torch.from_numpy(np.sort(val_sel))
        train_idx = torch.from_numpy(np.sort(train_sel))
        #: Position of each training sample in the data ``_load`` returned (after any subset),
        #: in the order the training set is stored: client by client once partitioned.
        self.train_index = train_idx.numpy()
        #: The data set's own index (into its full training split) of each training sample.
        self.train_dataset_index = origin[self.train_index]
        #: The data set's own index of each held-out validation sample.
        self.val_dataset_index = origin[val_idx.numpy()]
        self._num_dataset_samples = int(num_dataset)
        if len(train_idx) < self.num_clients:
            raise ValueError(
                f"data.num_clients={self.num_clients} exceeds the {len(train_idx)} training samples of "
                f"{self.name}; lower data.num_clients (or data.val_fraction)."
            )
        self._val = (x[val_idx].contiguous(), y[val_idx].contiguous()) if n_val else None
        self._test = (self._cast(test[0]).contiguous(), test[1].long().contiguous())
        labels = y[train_idx].numpy()
        if saved is not None and saved["version"] >= 2:
            position = np.full(num_dataset, -1, dtype=np.int64)
            position[self.train_dataset_index] = np.arange(len(labels))
            parts: Sequence[np.ndarray] = [np.sort(position[c]) for c in saved["clients"]]
        elif saved is not None:
            parts = self._check_v1_partition(saved, len(labels))
        elif groups is not None:
            train_groups = groups[train_idx.numpy()]
            parts = self.partition(labels, self.num_clients, seed=self.seed, groups=train_groups)
        else:
            parts = self.partition(labels, self.num_clients, seed=self.seed)
        self._parts = parts
        self._check_partition(len(labels))
        # The training set is stored client by client, each client's samples in the order its index
        # array lists them, so a client's data is a slice of it: nothing is copied per client.
        by_client = self._parts.indices
        self.train_index = self.train_index[by_client]
        self.train_dataset_index = self.train_dataset_index[by_client]
        self._parts = ClientPartition(indices=np.arange(len(labels), dtype=np.int64), offsets=self._parts.offsets)
        rows = torch.from_numpy(self.train_index)
        self._train = (x.index_select(0, rows), y.index_select(0, rows))
        del x, y
        self._log_summary()

    def refuse_nonfinite(self, source: str, **parts: Tensor) -> None:
        """Stop with one sentence when a floating tensor of ``parts`` holds an ``inf`` or ``nan``.

        No model fits such data, and training would report it later as a non-finite loss.
        ``source`` says where the data come from (the settings or files to check).

        >>> from fedlightning.datamodules import DigitsDataModule
        >>> DigitsDataModule().refuse_nonfinite("data.x", training_targets=torch.tensor([0.5, float("inf")]))
        Traceback (most recent call last):
        ...
        ValueError: digits's training targets are not all finite (inf or nan), which no model can fit; check data.x.
        """
        for what, tensor in parts.items():
            if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum())):
                continue  # a finite sum has finite terms (one cheap reduction)
            if not bool(torch.isfinite(tensor).all()):  # the sum may overflow with finite terms: look at each
                raise ValueError(
                    f"{self.name}'s {what.replace('_', ' ')} are not all finite (inf or nan), which no model can "
                    f"fit; check {source}."
                )

    # -- per-client API -----------------------------------------------------------------

    @property
    def _parts(self) -> ClientPartition:
        """The clients' index arrays, packed (one flat array and offsets; no object per client)."""
        return self._partition

    @_parts.setter
    def _parts(self, parts: Sequence[np.ndarray]) -> None:
        self._partition = ClientPartition.from_parts(parts)
        self._client_sizes = None
        indices = self._partition.indices
        self._clients_are_slices = bool(np.array_equal(indices, np.arange(indices.size)))

    @property
    def client_sizes(self) -> list[int]:
        """Number of training samples of each client."""
        self._ensure_setup()
        if self._client_sizes is None:
            self._client_sizes = self._partition.sizes.tolist()
        return self._client_sizes

    @property
    def num_train_samples(self) -> int:
        """Training samples after the validation split (the union of all clients)."""
        return len(self._train_tensors()[1])

    def client_indices(self, cid: int) -> np.ndarray:
        """Indices of client ``cid``'s samples in the training set (a range once stored client by client)."""
        self._ensure_setup()
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} is out of range [0, {self.num_clients}).")
        return self._parts[cid]

    def train_tensors(self) -> tuple[Tensor, Tensor]:
        """Features and labels of every client's samples (stored client by client where :meth:`client_span` says)."""
        return self._train_tensors()

    def client_span(self, cid: int) -> tuple[int, int] | None:
        """Where client ``cid``'s samples lie in :meth:`train_tensors` (``None``: not one contiguous slice)."""
        self._ensure_setup()
        if not self._clients_are_slices:
            return None
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} is out of range [0, {self.num_clients}).")
        return int(self._parts.offsets[cid]), int(self._parts.offsets[cid + 1])

    def client_tensors(self, cid: int) -> tuple[Tensor, Tensor]:
        """Features and labels of client ``cid`` as contiguous tensors.

        Slices of the training set, which :meth:`setup` stores client by client (nothing per
        client is copied, so a federation of 100,000 clients holds its data once). A subclass
        whose own setup leaves a client's samples apart gets them gathered on every call.
        """
        x, y = self._train_tensors()
        if self._clients_are_slices:
            if not 0 <= cid < self.num_clients:
                raise IndexError(f"client id {cid} is out of range [0, {self.num_clients}).")
            start, stop = int(self._parts.offsets[cid]), int(self._parts.offsets[cid + 1])
            return x[start:stop], y[start:stop]
        index = torch.from_numpy(self.client_indices(cid).astype(np.int64))  # a copy: the partition is read-only
        return x.index_select(0, index), y.index_select(0, index)  # x[index], without advanced indexing's set-up

    def augment(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """Training-time augmentation of one client mini-batch (default: none).

        The engine calls this on every local batch with the client's own random stream, so
        augmentations stay reproducible; subclasses (e.g. CIFAR-10 crops and flips) override it.
        The default applies :meth:`transform` only (the identity unless a subclass stores
        compact data); an override must call :meth:`transform` itself.
        """
        return self.transform(x)

    def client_dataset(self, cid: int) -> TensorDataset:
        """Client ``cid``'s data as a ``TensorDataset``."""
        return TensorDataset(*self.client_tensors(cid))

    def client_dataloader(
        self,
        cid: int,
        *,
        batch_size: int | None = None,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
    ) -> DataLoader:
        """A loader over client ``cid``'s data.

        Args:
            cid: Client id in ``[0, num_clients)``.
            batch_size: Defaults to the module's ``batch_size``.
            shuffle: Reshuffle every epoch.
            generator: Drives the shuffle order, for per-client reproducibility.
        """
        return DataLoader(
            self.client_dataset(cid),
            batch_size=batch_size or self.batch_size,
            shuffle=shuffle,
            generator=generator,
            **self.loader_options(),
        )

    def loader_options(self) -> dict[str, Any]:
        """``num_workers``, ``pin_memory`` and ``persistent_workers``, as passed to every loader.

        For reusing the module's data with a ``DataLoader`` of one's own, e.g.
        ``DataLoader(dm.client_dataset(0), batch_size=64, **dm.loader_options())``.
        """
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }

    def label_histogram(self) -> np.ndarray:
        """``(num_clients, num_classes)`` count of each label on each client."""
        self._ensure_setup()
        return partition_summary(self._train_tensors()[1].numpy(), self._parts, self.num_classes)

    def write_client_summary(self, path: str | os.PathLike[str]) -> None:
        """Write one CSV row per client: its sample count and, for classification, label counts."""
        self._ensure_setup()
        sizes = self.client_sizes
        header = ["client", "samples"]
        rows: list[list[int]] = [[k, int(s)] for k, s in enumerate(sizes)]
        if self.task == "classification":
            header += [f"label_{c}" for c in range(self.num_classes)]
            for row, counts in zip(rows, self.label_histogram(), strict=True):
                row.extend(int(c) for c in counts)
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)

    # -- centralised loaders ------------------------------------------------------------

    def train_dataloader(self) -> DataLoader:
        """All clients' data together, shuffled, for centralised training.

        Batches go through :meth:`augment` (with a generator seeded from ``seed``) when a
        subclass defines augmentation or a ``transform``. With ``num_workers >= 1`` each
        worker augments with its own copy of that generator, so random augmentations (not the
        batches' samples or order) differ from a ``num_workers=0`` loader.
        """
        return DataLoader(
            TensorDataset(*self._train_tensors()),
            batch_size=self.batch_size,
            shuffle=True,
            collate_fn=_AugmentCollate(self) if self._has_batch_hooks() else None,
            **self.loader_options(),
        )

    def val_dataloader(
        self, *, rank: int = 0, world_size: int = 1, device: torch.device | str | None = None
    ) -> DataLoader:
        """The held-out validation set (the test set when ``val_fraction`` is 0).

        In slices of ``eval_batch_size`` (no per-sample fetching); with ``world_size`` > 1,
        only process ``rank``'s contiguous, unpadded shard (see
        :mod:`fedlightning.datamodules.tensor_loader`). With an accelerator ``device``, the
        shard is copied there once and served from that copy, ``transform`` included
        (:func:`~fedlightning.datamodules.tensor_loader.device_loader`; from the host as without
        it when the shard would take more than a quarter of the device's memory).
        """
        self._ensure_setup()
        data = self._val if self._val is not None else self._test
        return self._eval_loader(data, rank=rank, world_size=world_size, device=device)

    def test_dataloader(
        self, *, rank: int = 0, world_size: int = 1, device: torch.device | str | None = None
    ) -> DataLoader:
        """The test set (process ``rank``'s shard with ``world_size`` > 1, on ``device``, as :meth:`val_dataloader`)."""
        self._ensure_setup()
        return self._eval_loader(self._test, rank=rank, world_size=world_size, device=device)

    # -- saving and reloading a partition -----------------------------------------------

    def save_partition(self, path: str | os.PathLike[str]) -> None:
        """Write the hold-out and the clients to ``path`` (``.json``, else ``.npz``).

        All indices are the data set's own: positions in its full training split as loaded,
        before any ``max_train_samples`` subset and the validation hold-out (format version 2,
        described in docs/datamodules.md and :mod:`fedlightning.datamodules.partition_files`).
        Reload with ``partition_file=path``.
        """
        write_partition_file(Path(path), record=self._partition_record())

    def partition_record(self) -> dict[str, Any]:
        """What :meth:`save_partition` writes as JSON: the settings, ``validation`` and ``clients``."""
        return self._partition_record().to_json()

    def _partition_record(self) -> PartitionRecord:
        """This module's split as a partition file records it (sets the data module up first)."""
        self._ensure_setup()
        parts = self._parts
        return PartitionRecord(
            dataset=self.name,
            num_dataset_samples=self._num_dataset_samples,
            num_train_samples=self.num_train_samples,
            num_clients=self.num_clients,
            partition=self.partition_name,
            seed=self.seed,
            val_fraction=self.val_fraction,
            max_train_samples=self.max_train_samples,
            validation=np.sort(self.val_dataset_index),
            clients=sorted_clients(self.train_dataset_index[parts.indices], parts.offsets),
        )

    def labelled_split(self) -> tuple[np.ndarray, list[np.ndarray], str] | None:
        """The training labels, each client's indices into them and a title naming the split, for a figure.

        ``None`` for a regression data set (no labels to count); drawn by
        :func:`fedlightning.plotting.plot_client_labels`.
        """
        self._ensure_setup()
        if self.task != "classification":
            return None
        name = self.partition_name
        if self.partition_file:
            name = f"{name} from {Path(self.partition_file).name}"
        labels = self._train_tensors()[1].numpy()
        title = f"{self.name}, {name}: {self.num_clients} clients, {len(labels):,} training samples"
        return labels, list(self._parts), title

    @property
    def partition_name(self) -> str:
        """Short name of the partition: the partitioner's, or the saved one's with ``partition_file``."""
        if self.partition_file:
            return str(getattr(self, "_saved_partition_name", None) or "file")
        return str(getattr(self.partition, "name", type(self.partition).__name__))

    def _read_partition(self, path: Path) -> dict[str, Any]:
        """Read a saved partition checked against this module's settings (see :func:`read_partition_file`)."""
        raw = read_partition_file(
            path,
            dataset=self.name,
            num_clients=self.num_clients,
            val_fraction=self.val_fraction,
            max_train_samples=self.max_train_samples,
        )
        self._saved_partition_name = raw.get("partition")
        return raw

    def _rows_of_saved_split(
        self, saved: dict[str, Any], origin: np.ndarray, num_dataset: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows (of the loaded, subset data) of a version-2 file's validation and client samples."""
        rows = rows_of_saved_split(
            saved,
            origin=origin,
            num_dataset=num_dataset,
            seed=self.seed,
            dataset=self.name,
            data_depends_on_seed=self.data_depends_on_seed,
        )
        path = saved["path"]
        if saved.get("seed") != self.seed:
            log.info(
                "%s: clients and hold-out from %s (saved with seed=%s); seed=%s seeds everything else.",
                self.name,
                path,
                saved.get("seed"),
                self.seed,
            )
        log.info("Loaded partition of %d clients from %s", len(saved["clients"]), path)
        return rows

    def _check_v1_partition(self, saved: dict[str, Any], num_train: int) -> list[np.ndarray]:
        """A version-1 file indexes the post-hold-out training set: all its settings must match."""
        parts = check_v1_partition(saved, num_train_samples=num_train, seed=self.seed, val_fraction=self.val_fraction)
        log.info("Loaded partition of %d clients from %s (format version 1)", len(parts), saved["path"])
        return parts

    # -- internals ----------------------------------------------------------------------

    def _ensure_setup(self) -> None:
        if self._train is None:
            self.setup("fit")

    def _train_tensors(self) -> tuple[Tensor, Tensor]:
        self._ensure_setup()
        assert self._train is not None
        return self._train

    def _eval_loader(
        self, data: tuple[Tensor, Tensor] | None, *, rank: int, world_size: int, device: torch.device | str | None
    ) -> DataLoader:
        assert data is not None
        transform = self.transform if self._has_batch_hooks() else None
        size, shard = self.eval_batch_size, {"rank": rank, "world_size": world_size}
        place = None if device is None else torch.device(device)
        if place is not None and place.type != "cpu":
            loader = device_loader(data, device=place, batch_size=size, transform=transform, **shard)
            if loader is not None:
                return loader
        return tensor_loader(data, batch_size=size, transform=transform, **shard, **self.loader_options())

    def _has_batch_hooks(self) -> bool:
        cls = type(self)
        return cls.transform is not FederatedDataModule.transform or cls.augment is not FederatedDataModule.augment

    def _cast(self, x: Tensor) -> Tensor:
        return x if self.feature_dtype is None else x.to(self.feature_dtype)

    def _add_notice(self, text: str) -> None:
        self.notice = f"{self.notice}; {text}" if self.notice else text

    def _natural_groups(self, n: int) -> np.ndarray:
        groups = self.natural_groups()
        if groups is None:
            raise ValueError(
                f"partition=natural needs a data set with natural clients (shakespeare roles, femnist writers); "
                f"data={self.name} has none: choose partition=iid, dirichlet, shards or quantity_skew."
            )
        groups = np.asarray(groups).reshape(-1)
        if groups.size != n:
            raise ValueError(f"{self.name}.natural_groups() gave {groups.size} group ids for {n} training samples.")
        return groups

    def _check_partition(self, n: int) -> None:
        if len(self._parts) != self.num_clients:
            raise ValueError(f"The partitioner returned {len(self._parts)} clients, expected {self.num_clients}.")
        idx = self._parts.indices
        if (
            idx.size != n
            or (n and (idx.min() < 0 or idx.max() >= n))
            or np.bincount(idx, minlength=n).max(initial=1) != 1
        ):
            raise ValueError(f"The partition does not assign each of the {n} training samples exactly once.")

    def _log_summary(self) -> None:
        sizes = np.asarray(self.client_sizes)
        val = len(self._val[1]) if self._val is not None else 0
        name = getattr(self.partition, "name", type(self.partition).__name__)
        if self.partition_file:
            name = f"file {self.partition_file}"
        log.info(
            "%s: %d train / %d val / %d test samples, %d clients (%s); client size min %d, median %g, max %d",
            self.name,
            self.num_train_samples,
            val,
            len(self._test[1]) if self._test is not None else 0,
            self.num_clients,
            name,
            sizes.min(),
            np.median(sizes),
            sizes.max(),
        )
        if val == 0:
            log.info("%s: data.val_fraction=0, so validation uses the test set.", self.name)
        if self.task == "classification" and (log.isEnabledFor(logging.DEBUG) or self.num_clients <= 20):
            hist = self.label_histogram()
            lines = [f"client samples | label histogram ({self.num_classes} classes)"]
            lines += [
                f"{k:6d} {s:7d} | {' '.join(map(str, h))}" for k, (s, h) in enumerate(zip(sizes, hist, strict=True))
            ]
            # The full table at INFO for small federations, at DEBUG otherwise (it can be long).
            level = logging.INFO if self.num_clients <= 20 else logging.DEBUG
            log.log(level, "%s partition:\n%s", self.name, "\n".join(lines))


def _check_partition_choice(partition: Partitioner | None, partition_file: str | None) -> None:
    """Refuse a drawn partition together with ``partition_file`` (both would choose the clients)."""
    if partition_file and partition is not None and not isinstance(partition, FilePartition):
        name = getattr(partition, "name", type(partition).__name__)
        raise ValueError(
            f"data.partition_file={partition_file} and partition={name} both choose the clients; set "
            "partition=file to reuse the saved clients, or unset data.partition_file to draw a new split."
        )
    if partition is not None and not isinstance(partition, FilePartition):
        try:
            params = inspect.signature(partition).parameters.values()
        except (TypeError, ValueError):  # no introspectable signature: trust it
            params = None
        if params is not None and not any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params):
            raise TypeError(
                f"partition={partition!r} must be called as partition(labels, num_clients, *, seed), the "
                "signature of every fedlightning partitioner; wrap a (labels, num_clients, rng) function in one."
            )
    if isinstance(partition, FilePartition) and not partition_file:
        raise ValueError(
            "partition=file reuses the clients saved in data.partition_file, which is not set; "
            "set data.partition_file=<run folder>/partition.json or choose another partition."
        )


class _AugmentCollate:
    """Collate and ``augment`` a centralised training batch with a seeded generator."""

    def __init__(self, dm: FederatedDataModule) -> None:
        self.dm = dm
        self.generator = torch.Generator().manual_seed(int(dm.seed) + 7919)

    def __call__(self, batch: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
        x, y = default_collate(batch)
        return [self.dm.augment(x, self.generator), y]
