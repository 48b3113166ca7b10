"""The clients of one round, with the probabilities they were drawn with."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
            raise ValueError(f"Cohort of round {self.round_idx} lists a client twice: {self.client_ids}.")
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
