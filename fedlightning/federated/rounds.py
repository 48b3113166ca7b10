"""One round's bookkeeping: what its phases hand each other, the layout of its statistics, and
the round in progress as methods, callbacks and local-work backends see it (:class:`RoundContext`).

Lightning's training loop ticks once per federated round, through :class:`Rounds` (one item
per round); the round itself is :meth:`~fedlightning.federated.module.FederatedModule.training_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor
from torch.utils.data import Dataset

from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.distribution import ProcessShare
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.local.base import overrides

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

# The round's statistics (float64, reduced across processes in one collective): loss sum and count
# of the clients that trained and were not quarantined, quarantined clients, the sum and count of
# first-step losses (the loss at the start, measured once), then the client metric sums.
LOSS, TRAINED, QUARANTINED, START_SUM, START_COUNT, METRICS = range(6)


@dataclass
class RoundState:
    """What the phases of one round hand each other."""

    round_idx: int
    callbacks: list[FederatedCallback]
    cohort: Cohort = field(init=False)
    sampler: ClientSampler | None = None
    choose_later: bool = False
    probability: dict[int, float] = field(default_factory=dict)
    received_broadcast: Tensor = field(init=False)
    attempt: int = 0
    aggregator: Aggregator = field(init=False)
    stats: Tensor = field(init=False)  # see LOSS ... METRICS
    quarantined: list[int] = field(default_factory=list)  # this process's quarantined clients
    _hooked: dict[str, list[FederatedCallback]] = field(default_factory=dict, init=False, repr=False)

    def hooked(self, hook: str) -> list[FederatedCallback]:
        """The round's callbacks that define ``hook`` themselves: the others answer with the default, a no-op.

        Asked once per client (e.g. ``drops_upload``), so the default answers are skipped, not called.
        """
        found = self._hooked.get(hook)
        if found is None:
            found = self._hooked[hook] = [cb for cb in self.callbacks if overrides(type(cb), FederatedCallback, hook)]
        return found


class Rounds(Dataset[int]):
    """One item per round: Lightning's training loop ticks once per federated round."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __len__(self) -> int:
        return self.rounds

    def __getitem__(self, index: int) -> int:
        return index


class RoundContext(ProcessShare):
    """The round in progress, as methods, callbacks and backends ask for it (a mixin of the engine).

    What it reads is set by the round's phases in
    :meth:`~fedlightning.federated.module.FederatedModule.training_step`.
    """

    client_optimizer: Callable[..., torch.optim.Optimizer]
    _round_optimizer: Callable[..., torch.optim.Optimizer] | None  # client_optimizer, resolved for the round
    _round_cohort: Cohort | None
    _phase_probability: dict[int, float]
    _budget_callbacks: list[FederatedCallback]

    def federated_callbacks(self) -> Iterator[FederatedCallback]:
        """The trainer's callbacks that take part in rounds (empty outside a trainer)."""
        trainer = self.attached_trainer
        for cb in trainer.callbacks if trainer is not None else ():  # type: ignore[attr-defined]
            if isinstance(cb, FederatedCallback):
                yield cb

    def client_sampler(self) -> ClientSampler | None:
        """The one active client sampler, if any."""
        samplers = [cb for cb in self.federated_callbacks() if isinstance(cb, ClientSampler)]
        if len(samplers) > 1:
            raise ConfigError(
                f"Only one client sampler may be active, found {len(samplers)}; keep a single sampler=... choice."
            )
        return samplers[0] if samplers else None

    @property
    def round_client_optimizer(self) -> Callable[..., torch.optim.Optimizer]:
        """The client optimiser factory of the round in progress (resolved once per round), else the configured one."""
        return self._round_optimizer or self.client_optimizer

    @property
    def cuts_local_steps(self) -> bool:
        """Whether a callback may cut clients' local steps this round (:meth:`local_step_budget`)."""
        return bool(self._budget_callbacks)

    def local_step_budget(self, *, client_id: int, round_idx: int, planned: int) -> int:
        """How many of its ``planned`` local steps this client takes: the smallest callback budget."""
        module = cast("FederatedModule", self)
        budgets = [
            cb.local_step_budget(self.trainer, module, round_idx, client_id, planned) for cb in self._budget_callbacks
        ]
        return min([planned, *(b for b in budgets if b is not None)])

    @property
    def round_cohort(self) -> Cohort:
        """The cohort of the round in progress (for methods whose local work depends on it)."""
        if self._round_cohort is None:
            raise RuntimeError("No round is in progress: the cohort is known only inside training_step.")
        return self._round_cohort

    def inclusion_probability(self, client_id: int) -> float:
        """P(``client_id`` takes part in the current phase of this round).

        Its probability of being drawn into the cohort, until its upload, where it becomes the
        probability of uploading (drawn and, under a choosing sampler, chosen).
        """
        return self._phase_probability[client_id]
