"""``FederatedModule``: one Lightning ``training_step`` is one federated round.

The engine owns the round and runs it as named phases (callback hooks in
:mod:`fedlightning.federated.hooks`):

1. **select** the cohort (the one client sampler, else every client);
2. **downlink**: :meth:`~FederatedModule.broadcast_state` is encoded once by the downlink
   channel, or per client where :meth:`~FederatedModule.client_downlink` gives a client its
   own message; each client's message is observed (and counted) separately;
3. **local work**: this process's share of the cohort is trained by the round's client runner
   (:mod:`fedlightning.federated.local`, chosen once per round by ``local_execution``): one
   client at a time through :meth:`~FederatedModule.client_update` and the one local-training
   routine :meth:`~FederatedModule.local_train`, or the whole share at once;
4. **choose** uploaders after local work (samplers with ``chooses_uploaders``);
5. **uplink**: each upload is encoded by the uplink channel, or dropped;
6. **accumulate** each decoded upload into the method's aggregator
   (:meth:`~FederatedModule.make_aggregator`: fixed-size sums), then **reduce** the sums
   across processes;
7. **apply**: methods that produce a model delta hand −Δ (:meth:`~FederatedModule.server_delta`)
   to the server optimiser (SGD(lr=1) is FedAvg; FedAvgM and the FedOpt optimisers are options
   of this step); methods that compute their new server state (``sets_server_state = True``)
   set it in :meth:`~FederatedModule.set_server_state`.

Phases 2 to 6 form one attempt; a callback's ``round_verdict`` may have the round attempted
again (client state rolled back) or skipped (failure injection:
:mod:`fedlightning.federated.failures`). Every phase is guarded against divergence
(:mod:`fedlightning.federated.divergence`): a non-finite client update is quarantined, a
non-finite or exploding loss, aggregate or server state stops the run with one sentence.

Processes (Lightning DDP) share the cohort (:mod:`fedlightning.federated.distribution`: client
``i`` on process ``i mod world_size``, or the cohort dealt by load); the cohort and every random
stream depend on (seed, round, client, purpose) only, never on the number of processes.
Validation and test, sharded alike, are in :mod:`fedlightning.federated.evaluation`; what the
phases hand each other, and the round in progress as methods read it, in
:mod:`fedlightning.federated.rounds`; the phases that move messages (per-client downlinks, the
uploader choice, the uplink and the accumulation, per client or for a share trained at once in
bulk) in :mod:`fedlightning.federated.wire`.

The client hooks a method overrides (its loss, penalty, step hook, optimiser, batches or whole
``client_update``) are in :mod:`fedlightning.federated.client`. Clients train one reused model
hidden from the module registry, so it is not checkpointed, not wrapped by DDP and never
aliases the global weights; local steps use plain ``torch.optim``
(:mod:`fedlightning.federated.local`). The server optimiser is the one Lightning optimiser, so
``global_step`` counts rounds (methods that set their state get :class:`RoundClock`).
"""

from __future__ import annotations

import copy
import functools
import gc
import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import DataLoader

from fedlightning.cuda_check import drop_unusable_nvml_check
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import (
    ESTIMATORS,
    Aggregator,
    Estimator,
    WeightedMean,
)
from fedlightning.federated.channel import Channel, DownlinkChannel
from fedlightning.federated.client import ParamsT, ignored_penalty
from fedlightning.federated.codecs import Float32Codec
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.divergence import DivergencePolicy, DivergenceWatch, check_server_state, upload_check
from fedlightning.federated.evaluation import HeldOutEvaluation
from fedlightning.federated.hooks import FederatedCallback, Verdict
from fedlightning.federated.local import (
    ClientResult,
    ClientRunner,
    LocalExecution,
    LocalTraining,
    LoopRunner,
    ResultRows,
    check_local_execution,
    choose_runner,
    own_local_work,
    resolved_optimizer_factory,
)
from fedlightning.federated.message import Message
from fedlightning.federated.options import check_engine_options
from fedlightning.federated.params import (
    flat_parameters,
    lay_out_flat_,
    num_parameters,
    set_flat_grad_,
)
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER
from fedlightning.federated.round_row import log_round_row
from fedlightning.federated.rounds import LOSS, METRICS, QUARANTINED, TRAINED, Rounds, RoundState
from fedlightning.federated.server_optim import RoundClock
from fedlightning.federated.state import ClientStateStore
from fedlightning.federated.wire import WirePhases

if TYPE_CHECKING:
    pass

__all__ = [
    "ClientResult",
    "FederatedModule",
    "LocalTraining",
    "OptimizerFactory",
    "ParamsT",
    "RoundClock",
    "own_local_work",
    "resolved_optimizer_factory",
    "upload_check",
]

log = logging.getLogger(__name__)

# `import lightning` above sets PYTORCH_NVML_BASED_CUDA_CHECK; without NVML it only slows every
# Adam step (fedlightning/cuda_check.py).
drop_unusable_nvml_check()

OptimizerFactory = Callable[..., torch.optim.Optimizer]


class FederatedModule(WirePhases, HeldOutEvaluation):
    """Base class of every federated method (FedAvg itself is this class unchanged).

    Args:
        model: the global model; clients train a copy of it.
        datamodule: a ``FederatedDataModule`` already ``setup`` (serves client tensors and
            the validation/test loaders).
        seed: the run seed from which every random stream is derived.
        client_optimizer: factory ``params -> torch.optim.Optimizer`` for local training
            (a fresh optimiser per client per round; see :meth:`make_client_optimizer`).
        server_optimizer: factory for the server optimiser over :meth:`server_parameters`
            (default ``SGD(lr=1)``, FedAvg; see ``fedlightning.federated.server_optim``).
            Methods that set their server state take none.
        local_epochs: passes over the client's data per round.
        local_steps: if set, exactly this many local mini-batch steps instead of epochs.
        batch_size: local mini-batch size.
        max_grad_norm: optional clipping of each local gradient.
        aggregation: ``"normalised"`` (Σ w_i Δ_i / Σ w_i over the uploaders) or ``"unbiased"``
            (Σ (w_i/p_i) Δ_i with the inclusion probabilities p_i), see
            :mod:`fedlightning.federated.aggregators`.
        local_execution: the backend that runs the clients' local work, ``auto``, ``loop``,
            ``fused`` or ``vectorised`` (:mod:`fedlightning.federated.local`).
    """

    uplink_payload: ClassVar[Payload] = Payload.MODEL_DELTA
    """What clients upload."""
    downlink_payload: ClassVar[Payload] = Payload.MODEL
    """What the server broadcasts."""
    per_client_downlink: ClassVar[bool] = False
    """True: each client receives its own message (:meth:`client_downlink`), not the broadcast."""
    sets_server_state: ClassVar[bool] = False
    """True: :meth:`set_server_state` computes the new state (no server optimiser)."""
    client_weighting: ClassVar[Literal["samples", "uniform"]] = "samples"
    """A client's share w_i: n_i / n (FedAvg) or 1 / N (methods whose objective is (1/N) Σ f_i)."""
    supported_aggregation: ClassVar[tuple[Estimator, ...]] = ESTIMATORS
    """The estimators this method's server step is defined for."""
    stateless_clients: ClassVar[bool] = False
    """True: the method keeps no per-client state, so with several processes the cohort is dealt
    by load (:meth:`share_of`); the client-state store then refuses per-client entries."""
    client_metric_names: tuple[str, ...] = ()
    """Names of the per-client diagnostics in :attr:`ClientResult.metrics` (logged as round means);
    a method may set them per instance, before training."""

    def __init__(
        self,
        *,
        model: nn.Module,
        datamodule: Any,
        seed: int = 0,
        client_optimizer: OptimizerFactory | None = None,
        server_optimizer: OptimizerFactory | None = None,
        local_epochs: int = 1,
        local_steps: int | None = None,
        batch_size: int = 32,
        max_grad_norm: float | None = None,
        aggregation: Estimator = "normalised",
        local_execution: LocalExecution = "auto",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_engine_options(
            method=name,
            local_epochs=local_epochs,
            local_steps=local_steps,
            batch_size=batch_size,
            max_grad_norm=max_grad_norm,
            aggregation=aggregation,
            supported_aggregation=self.supported_aggregation,
            sets_server_state=self.sets_server_state,
            has_server_optimizer=server_optimizer is not None,
            model=model,
        )
        if (penalty := ignored_penalty(type(self))) is not None:
            raise ConfigError(penalty)
        self.automatic_optimization = False
        self.model = model
        self.__dict__["_client_model"] = copy.deepcopy(model)  # hidden: not registered, not checkpointed
        self.__dict__["_datamodule"] = datamodule  # not an nn.Module attribute: never checkpointed
        self.seed = seed
        self.client_optimizer = client_optimizer or functools.partial(torch.optim.SGD, lr=0.05)
        self.server_optimizer = server_optimizer or (lambda params: torch.optim.SGD(params, lr=1.0))
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.max_grad_norm = max_grad_norm
        self.aggregation: Estimator = aggregation
        self.local_execution: LocalExecution = check_local_execution(local_execution)
        self.local_runner: ClientRunner = LoopRunner()
        """The backend running this round's local work (chosen at the start of each round)."""
        self._runner_choice: tuple[str, str] | None = None  # the last (backend, reason) logged
        self._sample_total: int | None = None
        self._round_cohort: Cohort | None = None
        self._phase_probability: dict[int, float] = {}
        self.client_state = ClientStateStore()
        self.divergence = DivergencePolicy()
        """What a diverged round does (set by the ``divergence:`` config, see ``federated.divergence``)."""
        self._divergence_watch = DivergenceWatch(self)  # the loss at the start, quarantined clients
        self._budget_callbacks: list[FederatedCallback] = []
        self._round_optimizer: OptimizerFactory | None = None  # client_optimizer, resolved for the round
        self._froze_gc = False  # on_train_start froze the collector's objects (undone on_train_end)
        self.uplink_channel = Channel(
            direction="uplink", payload=self.uplink_payload, codec=Float32Codec(), method=name
        )
        self.downlink_channel = DownlinkChannel(
            payload=self.downlink_payload, codec=Float32Codec(), method=name, per_client=self.per_client_downlink
        )
        self._build_held_out_metrics(datamodule)  # task, loss_fn, score_name, val_*/test_* metrics

    # ------------------------------------------------------------------ public protocol
    @property
    def num_clients(self) -> int:
        """Number of clients in the federation."""
        return self.datamodule.num_clients

    @property
    def dense_message_bits(self) -> int:
        """Bits of one dense float32 copy of the model: the reference for compression factors."""
        return 32 * num_parameters(self.model)

    @property
    def uplink_numel(self) -> int:
        """Entries of one upload (the model's parameter count unless the method says otherwise)."""
        return num_parameters(self.model)

    def record_start_losses(self, losses: Tensor) -> None:
        """Clients' first-step losses (the received model's loss), counted where the run measures its start."""
        self._divergence_watch.record_start_losses(losses)

    # ------------------------------------------------------------------ method hooks: server
    def server_parameters(self) -> list[nn.Parameter]:
        """Parameters the server optimiser updates (default: the global model's)."""
        return list(self.model.parameters())

    def broadcast_state(self, round_idx: int) -> Tensor:
        """The flat tensor the server broadcasts to the cohort (default: global weights)."""
        return flat_parameters(self.model)

    def client_downlink(self, *, client_id: int, round_idx: int, broadcast: Tensor) -> Tensor:
        """This client's own message, for methods with ``per_client_downlink`` (e.g. a sub-model)."""
        raise NotImplementedError(f"{type(self).__name__} sets per_client_downlink but not client_downlink.")

    def make_aggregator(self, round_idx: int) -> Aggregator:
        """Fresh sums for one round (default: the weighted mean of :attr:`uplink_numel`-vectors)."""
        return WeightedMean(dim=self.uplink_numel, normalise=self.aggregation == "normalised", device=self.device)

    def client_share(self, *, client_id: int, num_samples: int) -> float:
        """w_i, the client's weight in the full-participation objective: n_i / n, or 1 / N."""
        if self.client_weighting == "uniform":
            return 1.0 / self.num_clients
        return num_samples / self._total_samples()

    def upload_weight(self, *, client_id: int, num_samples: int, inclusion_probability: float) -> float:
        """The coefficient of one upload: the client's share w_i, divided by p_i when unbiased."""
        share = self.client_share(client_id=client_id, num_samples=num_samples)
        return share / inclusion_probability if self.aggregation == "unbiased" else share

    @property
    def accepts_upload_choice(self) -> bool:
        """Whether a sampler may choose the uploaders after local work (optimal client sampling).

        The estimate Σ_{chosen} (w_i/q_i) Δ_i needs a server step that is linear in the uploads
        (the default weighted-mean aggregator, no per-client server bookkeeping) and defined
        for inverse-probability weights.
        """
        cls = type(self)
        return (
            "unbiased" in self.supported_aggregation
            and cls.make_aggregator is FederatedModule.make_aggregator
            and cls.on_upload_decoded is FederatedModule.on_upload_decoded
        )

    def server_delta(self, *, round_idx: int, aggregator: Aggregator) -> Tensor:
        """The model delta Δ of the round; the server optimiser steps on −Δ (default: the estimate)."""
        assert isinstance(aggregator, WeightedMean)
        return aggregator.result()

    def set_server_state(self, *, round_idx: int, aggregator: Aggregator) -> None:
        """The new server state from the reduced sums (methods with ``sets_server_state``)."""
        raise NotImplementedError(f"{type(self).__name__} sets its server state but does not say how.")

    def server_metrics(self, round_idx: int) -> dict[str, float]:
        """Diagnostics logged after the server step (default: none)."""
        return {}

    # ------------------------------------------------------------------ the round
    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One round: the phases of the module docstring, in order (downlink to reduce once per attempt)."""
        started = time.perf_counter()
        rnd = RoundState(round_idx=self.global_step, callbacks=list(self.federated_callbacks()))
        for cb in rnd.callbacks:
            cb.on_round_start(self.trainer, self, rnd.round_idx)
        self._budget_callbacks = [cb for cb in rnd.callbacks if cb.cuts_local_steps]
        self._round_optimizer = resolved_optimizer_factory(self.client_optimizer, self.client_model)
        self._begin_local_execution()
        self._select(rnd)
        broadcast_state, broadcast = self._broadcast(rnd)
        may_repeat = any(cb.repeats_rounds for cb in rnd.callbacks)
        verdict: Verdict = "apply"
        for attempt in itertools.count():
            snapshot = self.client_state.snapshot() if may_repeat else None
            self._attempt(rnd, attempt, broadcast_state, broadcast)
            verdict = self._verdict(rnd)
            if verdict != "repeat":
                break
            assert snapshot is not None, "a callback asked to repeat a round but does not set repeats_rounds"
            self.client_state.restore(snapshot)  # the attempt's local work never happened
        if verdict == "apply":
            for cb in rnd.callbacks:
                cb.on_aggregate(self.trainer, self, rnd.round_idx, rnd.aggregator)
        self._round_optimizer = None
        self._server_step(rnd, apply=verdict == "apply")
        self.client_state.enforce_budget()  # between rounds: no method holds a client's state now
        self._log_round(rnd, time.perf_counter() - started)

    def _attempt(self, rnd: RoundState, attempt: int, broadcast_state: Tensor, broadcast: Message) -> None:
        """Phases *downlink* (per client) to *reduce*, then the divergence checks of the reduced round."""
        rnd.attempt = attempt
        self._phase_probability = dict(rnd.probability)
        for cb in rnd.callbacks:
            cb.on_attempt_start(self.trainer, self, rnd.round_idx, attempt)
        rnd.aggregator = self.make_aggregator(rnd.round_idx)
        rnd.stats = torch.zeros(METRICS + len(self.client_metric_names), dtype=torch.float64)
        rnd.quarantined = []
        self._divergence_watch.begin_attempt(rnd.round_idx, self.device)  # round 0: the initial model's loss
        buffered: list[tuple[int, ClientResult]] = []
        results = self.local_runner.train_share(
            self,
            round_idx=rnd.round_idx,
            share=self.share_of(rnd.cohort),
            receive=lambda cid: self._client_downlink(rnd, cid, broadcast_state, broadcast),
            receive_share=lambda share: self._share_downlink(rnd, share, broadcast_state, broadcast),
        )
        if isinstance(results, ResultRows):
            self._take_rows(rnd, results)
            return self._end_attempt(rnd)
        loss_sum, trained = float(rnd.stats[LOSS]), 0  # float64 in client order, as the tensor would; written once
        for client_id, result in results:
            loss, total = upload_check(result.loss, result.upload)
            if not (math.isfinite(loss) and math.isfinite(total)):
                self._divergence_watch.quarantine(rnd, client_id, loss)  # never reaches the aggregator
                continue
            loss_sum += loss
            trained += 1
            if rnd.choose_later:
                buffered.append((client_id, result))  # the uploaders are chosen after local work
            else:
                self._upload(rnd, client_id, result, rnd.probability[client_id])
        rnd.stats[LOSS] = loss_sum
        rnd.stats[TRAINED] += trained
        if rnd.choose_later:
            self._choose_and_upload(rnd, buffered)
        self._end_attempt(rnd)

    def _end_attempt(self, rnd: RoundState) -> None:
        """Phase *reduce* and the divergence checks of the reduced round."""
        self._divergence_watch.end_attempt(rnd)  # the start's first-step losses, into the statistics
        rnd.stats = rnd.aggregator.all_reduce(self.reduce_sum, alongside=rnd.stats)  # one collective
        self._divergence_watch.check_attempt(rnd)  # stops a diverged round on every process alike

    def _begin_local_execution(self) -> None:
        """Choose this round's client runner (``local_execution``) and log the choice when it changes."""
        runner, reason = choose_runner(self, self.local_execution)
        runner.begin_round(self)
        self.local_runner = runner
        if (runner.name, reason) != self._runner_choice and self.process_rank == 0:
            log.info("Local execution: %s (%s).", runner.name, reason)
        self._runner_choice = (runner.name, reason)

    def reliability_summary(self) -> dict[str, float | int]:
        """Run totals of failures and divergence for ``summary.json``: the engine's and its callbacks'."""
        totals = self._divergence_watch.summary()
        for cb in self.federated_callbacks():
            totals.update(cb.summary_metrics())
        return totals

    def _verdict(self, rnd: RoundState) -> Verdict:
        """The first callback verdict other than apply, else apply."""
        for cb in rnd.callbacks:
            verdict = cb.round_verdict(self.trainer, self, rnd.round_idx, rnd.attempt, rnd.aggregator)
            if verdict != "apply":
                return verdict
        return "apply"

    def _select(self, rnd: RoundState) -> None:
        """Phase *select*: the cohort (the same on every process) and its inclusion probabilities."""
        sampler = self.client_sampler()
        if sampler is None:
            rnd.cohort = Cohort.full(round_idx=rnd.round_idx, num_clients=self.num_clients)
        else:
            rnd.cohort = sampler.select_cohort(self.trainer, self, rnd.round_idx)
            rnd.choose_later = sampler.chooses_uploaders
        rnd.sampler = sampler
        self._round_cohort = rnd.cohort
        rnd.probability = dict(zip(rnd.cohort.client_ids, rnd.cohort.inclusion_probabilities.tolist(), strict=True))
        self._phase_probability = dict(rnd.probability)
        for cb in rnd.callbacks:
            cb.on_cohort_selected(self.trainer, self, rnd.cohort)

    def _broadcast(self, rnd: RoundState) -> tuple[Tensor, Message]:
        """Phase *downlink*, shared part: the broadcast state, encoded once by the downlink channel."""
        state = self.broadcast_state(rnd.round_idx)
        message, decoded = self.downlink_channel.send(
            state,
            client_id=SERVER,
            generator=self.generator(rnd.round_idx, SERVER, "compress_downlink"),
            state=self.client_state,
        )
        rnd.received_broadcast = decoded.to(self.device)
        return state, message

    def _server_step(self, rnd: RoundState, *, apply: bool = True) -> None:
        """Phase *apply*: set the server state, or step the server optimiser on −Δ (unless skipped).

        The new server state is then checked to be finite (one reduction).
        """
        optimizer = self.optimizers()
        optimizer.zero_grad()  # type: ignore[union-attr]  # gradients set to None: a step without one is a no-op
        if apply and rnd.aggregator.empty:  # (a round a callback skipped says why itself)
            log.warning("Round %d: no upload reached the server; the server state is unchanged.", rnd.round_idx + 1)
        applied = apply and not rnd.aggregator.empty
        if applied and self.sets_server_state:
            self.set_server_state(round_idx=rnd.round_idx, aggregator=rnd.aggregator)
        elif applied:
            delta = self.server_delta(round_idx=rnd.round_idx, aggregator=rnd.aggregator)
            set_flat_grad_(self.server_parameters(), -delta)
        optimizer.step()  # type: ignore[union-attr]  # also the round counter (global_step)
        if applied:
            self.downlink_channel.after_server_step(self, rnd.round_idx)  # e.g. Algorithm 1's compressed step
            check_server_state(self, rnd.round_idx)

    def _log_round(self, rnd: RoundState, seconds: float) -> None:
        clients = max(float(rnd.stats[TRAINED]), 1.0)
        metrics: dict[str, Any] = {"train/loss": float(rnd.stats[LOSS]) / clients, "time/round_s": seconds}
        metrics["failures/quarantined"] = float(rnd.stats[QUARANTINED])
        uploads = max(rnd.aggregator.count, 1)
        for k, name in enumerate(self.client_metric_names):
            metrics[name] = float(rnd.stats[METRICS + k]) / uploads
        metrics.update(self.server_metrics(rnd.round_idx))
        metrics["round"] = float(rnd.round_idx + 1)
        for cb in rnd.callbacks:
            cb.on_round_end(self.trainer, self, rnd.round_idx, metrics)  # each may add its scalars
        log_round_row(self.trainer, rnd.round_idx, metrics)

    def _total_samples(self) -> int:
        """n = Σ_i n_i over the whole federation (the denominator of FedAvg's shares)."""
        if self._sample_total is None:
            self._sample_total = int(sum(self.datamodule.client_sizes))
        return self._sample_total

    # ------------------------------------------------------------------ Lightning plumbing
    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.sets_server_state:
            return RoundClock(self.server_parameters())
        return self.server_optimizer(self.server_parameters())

    def train_dataloader(self) -> DataLoader[int]:
        rounds = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 1
        return DataLoader(Rounds(rounds), batch_size=None)

    def on_fit_start(self) -> None:
        self._check_process_group()
        sampler = self.client_sampler()
        if sampler is not None and sampler.chooses_uploaders and not self.accepts_upload_choice:
            raise ConfigError(
                f"{type(sampler).__name__} chooses uploaders after local work, which {type(self).__name__} "
                "does not support (its aggregation is not the engine's weighted mean of the uploads); "
                "use sampler=uniform, sampler=independent or sampler=importance."
            )
        if self.local_execution != "auto":  # a named backend that cannot serve stops here, before training
            choose_runner(self, self.local_execution)
        self.client_model.to(self.device)
        lay_out_flat_(self.client_model)  # copy-in and upload difference: one operation each
        self._set_client_state_refusal()  # channels are attached (callbacks' setup) by now
        if self.trainer.val_check_interval and self.trainer.check_val_every_n_epoch is not None:
            rank_zero_warn("Set trainer.check_val_every_n_epoch=null so that evaluation counts rounds.")

    def on_train_end(self) -> None:
        if self._froze_gc:
            gc.unfreeze()
            self._froze_gc = False

    def on_train_start(self) -> None:
        self._begin_local_execution()  # logged before the first round (chosen again at each round's start)
        # Everything built so far (torch, Lightning, the data, the model) lives until the end:
        # moved out of the collector's generations, a full collection inside a round only
        # scans what the rounds themselves allocate.
        if not self._froze_gc:
            gc.freeze()
            self._froze_gc = True
        self._check_no_distributed_sampler()

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["client_state"] = self._gathered_client_state()  # every process's clients
        checkpoint["divergence"] = self._divergence_watch.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.client_state.load_state_dict(checkpoint.get("client_state", {}))
        self._divergence_watch.load_state_dict(checkpoint.get("divergence", {}))
        self._retain_own_client_state()
