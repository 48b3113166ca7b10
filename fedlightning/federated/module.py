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

Processes (Lightning DDP): client ``i`` is always trained by process ``i mod world_size``, so
its per-client state stays on one process; a method with :attr:`~FederatedModule.stateless_clients`
and no error-feedback memory instead has each round's cohort dealt to the processes by load
(:func:`~fedlightning.federated.cohort.deal_by_load`), so no process waits for a larger share.
The cohort and every random stream depend on (seed, round, client, purpose) only, never on
the number of processes.

Clients train one reused model hidden from the module registry, so it is not checkpointed,
not wrapped by DDP and never aliases the global weights; local steps use plain
``torch.optim`` (:mod:`fedlightning.federated.local`). The server optimiser is the one Lightning
optimiser, so ``global_step`` counts rounds (methods that set their state get :class:`RoundClock`).
"""

from __future__ import annotations

import copy
import functools
import gc
import inspect
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchmetrics import MaxMetric, MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import R2Score

from fedlightning.compression.codecs import Float32Codec
from fedlightning.cuda_check import drop_unusable_nvml_check
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import ESTIMATORS, Aggregator, Estimator, WeightedMean
from fedlightning.federated.batches import local_batches
from fedlightning.federated.channel import Channel, DownlinkChannel
from fedlightning.federated.cohort import Cohort, deal_by_load
from fedlightning.federated.divergence import DivergenceError, DivergencePolicy, exploded
from fedlightning.federated.hooks import ClientSampler, Direction, FederatedCallback, UploadChoice, Verdict
from fedlightning.federated.local import (
    ClientResult,
    ClientRunner,
    LocalExecution,
    LocalProgram,
    LocalTraining,
    LoopRunner,
    check_local_execution,
    choose_runner,
    own_local_work,
    resolved_optimizer_factory,
)
from fedlightning.federated.message import Message
from fedlightning.federated.metric_sync import sum_states_across_processes
from fedlightning.federated.params import assign_flat_, flat_difference, flat_parameters, num_parameters, set_flat_grad_
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER, torch_generator
from fedlightning.federated.round_row import log_round_row
from fedlightning.federated.state import ClientStateStore

if TYPE_CHECKING:
    from fedlightning.datamodules.base import FederatedDataModule

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
ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]

# Round statistics (float64, reduced across processes in one collective): loss sum and count of
# the clients that trained and were not quarantined, quarantined clients, the sum and count of
# first-step losses (the loss at the start, measured once), then the client metric sums.
_LOSS, _TRAINED, _QUARANTINED, _START_SUM, _START_COUNT, _METRICS = range(6)


@dataclass
class _Round:
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
    stats: Tensor = field(init=False)  # see _LOSS ... _METRICS
    quarantined: list[int] = field(default_factory=list)  # this process's quarantined clients


def upload_check(loss: Tensor, upload: Tensor) -> tuple[float, float]:
    """A client's mean loss and the sum of its upload, read in one transfer (one device sync).

    The sum is non-finite whenever any entry is (an ``inf`` or ``nan`` propagates; opposite
    infinities give ``nan``), so one reduction decides the quarantine.

    >>> upload_check(torch.tensor(0.5), torch.tensor([1.0, 2.0]))
    (0.5, 3.0)
    >>> math.isfinite(upload_check(torch.tensor(0.5), torch.tensor([1.0, float("inf"), -float("inf")]))[1])
    False
    """
    pair = torch.stack([loss.detach().reshape(()).float(), upload.detach().sum().float()])
    first, second = pair.tolist()
    return float(first), float(second)


class RoundClock(torch.optim.Optimizer):
    """The Lightning optimiser of methods that set their server state: a step only counts the round."""

    def __init__(self, params: Iterable[Tensor]) -> None:
        super().__init__(params, {})

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return closure() if closure is not None else None


class _SquaredError(nn.Module):
    """Mean squared error with the model's (B, 1) output matched to (B,) targets."""

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        return nn.functional.mse_loss(prediction.reshape(target.shape), target)


class _Rounds(Dataset[int]):
    """One item per round: Lightning's training loop ticks once per federated round."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __len__(self) -> int:
        return self.rounds

    def __getitem__(self, index: int) -> int:
        return index


class FederatedModule(L.LightningModule):
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
    local_work_hooks: ClassVar[tuple[str, ...]] = ("client_update", "local_train", "local_loss", "on_local_step_end")
    """The hooks that make up a client's local work: a backend that serves a class's local work
    serves a subclass that overrides none of them."""
    hand_stepped: ClassVar[bool] = False
    """True: the method's clients take their steps by hand on the ``fused`` backend's layers
    (:attr:`ClientRunner.layers`) when it runs, with any client optimiser."""

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
        if local_epochs < 1:
            raise ConfigError(f"method.local_epochs must be at least 1 (got {local_epochs}).")
        if local_steps is not None and local_steps < 1:
            raise ConfigError(f"method.local_steps must be at least 1 or null (got {local_steps}).")
        if batch_size < 1:
            raise ConfigError(f"method.batch_size must be at least 1 (got {batch_size}).")
        if aggregation not in self.supported_aggregation:
            raise ConfigError(
                f"{name} supports method.aggregation={' or '.join(self.supported_aggregation)} (got {aggregation!r})."
            )
        if self.sets_server_state and server_optimizer is not None:
            raise ConfigError(
                f"{name} sets its server state from the uploads and has no server optimiser; "
                "remove method.server_optimizer."
            )
        if any(True for _ in model.buffers()):
            raise ConfigError(
                "The model has buffers (e.g. BatchNorm running statistics) that federated averaging "
                "does not aggregate; use a model with GroupNorm or no normalisation."
            )
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
        self._start_loss: float | None = None  # the loss at the start, the reference of max_loss_ratio
        self._start_acc: Tensor | None = None  # first-step losses of the round that measures it
        self._quarantined_total = 0
        self._budget_callbacks: list[FederatedCallback] = []
        self._round_optimizer: OptimizerFactory | None = None  # client_optimizer, resolved for the round
        self._froze_gc = False  # on_train_start froze the collector's objects (undone on_train_end)
        self.uplink_channel = Channel(
            direction="uplink", payload=self.uplink_payload, codec=Float32Codec(), method=name
        )
        self.downlink_channel = DownlinkChannel(
            payload=self.downlink_payload, codec=Float32Codec(), method=name, per_client=self.per_client_downlink
        )
        self.task = getattr(datamodule, "task", "classification")
        if self.task == "classification":
            self.loss_fn: nn.Module = nn.CrossEntropyLoss()
            self.score_name = "acc"
            num_classes = int(datamodule.num_classes)
            # (summed across processes by hand at the end of each evaluation: evaluation_metrics)
            accuracy = functools.partial(
                MulticlassAccuracy, num_classes=num_classes, average="micro", sync_on_compute=False
            )
            self.val_score: Metric = accuracy()
            self.test_score: Metric = accuracy()
        elif self.task == "regression":
            self.loss_fn = _SquaredError()
            self.score_name = "r2"
            self.val_score = R2Score(sync_on_compute=False)
            self.test_score = R2Score(sync_on_compute=False)
        else:
            raise ConfigError(f"Unknown data task {self.task!r}; a datamodule's task is classification or regression.")
        self.val_loss = MeanMetric(sync_on_compute=False)
        self.test_loss = MeanMetric(sync_on_compute=False)
        # Every process updates it with the same (reduced) score, so it needs no sync of its own.
        self.val_score_best = MaxMetric(sync_on_compute=False)
        self.val_score_best.persistent(True)  # survives resume

    # ------------------------------------------------------------------ public protocol
    @property
    def client_model(self) -> nn.Module:
        """The one reusable model that every client trains in turn."""
        return self.__dict__["_client_model"]

    @property
    def datamodule(self) -> FederatedDataModule:
        """The federated data: client tensors, sizes, validation and test loaders."""
        return self.__dict__["_datamodule"]

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

    def generator(self, round_idx: int, client_id: int, purpose: str) -> torch.Generator:
        """The CPU generator of stream (run seed, round, client, purpose)."""
        return torch_generator(seed=self.seed, round_idx=round_idx, client_id=client_id, purpose=purpose)

    @property
    def round_client_optimizer(self) -> OptimizerFactory:
        """The client optimiser factory of the round in progress (resolved once per round), else the configured one."""
        return self._round_optimizer or self.client_optimizer

    def record_start_losses(self, losses: Tensor) -> None:
        """Clients' first-step losses (the received model's loss), counted where the run measures its start."""
        if self._start_acc is not None:
            self._start_acc[0] += losses.sum().to(self._start_acc)
            self._start_acc[1] += losses.numel()

    @property
    def cuts_local_steps(self) -> bool:
        """Whether a callback may cut clients' local steps this round (:meth:`local_step_budget`)."""
        return bool(self._budget_callbacks)

    def local_step_budget(self, *, client_id: int, round_idx: int, planned: int) -> int:
        """How many of its ``planned`` local steps this client takes: the smallest callback budget."""
        budgets = [
            cb.local_step_budget(self.trainer, self, round_idx, client_id, planned) for cb in self._budget_callbacks
        ]
        return min([planned, *(b for b in budgets if b is not None)])

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

    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        """Server-side bookkeeping of one decoded upload, on the process that holds the client."""

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

    # ------------------------------------------------------------------ method hooks: client
    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Loss of one local mini-batch (default: cross-entropy)."""
        return self.loss_fn(model(x), y)

    def make_client_optimizer(self, params: ParamsT, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        """The optimiser of one client in one round (override for per-client step sizes)."""
        factory = self._round_optimizer if self._round_optimizer is not None else self.client_optimizer
        return factory(params)

    def on_local_step_end(self, model: nn.Module) -> None:
        """Called after each local optimiser step of the default client (e.g. a projection)."""

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local training on one client from the broadcast it decoded; uploads the model delta."""
        model = self.client_model
        assign_flat_(model, received)
        if not model.training:
            model.train()
        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=model.parameters(),
            batch_loss=lambda x, y: self.local_loss(model, x, y),
            after_step=lambda: self.on_local_step_end(model),
        )
        upload = flat_difference(model, received)  # w_k − w, one pass per parameter
        return ClientResult(upload=upload, num_samples=done.num_samples, loss=done.loss)

    # ------------------------------------------------------------------ the local-training routine
    def local_train(
        self,
        *,
        client_id: int,
        round_idx: int,
        params: ParamsT,
        batch_loss: Callable[[Tensor, Tensor], Tensor],
        after_step: Callable[[], None] | None = None,
        after_epoch: Callable[[int], bool] | None = None,
        writes_gradients: bool = False,
    ) -> LocalTraining:
        """Local mini-batch training of ``params`` on one client's data, in place, by the round's runner.

        Runs ``local_epochs`` (or ``local_steps``) steps with the optimiser of
        :meth:`make_client_optimizer`: batches and augmentation from the client's own streams,
        ``batch_loss(x, y)`` (which may draw from its own streams, e.g. masks or gates),
        ``loss.backward()``, clipping to ``max_grad_norm``, the optimiser step, then
        ``after_step()``. ``after_epoch(epochs_done)`` is called after each whole pass over
        the data (``local_epochs`` mode only) and ends local training by returning true
        (client-side early stopping; ``local_epochs`` is then the cap). With
        ``writes_gradients``, ``batch_loss`` writes every trained parameter's gradient itself
        (a step taken by hand, e.g. :meth:`fedlightning.methods.zampling.SampledNetwork.fused_gradient_`)
        and returns the loss: no backward pass is run. The ``fused`` backend takes the engine's
        own cross-entropy steps by hand (:mod:`fedlightning.federated.local.fused`).
        """
        program = LocalProgram(
            params=params,
            batch_loss=batch_loss,
            after_step=after_step,
            after_epoch=after_epoch,
            writes_gradients=writes_gradients,
        )
        return self.local_runner.train(self, client_id=client_id, round_idx=round_idx, program=program)

    # ------------------------------------------------------------------ helpers for methods
    def client_data(self, client_id: int) -> tuple[Tensor, Tensor]:
        """The client's features and targets, on this module's device."""
        x, y = self.datamodule.client_tensors(client_id)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def client_batches(self, *, client_id: int, round_idx: int, num_samples: int) -> Iterable[Tensor]:
        """Mini-batch indices of one client in one round, from its own random stream."""
        return local_batches(
            num_samples=num_samples,
            batch_size=self.batch_size,
            epochs=self.local_epochs,
            steps=self.local_steps,
            generator=self.generator(round_idx, client_id, "batches"),
        )

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

    # ------------------------------------------------------------------ the round
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

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """One round: the phases of the module docstring, in order (downlink to reduce once per attempt)."""
        started = time.perf_counter()
        rnd = _Round(round_idx=self.global_step, callbacks=list(self.federated_callbacks()))
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

    def _attempt(self, rnd: _Round, attempt: int, broadcast_state: Tensor, broadcast: Message) -> None:
        """Phases *downlink* (per client) to *reduce*, then the divergence checks of the reduced round."""
        rnd.attempt = attempt
        self._phase_probability = dict(rnd.probability)
        for cb in rnd.callbacks:
            cb.on_attempt_start(self.trainer, self, rnd.round_idx, attempt)
        rnd.aggregator = self.make_aggregator(rnd.round_idx)
        rnd.stats = torch.zeros(_METRICS + len(self.client_metric_names), dtype=torch.float64)
        rnd.quarantined = []
        measure_start = self._start_loss is None and rnd.round_idx == 0  # the initial model's loss
        self._start_acc = torch.zeros(2, dtype=torch.float64, device=self.device) if measure_start else None
        buffered: list[tuple[int, ClientResult]] = []
        results = self.local_runner.train_share(
            self,
            round_idx=rnd.round_idx,
            share=self.share_of(rnd.cohort),
            receive=lambda cid: self._client_downlink(rnd, cid, broadcast_state, broadcast),
        )
        for client_id, result in results:
            loss, total = upload_check(result.loss, result.upload)
            if not (math.isfinite(loss) and math.isfinite(total)):
                self._quarantine(rnd, client_id, loss)  # never reaches the aggregator
                continue
            rnd.stats[_LOSS] += loss
            rnd.stats[_TRAINED] += 1
            if rnd.choose_later:
                buffered.append((client_id, result))  # the uploaders are chosen after local work
            else:
                self._upload(rnd, client_id, result, rnd.probability[client_id])
        if rnd.choose_later:
            self._choose_and_upload(rnd, buffered)
        if self._start_acc is not None:
            rnd.stats[_START_SUM : _START_COUNT + 1] = self._start_acc.cpu()
            self._start_acc = None
        rnd.stats = rnd.aggregator.all_reduce(self.reduce_sum, alongside=rnd.stats)  # one collective
        self._check_attempt(rnd)

    def _begin_local_execution(self) -> None:
        """Choose this round's client runner (``local_execution``) and log the choice when it changes."""
        runner, reason = choose_runner(self, self.local_execution)
        runner.begin_round(self)
        self.local_runner = runner
        if (runner.name, reason) != self._runner_choice and self.process_rank == 0:
            log.info("Local execution: %s (%s).", runner.name, reason)
        self._runner_choice = (runner.name, reason)

    def _quarantine(self, rnd: _Round, client_id: int, loss: float) -> None:
        rnd.stats[_QUARANTINED] += 1
        rnd.quarantined.append(client_id)
        stop = self.divergence.on_nonfinite_client == "stop"
        log.warning(
            "Round %d: client %d produced a non-finite update (loss %.4g); %s (divergence.on_nonfinite_client=%s).",
            rnd.round_idx,
            client_id,
            loss,
            "the run stops" if stop else "it is quarantined, not aggregated",
            self.divergence.on_nonfinite_client,
        )

    def _check_attempt(self, rnd: _Round) -> None:
        """Stop a diverged round on every process (the reduced statistics are the same on each)."""
        quarantined, trained = int(rnd.stats[_QUARANTINED]), int(rnd.stats[_TRAINED])
        self._quarantined_total += quarantined
        if quarantined and (self.divergence.on_nonfinite_client == "stop" or trained == 0):
            first = min(self._gather_ids(rnd.quarantined))
            if trained == 0 and quarantined > 1:
                who = f"Client {first} and all other clients produced non-finite updates"
            elif quarantined > 1:
                who = f"Client {first} and {quarantined - 1} other client(s) produced non-finite updates"
            else:
                who = f"Client {first} produced a non-finite update"
            raise DivergenceError(f"{who} in round {rnd.round_idx}; {self._divergence_fix('clients')}.")
        if self._start_loss is None and trained and rnd.round_idx == 0:
            count = float(rnd.stats[_START_COUNT])
            start = float(rnd.stats[_START_SUM]) / count if count else float(rnd.stats[_LOSS]) / trained
            self._start_loss = start if math.isfinite(start) and start > 0 else None
        if trained:
            loss = float(rnd.stats[_LOSS]) / trained
            if exploded(loss=loss, start=self._start_loss, max_ratio=self.divergence.max_loss_ratio):
                raise DivergenceError(
                    f"Training diverged in round {rnd.round_idx}: the clients' mean loss is {loss:.4g} "
                    f"against {self._start_loss or float('nan'):.4g} at the start (divergence.max_loss_ratio="
                    f"{self.divergence.max_loss_ratio:g}); {self._divergence_fix('clients')}."
                )
        if not bool(torch.isfinite(rnd.aggregator.sums.sum())):
            raise DivergenceError(
                f"The aggregate of round {rnd.round_idx} is non-finite; {self._divergence_fix('clients')}."
            )

    def reliability_summary(self) -> dict[str, float | int]:
        """Run totals of failures and divergence for ``summary.json``: the engine's and its callbacks'."""
        totals: dict[str, float | int] = {"failures/quarantined_total": self._quarantined_total}
        if self._start_loss is not None:
            totals["divergence/start_loss"] = self._start_loss
        for cb in self.federated_callbacks():
            totals.update(cb.summary_metrics())
        return totals

    def _gather_ids(self, ids: list[int]) -> list[int]:
        """``ids`` of every process (a collective: call it on every process or on none)."""
        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return list(ids)
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(ids))
        return [cid for part in parts for cid in part]

    def _verdict(self, rnd: _Round) -> Verdict:
        """The first callback verdict other than apply, else apply."""
        for cb in rnd.callbacks:
            verdict = cb.round_verdict(self.trainer, self, rnd.round_idx, rnd.attempt, rnd.aggregator)
            if verdict != "apply":
                return verdict
        return "apply"

    def _divergence_fix(self, side: Literal["clients", "server"]) -> str:
        """The likely key to change, as the end of a sentence."""
        if side == "server" and not self.sets_server_state:
            inner = self.server_optimizer(self.server_parameters())  # a probe: its settings, not its state
            group = inner.param_groups[0]
            plain = type(inner) is torch.optim.SGD and group.get("lr") == 1.0 and not group.get("momentum")
            if not plain:  # FedAvg's plain averaging step cannot explode by itself
                return f"lower the server learning rate (method.server_optimizer.lr) from {group.get('lr'):g}"
        try:
            client_lr = f" from {self.client_optimizer([nn.Parameter(torch.zeros(1))]).param_groups[0]['lr']:g}"
        except Exception:  # a factory that needs more than plain parameters
            client_lr = ""
        clip = "set method.max_grad_norm" if self.max_grad_norm is None else "lower method.max_grad_norm"
        return f"lower the client learning rate (method.client_optimizer.lr){client_lr} or {clip}"

    def _check_global_loss(self, what: str, loss: float) -> None:
        """Stop when the global model's held-out loss is non-finite or exploded."""
        if exploded(loss=loss, start=self._start_loss, max_ratio=self.divergence.max_loss_ratio):
            start = "" if self._start_loss is None else f" against {self._start_loss:.4g} at the start"
            when = f"after round {self.global_step - 1}" if self.global_step else "before training"
            raise DivergenceError(
                f"Training diverged {when}: the global model's {what} loss is "
                f"{loss:.4g}{start}; {self._divergence_fix('server')}."
            )

    def _select(self, rnd: _Round) -> None:
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

    def _broadcast(self, rnd: _Round) -> tuple[Tensor, Message]:
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

    def _client_downlink(self, rnd: _Round, client_id: int, state: Tensor, broadcast: Message) -> Tensor:
        """Phase *downlink*, per client: the message this client receives, observed and decoded."""
        message = broadcast
        if self.per_client_downlink:
            own = self.client_downlink(client_id=client_id, round_idx=rnd.round_idx, broadcast=state)
            message = self.downlink_channel.codec.encode(own)
        for cb in rnd.callbacks:
            cb.on_client_downlink(self.trainer, self, rnd.round_idx, client_id, message)
        return rnd.received_broadcast if message is broadcast else message.decode().to(self.device)

    def _choose_and_upload(self, rnd: _Round, buffered: list[tuple[int, ClientResult]]) -> None:
        """Phase *choose*: the sampler sees every cohort member's ‖update‖₂, then the chosen upload.

        The choice protocol's control messages are observed per client. With the normalised
        estimator every member that computed counts in the total weight, whether it was chosen,
        and whether its upload then arrived or was lost.
        """
        assert rnd.sampler is not None
        norms = torch.zeros(len(rnd.cohort), dtype=torch.float64)
        position = {cid: k for k, cid in enumerate(rnd.cohort.client_ids)}
        for client_id, result in buffered:
            norms[position[client_id]] = float(result.upload.double().norm())
        choice: UploadChoice = rnd.sampler.choose_uploaders(self.trainer, self, rnd.cohort, self.reduce_sum(norms))
        control = Float32Codec()
        for client_id, _ in buffered:
            directions: tuple[tuple[Direction, dict[int, Tensor]], ...] = (
                ("up", choice.uplink_control),
                ("down", choice.downlink_control),
            )
            for direction, sent in directions:
                if client_id in sent:
                    message = control.encode(sent[client_id])
                    for cb in rnd.callbacks:
                        cb.on_control_message(self.trainer, self, rnd.round_idx, client_id, direction, message)
        chosen = dict(zip(choice.uploaders.client_ids, choice.uploaders.inclusion_probabilities.tolist(), strict=True))
        for client_id, result in buffered:
            if self.aggregation == "normalised":  # every member that computed, chosen, lost or not
                assert isinstance(rnd.aggregator, WeightedMean)
                rnd.aggregator.add_mass(self.client_share(client_id=client_id, num_samples=result.num_samples))
            if client_id in chosen:
                self._upload(rnd, client_id, result, rnd.probability[client_id], choice_probability=chosen[client_id])

    def _server_step(self, rnd: _Round, *, apply: bool = True) -> None:
        """Phase *apply*: set the server state, or step the server optimiser on −Δ (unless skipped).

        The new server state is then checked to be finite (one reduction).
        """
        optimizer = self.optimizers()
        optimizer.zero_grad()  # type: ignore[union-attr]  # gradients set to None: a step without one is a no-op
        if apply and rnd.aggregator.empty:  # (a round a callback skipped says why itself)
            log.warning("Round %d: no upload reached the server; the server state is unchanged.", rnd.round_idx)
        applied = apply and not rnd.aggregator.empty
        if applied and self.sets_server_state:
            self.set_server_state(round_idx=rnd.round_idx, aggregator=rnd.aggregator)
        elif applied:
            delta = self.server_delta(round_idx=rnd.round_idx, aggregator=rnd.aggregator)
            set_flat_grad_(self.server_parameters(), -delta)
        optimizer.step()  # type: ignore[union-attr]  # also the round counter (global_step)
        if applied:
            self.downlink_channel.after_server_step(self, rnd.round_idx)  # e.g. Algorithm 1's compressed step
            total = torch.stack([p.detach().sum() for p in self.server_parameters()]).sum()
            if not bool(torch.isfinite(total)):
                raise DivergenceError(
                    f"The server state became non-finite in round {rnd.round_idx}; {self._divergence_fix('server')}."
                )

    def _log_round(self, rnd: _Round, seconds: float) -> None:
        clients = max(float(rnd.stats[_TRAINED]), 1.0)
        metrics: dict[str, Any] = {"train/loss": float(rnd.stats[_LOSS]) / clients, "time/round_s": seconds}
        metrics["failures/quarantined"] = float(rnd.stats[_QUARANTINED])
        uploads = max(rnd.aggregator.count, 1)
        for k, name in enumerate(self.client_metric_names):
            metrics[name] = float(rnd.stats[_METRICS + k]) / uploads
        metrics.update(self.server_metrics(rnd.round_idx))
        metrics["round"] = float(rnd.round_idx + 1)
        for cb in rnd.callbacks:
            cb.on_round_end(self.trainer, self, rnd.round_idx, metrics)  # each may add its scalars
        log_round_row(self.trainer, rnd.round_idx, metrics)

    def _upload(
        self,
        rnd: _Round,
        client_id: int,
        result: ClientResult,
        inclusion_probability: float,
        *,
        choice_probability: float | None = None,
    ) -> None:
        """Phases *uplink* and *accumulate* for one client: drop, or encode, decode and fold in.

        ``choice_probability`` is q_i of a client chosen after local work (see
        :meth:`_choose_and_upload`); the upload's coefficient is then divided by it.
        """
        trainer = self.trainer
        if any(cb.drops_upload(trainer, self, rnd.round_idx, client_id) for cb in rnd.callbacks):
            for cb in rnd.callbacks:
                cb.on_upload_dropped(trainer, self, rnd.round_idx, client_id)
            return
        channel = self.uplink_channel
        message, decoded = channel.send(
            result.upload,
            client_id=client_id,
            # (the plain codec draws nothing: no stream to derive)
            generator=None if channel.compressor is None else self.generator(rnd.round_idx, client_id, "compress"),
            state=self.client_state,
        )
        q = 1.0 if choice_probability is None else choice_probability
        for cb in rnd.callbacks:  # e.g. drop-outs at a known rate, corrected for (1.0 otherwise)
            q *= cb.arrival_probability(trainer, self, rnd.round_idx, client_id)
        self._phase_probability[client_id] = inclusion_probability * q
        for cb in rnd.callbacks:
            cb.on_client_upload(trainer, self, rnd.round_idx, client_id, message)
        decoded = decoded.to(self.device)
        self.on_upload_decoded(client_id=client_id, round_idx=rnd.round_idx, decoded=decoded)
        weight = self.upload_weight(
            client_id=client_id, num_samples=result.num_samples, inclusion_probability=inclusion_probability * q
        )
        if choice_probability is None and q == 1.0:
            rnd.aggregator.accumulate(decoded, weight=weight)
        elif choice_probability is None:  # a known arrival probability: cancels in the normalised mean
            rnd.aggregator.accumulate(decoded, weight=weight if self.aggregation == "unbiased" else weight / q)
        else:
            assert isinstance(rnd.aggregator, WeightedMean)
            if self.aggregation == "normalised":  # w_i/q_i; the cohort's weight was counted at the choice
                rnd.aggregator.accumulate(decoded, weight=weight / q, mass=0.0)
            else:  # w_i/(p_i q_i): upload_weight divided by the product; no normaliser
                rnd.aggregator.accumulate(decoded, weight=weight)
        for k, name in enumerate(self.client_metric_names):
            rnd.stats[_METRICS + k] += float(result.metrics[name])

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
        return DataLoader(_Rounds(rounds), batch_size=None)

    def val_dataloader(self) -> Any:
        return self._held_out("val")

    def test_dataloader(self) -> Any:
        return self._held_out("test")

    def _held_out(self, split: Literal["val", "test"]) -> Any:
        """This process's shard of a held-out set; the metrics' sums are all-reduced in ``compute``.

        Each process evaluates a contiguous, unpadded slice, so the reduced accuracy and loss
        are those of the whole set. A datamodule whose loaders take no shard arguments is
        evaluated in full by every process (the same value, computed ``world_size`` times).
        """
        loader = getattr(self.datamodule, f"{split}_dataloader")
        if self.world_size == 1 or "world_size" not in inspect.signature(loader).parameters:
            return loader()
        return loader(rank=self.process_rank, world_size=self.world_size)

    def on_fit_start(self) -> None:
        if self.world_size > 1 and not dist.is_initialized():  # reduce_sum and the metrics use its collectives
            raise ConfigError(
                f"{self.world_size} processes share the cohort but torch.distributed is not initialised "
                f"({type(self.trainer.strategy).__name__}); use trainer=ddp."
            )
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
        self.client_state.refusal = (  # channels are attached (callbacks' setup) by now
            f"{type(self).__name__} declares stateless_clients, so its cohort is dealt to the processes by "
            "load; set stateless_clients = False on a method that keeps per-client state"
            if self.deals_cohort
            else None
        )
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
        # A distributed sampler would hand each process a part of the rounds and pad the
        # held-out sets with repeats; the engine shards the cohort and the held-out sets itself.
        loader = self.trainer.train_dataloader
        if self.world_size > 1 and isinstance(getattr(loader, "sampler", None), DistributedSampler):
            raise ConfigError(
                "Several processes need Trainer(use_distributed_sampler=False) "
                "(trainer.use_distributed_sampler=false): the engine shards each round's cohort itself."
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def _eval_step(self, batch: tuple[Tensor, Tensor], score: Metric, loss_metric: MeanMetric) -> None:
        x, y = batch
        out = self(x)
        if self.task == "regression":
            out = out.reshape(y.shape)
        score.update(out, y)
        loss_metric.update(self.loss_fn(out, y), weight=len(y))

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_score, self.val_loss)

    def on_validation_epoch_end(self) -> None:
        self._end_evaluation("val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_score, self.test_loss)

    def on_test_epoch_end(self) -> None:
        self._end_evaluation("test")

    def evaluation_metrics(self, stage: Literal["val", "test"]) -> list[Metric]:
        """The metrics one evaluation pass updates (override to add a method's own).

        Each is built with ``sync_on_compute=False`` and reduces by sum: at the pass's end every
        state of every one of them is summed across processes in a single all-reduce.
        """
        return [self.val_score, self.val_loss] if stage == "val" else [self.test_score, self.test_loss]

    def log_evaluation(self, stage: Literal["val", "test"]) -> None:
        """Log one evaluation pass's results (its metrics hold the sums over all processes)."""
        if stage == "test":
            self._check_global_loss("test", float(self.test_loss.compute()))
            self.log(f"test/{self.score_name}", self.test_score.compute())
            self.log("test/loss", self.test_loss.compute())
            return
        score = self.val_score.compute()
        if not self.trainer.sanity_checking:
            self._check_global_loss("validation", float(self.val_loss.compute()))
        self.val_score_best.update(score)
        self.log(f"val/{self.score_name}", score, prog_bar=True)
        self.log("val/loss", self.val_loss.compute())
        self.log(f"val/{self.score_name}_best", self.val_score_best.compute())

    def _end_evaluation(self, stage: Literal["val", "test"]) -> None:
        metrics = self.evaluation_metrics(stage)
        sum_states_across_processes(metrics)  # one collective for every state
        self.log_evaluation(stage)
        for metric in metrics:
            metric.reset()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every process holds its own clients' state: the checkpoint gets all of it.
        state = self.client_state.state_dict()
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            parts: list[Any] = [None] * self.world_size
            dist.all_gather_object(parts, state)
            state = {}
            for rank, part in enumerate(parts):
                for cid, entries in part.items():
                    if cid == SERVER or cid % self.world_size == rank:
                        state[cid] = entries
        checkpoint["client_state"] = state
        checkpoint["divergence"] = {"start_loss": self._start_loss, "quarantined_total": self._quarantined_total}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.client_state.load_state_dict(checkpoint.get("client_state", {}))
        saved = checkpoint.get("divergence", {})
        self._start_loss = saved.get("start_loss")
        self._quarantined_total = int(saved.get("quarantined_total", 0))
        # Keep only this process's clients (and the server's replicated entries).
        self.client_state.retain(lambda cid: cid == SERVER or self.holds_client(cid))
