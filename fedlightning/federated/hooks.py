"""The ``FederatedCallback`` protocol: what a callback sees of a round.

A round (:meth:`fedlightning.federated.module.FederatedModule.training_step`) runs these
phases and calls these hooks, in this order, on every callback that subclasses
:class:`FederatedCallback` (other Lightning callbacks are untouched). Under DDP every process
runs every phase; the per-client hooks fire on the process that holds the client.

1. **select**: ``on_round_start(trainer, module, round_idx)``; the one :class:`ClientSampler`
   (if any; otherwise all clients take part) returns the cohort from ``select_cohort``; then
   ``on_cohort_selected(trainer, module, cohort)``. Phases 2 to 6 run once per *attempt*
   (``on_attempt_start(trainer, module, round_idx, attempt)``, attempt 0 first); a round is
   attempted again when a callback's ``round_verdict`` asks for it.
2. **downlink**: for each client of this process's share, ``on_client_downlink(trainer,
   module, round_idx, client_id, message)`` with the message that client receives (one
   broadcast shared by the cohort, or the client's own message); a share trained at once is
   observed in one call, ``on_share_downlink(trainer, module, round_idx, sent)``, whose default
   calls the per-client hook for each client.
3. **local work** on each client (the method's ``client_update``); the engine's local-training
   routine runs at most ``local_step_budget(trainer, module, round_idx, client_id, planned)``
   of its planned steps (the smallest budget of any callback; ``None``: all of them).
4. **choose** (optional): a sampler whose ``chooses_uploaders`` is true picks the uploaders
   from every cohort member's update norm (``choose_uploaders``), e.g. optimal client sampling;
   the control messages of that protocol (norms, sums, probabilities) are observed per client
   with ``on_control_message(trainer, module, round_idx, client_id, direction, message)``.
5. **uplink**: for each uploader, ``drops_upload(trainer, module, round_idx, client_id)``; if any
   callback says true the upload is lost (``on_upload_dropped``), otherwise the uplink channel
   encodes it and ``on_client_upload(trainer, module, round_idx, client_id, message)`` sees it
   (a share trained at once: ``on_share_upload(trainer, module, round_idx, sent)`` with the
   share's :class:`~fedlightning.federated.message.SentShare`; control messages likewise
   through ``on_share_control``).
   The estimator divides the upload's coefficient by the product of every callback's
   ``arrival_probability`` (1.0 unless a callback corrects for its own drop-outs).
6. **accumulate and reduce**: decoded uploads are folded into the method's aggregator and
   summed across processes; every callback's ``round_verdict(trainer, module, round_idx,
   attempt, aggregator)`` then says ``"apply"``, ``"repeat"`` (a new attempt, the client state
   rolled back) or ``"skip"`` (the server state stays unchanged; the round still counts); on
   apply, ``on_aggregate(trainer, module, round_idx, aggregator)``.
7. **apply**: the server steps or sets its state; then ``on_round_end(trainer, module,
   round_idx, metrics)``, where callbacks may ``module.log``.

Observation hooks must not change the messages they see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
from torch import Tensor

from fedlightning.federated.cohort import Cohort
from fedlightning.federated.message import Message, SentShare

if TYPE_CHECKING:
    from fedlightning.federated.aggregators import Aggregator
    from fedlightning.federated.module import FederatedModule


Direction = Literal["up", "down"]
Verdict = Literal["apply", "repeat", "skip"]


@dataclass(frozen=True)
class UploadChoice:
    """Which cohort members upload, and what choosing them cost.

    Attributes:
        uploaders: the chosen clients with q_i = P(client uploads | it is in the cohort); the
            engine divides by the product of q_i and the cohort's inclusion probability.
        uplink_control: per cohort member, the values it sent to let the server choose
            (e.g. its weighted update norm), as a float tensor; counted as uplink bits.
        downlink_control: per cohort member, the values the server sent back (e.g. p_i).
    """

    uploaders: Cohort
    uplink_control: dict[int, Tensor] = field(default_factory=dict)
    downlink_control: dict[int, Tensor] = field(default_factory=dict)


class FederatedCallback(L.Callback):
    """A Lightning callback that also takes part in federated rounds (all hooks optional)."""

    repeats_rounds: bool = False
    """True if ``round_verdict`` may answer ``"repeat"`` (the engine then snapshots the client state)."""

    def on_round_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> None:
        """A round begins; ``round_idx == trainer.global_step``."""

    def on_cohort_selected(self, trainer: L.Trainer, module: FederatedModule, cohort: Cohort) -> None:
        """The cohort of this round is known (the same on every process)."""

    def on_attempt_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, attempt: int) -> None:
        """Attempt ``attempt`` (0 first) of the round's downlink, local work and uplink begins."""

    @property
    def cuts_local_steps(self) -> bool:
        """Whether :meth:`local_step_budget` may cut any client's steps (it is asked per client only then)."""
        return type(self).local_step_budget is not FederatedCallback.local_step_budget

    def local_step_budget(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, planned: int
    ) -> int | None:
        """At most how many of its ``planned`` local steps this client completes (``None``: all)."""
        return None

    def on_client_downlink(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, message: Message
    ) -> None:
        """Client ``client_id`` receives ``message`` from the server."""

    def on_share_downlink(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, sent: SentShare) -> None:
        """The clients of ``sent`` receive their messages at once (a share trained together).

        By default :meth:`on_client_downlink` for each client in turn; a callback that counts
        messages may take the share at once instead.
        """
        if _overrides(self, "on_client_downlink"):
            for k, client_id in enumerate(sent.client_ids):
                self.on_client_downlink(trainer, module, round_idx, client_id, sent.message(k))

    def on_control_message(
        self,
        trainer: L.Trainer,
        module: FederatedModule,
        round_idx: int,
        client_id: int,
        direction: Direction,
        message: Message,
    ) -> None:
        """A control message of the uploader choice crossed the wire (``"up"``: from the client)."""

    def on_share_control(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, direction: Direction, sent: SentShare
    ) -> None:
        """Control messages of several clients at once; by default :meth:`on_control_message` for each."""
        if _overrides(self, "on_control_message"):
            for k, client_id in enumerate(sent.client_ids):
                self.on_control_message(trainer, module, round_idx, client_id, direction, sent.message(k))

    def drops_upload(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int) -> bool:
        """Return true to lose this client's upload (a failure; nothing is sent or counted)."""
        return False

    def on_upload_dropped(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int) -> None:
        """Client ``client_id`` trained but its upload was lost."""

    def arrival_probability(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int) -> float:
        """The probability, divided out by the estimator, that this (arrived) upload would arrive."""
        return 1.0

    def on_client_upload(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, message: Message
    ) -> None:
        """Client ``client_id`` sent ``message`` to the server."""

    def on_share_upload(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, sent: SentShare) -> None:
        """The uploads of several clients, sent at once (a share trained together, none dropped).

        By default :meth:`on_client_upload` for each client in turn: a callback that does not
        override it never makes the engine build the share's :class:`Message` objects.
        """
        if _overrides(self, "on_client_upload"):
            for k, client_id in enumerate(sent.client_ids):
                self.on_client_upload(trainer, module, round_idx, client_id, sent.message(k))

    def round_verdict(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, attempt: int, aggregator: Aggregator
    ) -> Verdict:
        """Apply the reduced uploads of this attempt, attempt the round again, or skip it.

        Called on every process with the same reduced aggregator: the answer must be the same.
        """
        return "apply"

    def on_aggregate(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, aggregator: Aggregator) -> None:
        """Every upload of the round has been accumulated and reduced across processes."""

    def on_round_end(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, metrics: dict[str, Any]
    ) -> None:
        """The round is over and the server state updated.

        ``metrics`` is the round's row (name to number, ``round`` counted from 1): add this
        round's scalars to it. The engine logs the row once after every callback
        (:func:`fedlightning.federated.round_row.log_round_row`), which costs far less than a
        ``module.log`` per value.
        """

    def summary_metrics(self) -> dict[str, float | int]:
        """Run totals this callback adds to ``summary.json`` (default: none)."""
        return {}


class ClientSampler(FederatedCallback):
    """A callback that chooses each round's cohort. At most one per trainer.

    Draw only from ``module.generator(round_idx, SERVER, purpose)`` so the cohort is the same
    on every process and after a resume.
    """

    chooses_uploaders: bool = False
    """True if the sampler picks uploaders after local work (``choose_uploaders``)."""

    def select_cohort(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> Cohort:
        """The clients that train in ``round_idx``, with their inclusion probabilities."""
        raise NotImplementedError

    def choose_uploaders(
        self, trainer: L.Trainer, module: FederatedModule, cohort: Cohort, update_norms: Tensor
    ) -> UploadChoice:
        """The clients of ``cohort`` that upload, given ‖update‖₂ of each cohort member (in cohort order).

        Every process passes the same norms and must return the same choice (draw from
        ``module.generator(round_idx, SERVER, purpose)``). With ``aggregation=normalised`` the
        round's estimate is Σ_{chosen} (w_i/q_i) Δ_i / Σ_{cohort} w_i, unbiased for the
        cohort's own weighted mean; with ``aggregation=unbiased`` it is
        Σ_{chosen} w_i/(p_i q_i) Δ_i over the federation's shares w_i.
        """
        return UploadChoice(uploaders=cohort)


def _overrides(callback: FederatedCallback, hook: str) -> bool:
    """Whether ``callback``'s class defines its own ``hook`` (the base's per-client hooks do nothing)."""
    return getattr(type(callback), hook) is not getattr(FederatedCallback, hook)
