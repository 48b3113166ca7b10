"""A client's batches as tensors: the schedule and the share's padded plan equal the batch-by-batch construction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fedlightning.federated.batches import Schedule, batch_schedule, local_batches
from fedlightning.federated.local.vectorised import plan_steps


def _lazy_batches(num_samples: int, batch_size: int, epochs: int, steps: int | None, gen: torch.Generator) -> Iterator:
    """Reference: one permutation per pass, drawn as the batches are consumed."""
    emitted = passes = 0
    while num_samples > 0:
        if steps is None and passes == epochs:
            return
        perm = torch.randperm(num_samples, generator=gen)
        passes += 1
        for start in range(0, num_samples, batch_size):
            if steps is not None and emitted == steps:
                return
            yield perm[start : start + batch_size]
            emitted += 1


@pytest.mark.parametrize(
    ("num_samples", "batch_size", "epochs", "steps"),
    [(10, 4, 1, None), (10, 4, 3, None), (12, 4, 2, None), (10, 4, 1, 5), (12, 4, 1, 3), (12, 4, 1, 6),
     (1, 32, 2, None), (5, 32, 1, 7), (0, 4, 1, None), (0, 4, 1, 3), (60, 10, 1, 0)],
)  # fmt: skip
def test_batch_schedule_draws_the_batches_of_one_permutation_per_pass(
    num_samples: int, batch_size: int, epochs: int, steps: int | None
) -> None:
    reference = list(_lazy_batches(num_samples, batch_size, epochs, steps, torch.Generator().manual_seed(7)))
    gen = torch.Generator().manual_seed(7)
    schedule = batch_schedule(num_samples=num_samples, batch_size=batch_size, epochs=epochs, steps=steps, generator=gen)
    assert schedule.steps == len(reference)
    assert [b.tolist() for b in schedule.batches()] == [b.tolist() for b in reference]
    gen = torch.Generator().manual_seed(7)
    lazy = local_batches(num_samples=num_samples, batch_size=batch_size, epochs=epochs, steps=steps, generator=gen)
    assert [b.tolist() for b in lazy] == [b.tolist() for b in reference]
    assert [schedule[s].tolist() for s in range(schedule.steps)] == [b.tolist() for b in reference]


def test_cut_keeps_the_first_batches() -> None:
    schedule = Schedule.of([torch.tensor([3, 1]), torch.tensor([0, 2]), torch.tensor([4])])
    cut = schedule.cut(2)
    assert cut.index.tolist() == [3, 1, 0, 2] and cut.batch_sizes == (2, 2)
    assert schedule.cut(5) is schedule


def _reference_plan(schedules: list[list[torch.Tensor]], offsets: list[int], batch_size: int) -> tuple:
    steps = max((len(b) for b in schedules), default=0)
    index = torch.zeros(len(schedules), steps, batch_size, dtype=torch.long)
    mask = torch.zeros(len(schedules), steps, batch_size, dtype=torch.bool)
    for c, (batches, offset) in enumerate(zip(schedules, offsets, strict=True)):
        for s, idx in enumerate(batches):
            index[c, s, : len(idx)] = idx + offset
            mask[c, s, : len(idx)] = True
    return index, mask


def test_plan_steps_pads_every_client_as_the_batch_by_batch_construction() -> None:
    gen = torch.Generator().manual_seed(3)
    sizes = [7, 0, 23, 1, 16]  # an empty client, a one-sample client, unequal step counts
    schedules = [list(local_batches(num_samples=n, batch_size=4, epochs=2, steps=None, generator=gen)) for n in sizes]
    offsets = [0, 7, 7, 30, 31]
    plan = plan_steps(schedules, offsets, 4)
    index, mask = _reference_plan(schedules, offsets, 4)
    assert torch.equal(plan.index, index) and torch.equal(plan.mask, mask)
    assert plan.steps.tolist() == [4, 0, 12, 2, 8]
    assert torch.equal(plan.active, mask.any(dim=2))
    as_schedules = plan_steps([Schedule.of(b) for b in schedules], offsets, 4)
    assert torch.equal(as_schedules.index, index) and torch.equal(as_schedules.mask, mask)
