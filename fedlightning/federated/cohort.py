"""The clients of one round, with the probabilities they were drawn with."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def deal_by_load(loads: Sequence[float], parts: int) -> list[int]:
    """The part (process) of each item, dealt longest first to the least-loaded part.

    Graham's longest-processing-time rule: items in decreasing load (ties in listed order), each
    to the part with the least load so far (ties to the lowest part). Its largest part is at
    most 4/3 of the best possible; with equal loads it deals them round robin.

    >>> deal_by_load([60, 60, 60, 60, 60], 2)
    [0, 1, 0, 1, 0]
    >>> deal_by_load([5, 3, 3, 2, 2, 1], 2)  # parts of load 8 each
    [0, 1, 1, 0, 1, 0]
    """
    if parts < 1:
        raise ValueError(f"Cannot deal into {parts} parts.")
    order = sorted(range(len(loads)), key=lambda i: -loads[i])  # stable: ties keep their order
    heap = [(0.0, part) for part in range(parts)]
    assigned = [0] * len(loads)
    for i in order:
        load, part = heapq.heappop(heap)
        assigned[i] = part
        heapq.heappush(heap, (load + float(loads[i]), part))
    return assigned


@dataclass(frozen=True)
class Cohort:
    """Clients taking part in round ``round_idx``.

    Attributes:
        round_idx: the round (0-based; equals ``trainer.global_step`` during the round).
        client_ids: participating clients, in the order they are trained.
        inclusion_probabilities: P(client i in cohort) for each listed client, for unbiased
            partial-participation estimators (all ones under full participation).
    """

    round_idx: int
    client_ids: tuple[int, ...]
    inclusion_probabilities: Tensor

    def __post_init__(self) -> None:
        if len(set(self.client_ids)) != len(self.client_ids):
            raise ValueError(f"Cohort of round {self.round_idx + 1} lists a client twice: {self.client_ids}.")
        if self.inclusion_probabilities.shape != (len(self.client_ids),):
            raise ValueError("Cohort needs one inclusion probability per client.")

    @classmethod
    def full(cls, *, round_idx: int, num_clients: int) -> Cohort:
        """Every client, each with probability one."""
        return cls(
            round_idx=round_idx, client_ids=tuple(range(num_clients)), inclusion_probabilities=torch.ones(num_clients)
        )

    def __len__(self) -> int:
        return len(self.client_ids)
