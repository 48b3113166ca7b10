"""Processes (Lightning DDP): which process trains which client, and the engine's collectives.

Client ``i`` is trained by process ``i mod world_size``, so its per-client state stays on one
process and checkpoints gather every process's client state. A method with
``stateless_clients`` and no error-feedback memory instead has each round's cohort dealt to the
processes by load (:func:`~fedlightning.federated.cohort.deal_by_load`), so no process waits
for a larger share. The collectives are bare: :meth:`ProcessShare.reduce_sum` is one all-reduce
without a barrier before it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import lightning as L
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DistributedSampler

from fedlightning.errors import ConfigError
from fedlightning.federated.channel import Channel
from fedlightning.federated.cohort import Cohort, deal_by_load
from fedlightning.federated.rng import SERVER
from fedlightning.federated.state import ClientStateStore

if TYPE_CHECKING:
    from fedlightning.datamodules.base import FederatedDataModule


class ProcessShare(L.LightningModule):
    """The processes' side of :class:`~fedlightning.federated.module.FederatedModule` (a mixin)."""

    # Set by FederatedModule.
    stateless_clients: ClassVar[bool]
    uplink_channel: Channel
    client_state: ClientStateStore
    local_steps: int | None
    local_epochs: int
    batch_size: int

    if TYPE_CHECKING:

        @property
        def datamodule(self) -> FederatedDataModule: ...

    @property
    def attached_trainer(self) -> L.Trainer | None:
        """The trainer this module is attached to, or ``None``."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    @property
    def world_size(self) -> int:
        """Processes that share the cohort (1 outside a distributed trainer)."""
        trainer = self.attached_trainer
        return int(trainer.world_size) if trainer is not None else 1

    @property
    def process_rank(self) -> int:
        """This process's index among :attr:`world_size`."""
        trainer = self.attached_trainer
        return int(trainer.global_rank) if trainer is not None else 0

    def _check_process_group(self) -> None:
        """Stop before training when several processes lack torch.distributed (the engine's collectives)."""
        if self.world_size > 1 and not dist.is_initialized():  # reduce_sum and the metrics use its collectives
            raise ConfigError(
                f"{self.world_size} processes share the cohort but torch.distributed is not initialised "
                f"({type(self.trainer.strategy).__name__}); use trainer=ddp."
            )

    def _check_no_distributed_sampler(self) -> None:
        """Stop when Lightning put a distributed sampler on the rounds' loader.

        It would hand each process a part of the rounds and pad the held-out sets with repeats;
        the engine shards the cohort and the held-out sets itself.
        """
        loader = self.trainer.train_dataloader
        if self.world_size > 1 and isinstance(getattr(loader, "sampler", None), DistributedSampler):
            raise ConfigError(
                "Several processes need Trainer(use_distributed_sampler=False) "
                "(trainer.use_distributed_sampler=false): the engine shards each round's cohort itself."
            )

    def holds_client(self, client_id: int) -> bool:
        """Whether ``client_id``'s state lives on this process (client i on process i mod world size)."""
        return client_id % self.world_size == self.process_rank

    @property
    def deals_cohort(self) -> bool:
        """Whether the cohort is dealt to the processes by load, not by client id.

        Only for :attr:`stateless_clients` methods without error-feedback memory and with more
        than one process; the client-state store then refuses per-client entries.
        """
        return self.world_size > 1 and self.stateless_clients and not self.uplink_channel.error_feedback

    def _set_client_state_refusal(self) -> None:
        """While the cohort is dealt by load, the client-state store refuses per-client entries."""
        self.client_state.refusal = (
            f"{type(self).__name__} declares stateless_clients, so its cohort is dealt to the processes by "
            "load; set stateless_clients = False on a method that keeps per-client state"
            if self.deals_cohort
            else None
        )

    def cohort_loads(self, cohort: Cohort) -> list[float]:
        """The local steps each cohort member takes in its round, in cohort order (what :meth:`share_of` balances).

        The default counts ``local_steps``, else ``local_epochs`` passes in batches of ``batch_size``;
        a method whose local work differs per client or round overrides it.
        """
        if self.local_steps is not None:
            return [float(self.local_steps)] * len(cohort.client_ids)
        sizes = self.datamodule.client_sizes
        return [float(math.ceil(sizes[cid] / self.batch_size) * self.local_epochs) for cid in cohort.client_ids]

    def share_of(self, cohort: Cohort) -> list[int]:
        """The cohort members this process trains, in cohort order."""
        if not self.deals_cohort:
            return [cid for cid in cohort.client_ids if self.holds_client(cid)]
        parts = deal_by_load(self.cohort_loads(cohort), self.world_size)
        return [cid for cid, part in zip(cohort.client_ids, parts, strict=True) if part == self.process_rank]

    def reduce_sum(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over the processes (itself with one process), on ``tensor``'s device.

        The collective runs on this module's device (NCCL reduces only GPU tensors). It is one
        all-reduce, without the barrier that Lightning's ``strategy.reduce`` puts before it (an
        all-reduce waits for every process anyway); ``tensor`` itself is left as it was.
        """
        if self.world_size == 1:
            return tensor
        reduced = tensor.to(self.device, copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        return reduced.to(tensor.device)

    def _gather_ids(self, ids: list[int]) -> list[int]:
        """``ids`` of every process (a collective: call it on every process or on none)."""
        parts = self._gather_objects(list(ids))
        return list(ids) if parts is None else [cid for part in parts for cid in part]

    def _gather_objects(self, obj: Any) -> list[Any] | None:
        """``obj`` of every process, by rank (a collective), or ``None`` without a process group."""
        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts

    def _gathered_client_state(self) -> dict[int, dict[str, Any]]:
        """Every process's clients' state, each from the process that holds it: what a checkpoint saves."""
        state = self.client_state.state_dict()
        parts = self._gather_objects(state)
        if parts is None:
            return state
        return {
            cid: entries
            for rank, part in enumerate(parts)
            for cid, entries in part.items()
            if cid == SERVER or cid % self.world_size == rank
        }

    def _retain_own_client_state(self) -> None:
        """Keep only this process's clients' state (and the server's replicated entries), after a load."""
        self.client_state.retain(lambda cid: cid == SERVER or self.holds_client(cid))
