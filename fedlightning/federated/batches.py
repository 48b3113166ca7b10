"""Local mini-batch schedules drawn from a client's own random stream.

>>> import torch
>>> gen = torch.Generator().manual_seed(0)
>>> [len(b) for b in local_batches(num_samples=10, batch_size=4, epochs=1, steps=None, generator=gen)]
[4, 4, 2]
>>> [len(b) for b in local_batches(num_samples=10, batch_size=4, epochs=1, steps=5, generator=gen)]
[4, 4, 2, 4, 4]
"""

from __future__ import annotations

from collections.abc import Iterator

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
