"""Local mini-batch schedules drawn from a client's own random stream.

>>> import torch
>>> gen = torch.Generator().manual_seed(0)
>>> [len(b) for b in local_batches(num_samples=10, batch_size=4, epochs=1, steps=None, generator=gen)]
[4, 4, 2]
>>> [len(b) for b in local_batches(num_samples=10, batch_size=4, epochs=1, steps=5, generator=gen)]
[4, 4, 2, 4, 4]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor


def local_batches(
    *, num_samples: int, batch_size: int, epochs: int, steps: int | None, generator: torch.Generator
) -> Iterator[Tensor]:
    """Index batches over ``num_samples`` items.

    With ``steps=None``: ``epochs`` passes, each over a fresh permutation, the last batch of a
    pass possibly short. With ``steps=k``: exactly ``k`` batches, passing over fresh
    permutations as often as needed (``epochs`` is then ignored).
    """
    if num_samples <= 0:
        return
    emitted = 0
    passes = 0
    while True:
        if steps is None and passes == epochs:
            return
        perm = torch.randperm(num_samples, generator=generator)
        passes += 1
        for start in range(0, num_samples, batch_size):
            if steps is not None and emitted == steps:
                return
            yield perm[start : start + batch_size]
            emitted += 1


def gathered_batches(
    x: Tensor, y: Tensor, batches: Iterable[Tensor], *, rows: int = 256
) -> Iterator[tuple[Tensor, Tensor]]:
    """``(x[idx], y[idx])`` for each ``idx`` of ``batches``, gathered a block at a time.

    Each block of consecutive batches holding at least ``rows`` indices is gathered with one
    ``index_select`` per tensor and handed out as views, instead of one indexing per batch.
    The values are those of ``x[idx]``. Index batches drawn on the CPU (the client's stream is
    a CPU generator) are moved to the data's device once per block.

    >>> x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    >>> [b.tolist() for _, b in gathered_batches(x, y, [torch.tensor([4, 0]), torch.tensor([2])], rows=2)]
    [[4, 0], [2]]
    """
    it = iter(batches)
    while True:
        block: list[Tensor] = []
        taken = 0
        for idx in it:
            block.append(idx)
            taken += len(idx)
            if taken >= rows:
                break
        if not block:
            return
        index = (block[0] if len(block) == 1 else torch.cat(block)).to(x.device, non_blocking=True)
        sizes = [len(idx) for idx in block]
        yield from zip(x.index_select(0, index).split(sizes), y.index_select(0, index).split(sizes), strict=True)
