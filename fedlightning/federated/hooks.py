"""The ``FederatedCallback`` protocol: what a callback sees of a round.

A federated round calls these hooks, in this order, on every callback that subclasses
:class:`FederatedCallback` (other Lightning callbacks are untouched):

1. ``on_round_start(trainer, module, round_idx)``
2. ``select_cohort(trainer, module, round_idx)`` on the one :class:`ClientSampler`, if any
   (otherwise all clients take part), then ``on_cohort_selected(trainer, module, cohort)``
3. ``encode_downlink(trainer, module, round_idx, state)``: the first callback that returns a
   :class:`Message` encodes the broadcast; otherwise the method's ``downlink_codec`` does. Then
   ``on_server_broadcast(trainer, module, round_idx, message, cohort)``: the message reaches
   every client of the cohort.
4. For each client: local training, then ``encode_uplink(trainer, module, round_idx,
   client_id, upload)`` (first non-``None`` wins, else the method's ``uplink_codec``), then
   ``on_client_upload(trainer, module, round_idx, client_id, message)``.
5. ``on_aggregate(trainer, module, round_idx, pseudo_gradient)`` after the server has
   combined the decoded uploads, before its optimiser step.
6. ``on_round_end(trainer, module, round_idx, metrics)`` after the server step; callbacks may
   ``module.log`` here (it runs inside ``training_step``).

Encoding hooks own the wire format and may keep per-client memory in
``module.client_state`` (error feedback); observation hooks must not change the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
from torch import Tensor

from fedlightning.federated.cohort import Cohort
from fedlightning.federated.message import Message

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule


class FederatedCallback(L.Callback):
    """A Lightning callback that also takes part in federated rounds (all hooks optional)."""

    def on_round_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> None:
        """A round begins; ``round_idx == trainer.global_step``."""

    def on_cohort_selected(self, trainer: L.Trainer, module: FederatedModule, cohort: Cohort) -> None:
        """The cohort of this round is known."""

    def encode_downlink(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, state: Tensor
    ) -> Message | None:
        """Return a message to replace the method's default encoding of the broadcast."""
        return None

    def on_server_broadcast(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, message: Message, cohort: Cohort
    ) -> None:
        """``message`` is sent to every client of ``cohort``."""

    def encode_uplink(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, upload: Tensor
    ) -> Message | None:
        """Return a message to replace the method's default encoding of one client's upload."""
        return None

    def on_client_upload(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, message: Message
    ) -> None:
        """Client ``client_id`` sent ``message`` to the server."""

    def on_aggregate(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, pseudo_gradient: Tensor
    ) -> None:
        """The server combined the uploads into ``pseudo_gradient`` (before its optimiser step)."""

    def on_round_end(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, metrics: dict[str, Any]
    ) -> None:
        """The round is over and the global model updated."""


class ClientSampler(FederatedCallback):
    """A callback that chooses each round's cohort. At most one per trainer."""

    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        """The cohort of ``round_idx``; draw only from ``module.generator(round_idx, purpose=...)``."""
        raise NotImplementedError
