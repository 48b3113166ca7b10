"""Evaluation loaders over tensors held in memory: one slice per batch, no per-sample work.

A ``DataLoader`` over a plain ``TensorDataset`` fetches every sample with
``Dataset.__getitem__`` and stacks them again in ``default_collate``. Here the batch sampler
yields ``slice`` objects and the dataset answers a whole slice at once (``__getitems__``, the
hook ``DataLoader`` calls for batched fetching), so a batch is a view of the stored tensors.
The loader is still a ``DataLoader`` (workers, pinned memory, ``.dataset.tensors`` all work).

:func:`shard_bounds` splits a held-out set into contiguous, unpadded parts, one per process:
each process evaluates its part and the metric sums are all-reduced, which gives exactly the
one-process value (a ``DistributedSampler`` would pad with repeated samples).

:func:`device_loader` serves a process's shard from a copy on an accelerator, made once, so an
evaluation pass moves no batch from the host (:func:`may_reside_on` bounds what is kept there).

>>> shard_bounds(10, rank=0, world_size=3), shard_bounds(10, rank=2, world_size=3)
((0, 4), (7, 10))
>>> [(s.start, s.stop) for s in SliceBatches(start=2, stop=9, batch_size=3)]
[(2, 5), (5, 8), (8, 9)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler, TensorDataset

__all__ = ["SliceBatches", "SlicedTensorDataset", "device_loader", "may_reside_on", "shard_bounds", "tensor_loader"]


def shard_bounds(n: int, *, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of process ``rank``'s contiguous part of ``n`` items (sizes differ by at most one)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} processes.")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class SliceBatches(Sampler[slice]):
    """Consecutive ``slice`` batches of ``batch_size`` over ``[start, stop)`` (the last may be short)."""

    def __init__(self, *, start: int, stop: int, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (got {batch_size}).")
        self.start, self.stop, self.batch_size = int(start), int(stop), int(batch_size)

    def __iter__(self) -> Iterator[slice]:  # type: ignore[override]
        for begin in range(self.start, self.stop, self.batch_size):
            yield slice(begin, min(begin + self.batch_size, self.stop))

    def __len__(self) -> int:
        return max(0, -(-(self.stop - self.start) // self.batch_size))


class SlicedTensorDataset(TensorDataset):
    """A ``TensorDataset`` that also answers a whole ``slice`` at once (views, no copies)."""

    def __getitems__(self, index: slice | Sequence[int]) -> list[Tensor]:
        return [t[index] for t in self.tensors]


class _Batch:
    """Collate of an already batched fetch: the tensors as they are, ``transform`` applied to the features."""

    def __init__(self, transform: Callable[[Tensor], Tensor] | None) -> None:
        self.transform = transform

    def __call__(self, batch: list[Tensor]) -> list[Tensor]:
        if self.transform is None:
            return list(batch)
        x, *rest = batch
        return [self.transform(x), *rest]


def tensor_loader(
    tensors: tuple[Tensor, ...],
    *,
    batch_size: int,
    transform: Callable[[Tensor], Tensor] | None = None,
    rank: int = 0,
    world_size: int = 1,
    **options: Any,
) -> DataLoader:
    """A loader over ``tensors`` in ``batch_size`` slices, limited to process ``rank``'s shard.

    Args:
        tensors: features first, then targets (equal first dimensions).
        batch_size: samples per batch.
        transform: applied to each feature batch (e.g. decoding stored ``uint8`` images).
        rank: this process's index; with ``world_size`` it selects the shard (:func:`shard_bounds`).
        world_size: number of processes that share the evaluation.
        options: ``num_workers``, ``pin_memory``, ``persistent_workers`` for the ``DataLoader``.
    """
    dataset = SlicedTensorDataset(*tensors)
    start, stop = shard_bounds(len(dataset), rank=rank, world_size=world_size)
    return DataLoader(
        dataset,
        batch_sampler=SliceBatches(start=start, stop=stop, batch_size=batch_size),  # type: ignore[arg-type]  # slices
        collate_fn=_Batch(transform),
        **options,
    )


def may_reside_on(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` of data may stay on ``device`` for a run: at most a quarter of a CUDA device's memory.

    Any amount elsewhere (the host's memory, or an accelerator that reports no capacity).

    >>> may_reside_on(torch.device("cpu"), 10**12)
    True
    """
    return device.type != "cuda" or nbytes <= torch.cuda.get_device_properties(device).total_memory // 4


def device_loader(
    tensors: tuple[Tensor, ...],
    *,
    device: torch.device,
    batch_size: int,
    transform: Callable[[Tensor], Tensor] | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader | None:
    """:func:`tensor_loader` over process ``rank``'s shard of ``tensors``, copied to ``device`` once.

    Its batches are slices of that copy and ``transform`` runs where they are, so iterating it
    moves nothing between host and device; it has no workers and pins nothing. Its dataset is
    the shard alone. ``None`` where the shard may not stay on ``device`` (:func:`may_reside_on`).

    >>> x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    >>> loader = device_loader((x, y), device=torch.device("meta"), batch_size=2, rank=1, world_size=2)
    >>> [tuple(b.shape) for b, _ in loader], next(iter(loader))[0].device.type
    ([(2, 2)], 'meta')
    """
    start, stop = shard_bounds(len(tensors[0]), rank=rank, world_size=world_size)
    shard = tuple(t[start:stop] for t in tensors)
    if not may_reside_on(device, sum(t.numel() * t.element_size() for t in shard)):
        return None
    return tensor_loader(tuple(t.to(device) for t in shard), batch_size=batch_size, transform=transform)
