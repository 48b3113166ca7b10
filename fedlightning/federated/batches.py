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
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Schedule:
    """One client's mini-batches: every index in order (a tensor), and each batch's size (integers).

    >>> s = Schedule.of([torch.tensor([2, 0]), torch.tensor([1])])
    >>> s.index.tolist(), s.batch_sizes, [b.tolist() for b in s.batches()]
    ([2, 0, 1], (2, 1), [[2, 0], [1]])
    """

    index: Tensor
    batch_sizes: tuple[int, ...]

    @classmethod
    def of(cls, batches: Iterable[Tensor]) -> Schedule:
        """The schedule of a sequence of index batches."""
        parts = list(batches)
        if not parts:
            return cls(index=torch.zeros(0, dtype=torch.long), batch_sizes=())
        return cls(index=torch.cat(parts).long(), batch_sizes=tuple(len(b) for b in parts))

    @property
    def steps(self) -> int:
        """The number of batches."""
        return len(self.batch_sizes)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> Tensor:
        """The indices of batch ``step``."""
        start = sum(self.batch_sizes[:step])
        return self.index[start : start + self.batch_sizes[step]]

    def cut(self, steps: int) -> Schedule:
        """The first ``steps`` batches."""
        if steps >= self.steps:
            return self
        kept = self.batch_sizes[: max(steps, 0)]
        return Schedule(index=self.index[: sum(kept)], batch_sizes=kept)

    def batches(self) -> list[Tensor]:
        """The index batches, as views of :attr:`index`."""
        return list(self.index.split(list(self.batch_sizes)))


def batch_schedule(
    *, num_samples: int, batch_size: int, epochs: int, steps: int | None, generator: torch.Generator
) -> Schedule:
    """The :class:`Schedule` of :func:`local_batches`, built from its permutations without a loop over batches.

    >>> gen = torch.Generator().manual_seed(0)
    >>> batch_schedule(num_samples=5, batch_size=2, epochs=1, steps=4, generator=gen).batch_sizes
    (2, 2, 1, 2)
    """
    if num_samples <= 0 or (steps is not None and steps <= 0) or (steps is None and epochs <= 0):
        return Schedule.of([])
    per_pass = -(-num_samples // batch_size)
    passes = epochs if steps is None else -(-steps // per_pass)
    perms = [torch.randperm(num_samples, generator=generator) for _ in range(passes)]
    index = perms[0] if passes == 1 else torch.cat(perms)
    # the sizes as Python integers: a schedule is built for every client of every round, where
    # each small tensor operation would cost more than the draw itself
    sizes = ((batch_size,) * (per_pass - 1) + (num_samples - batch_size * (per_pass - 1),)) * passes
    if steps is not None:
        sizes = sizes[:steps]
        index = index[: sum(sizes)]
    return Schedule(index=index, batch_sizes=sizes)


def local_batches(
    *, num_samples: int, batch_size: int, epochs: int, steps: int | None, generator: torch.Generator
) -> Iterator[Tensor]:
    """Index batches over ``num_samples`` items.

    With ``steps=None``: ``epochs`` passes, each over a fresh permutation, the last batch of a
    pass possibly short. With ``steps=k``: exactly ``k`` batches, passing over fresh
    permutations as often as needed (``epochs`` is then ignored). The batches of
    :func:`batch_schedule` from the same stream.
    """
    schedule = batch_schedule(
        num_samples=num_samples, batch_size=batch_size, epochs=epochs, steps=steps, generator=generator
    )
    yield from schedule.batches()


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
