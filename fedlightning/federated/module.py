"""``FederatedModule``: one Lightning ``training_step`` is one federated round.

The base class owns the round (cohort → broadcast → local training → uplink → aggregation →
server step), the callbacks, the client state store and the random streams. A method
overrides a few hooks:

* :meth:`broadcast_state` — the flat tensor the server sends (default: global weights);
* :meth:`client_update` — what one client does with what it received (default: local SGD
  on :meth:`local_loss`, upload the model delta);
* :meth:`server_update` — combine the decoded uploads into a pseudo-gradient for the server
  optimiser (default: FedAvg's sample-weighted mean delta, negated).

Clients train a single reused model that is hidden from the module registry, so it is not
checkpointed, not moved by DDP and never aliases the global weights (lightning-fl-notes P1,
P8, P9). Clients use plain ``torch.optim`` optimisers; the server optimiser is the one
Lightning optimiser, so ``global_step`` counts rounds (P2).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics import MaxMetric, MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import R2Score

from fedlightning.compression.codecs import Float32Codec
from fedlightning.errors import ConfigError, NonFiniteLossError
from fedlightning.federated.aggregation import normalised_weights, weighted_mean
from fedlightning.federated.batches import local_batches
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.message import Codec, Message
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters, set_flat_grad_
from fedlightning.federated.rng import torch_generator
from fedlightning.federated.state import ClientStateStore

if TYPE_CHECKING:
    from fedlightning.datamodules.base import FederatedDataModule

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[Iterable[Tensor]], torch.optim.Optimizer]


@dataclass
class ClientResult:
    """What local training produced on one client, before encoding."""

    upload: Tensor
    num_samples: int
    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientUpload:
    """One client's upload as the server decoded it."""

    client_id: int
    update: Tensor
    num_samples: int


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
            (a fresh optimiser per client per round).
        server_optimizer: factory for the server optimiser over :meth:`server_parameters`
            (``SGD(lr=1)`` is FedAvg; see ``fedlightning.federated.server_optim``).
        local_epochs: passes over the client's data per round.
        local_steps: if set, exactly this many local mini-batch steps instead of epochs.
        batch_size: local mini-batch size.
        max_grad_norm: optional clipping of each local gradient.
    """

    uplink_codec: Codec = Float32Codec()
    downlink_codec: Codec = Float32Codec()

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
    ) -> None:
        super().__init__()
        if local_epochs < 1:
            raise ConfigError(f"method.local_epochs must be at least 1 (got {local_epochs}).")
        if local_steps is not None and local_steps < 1:
            raise ConfigError(f"method.local_steps must be at least 1 or null (got {local_steps}).")
        if batch_size < 1:
            raise ConfigError(f"method.batch_size must be at least 1 (got {batch_size}).")
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
        self.client_optimizer = client_optimizer or (lambda params: torch.optim.SGD(params, lr=0.05))
        self.server_optimizer = server_optimizer or (lambda params: torch.optim.SGD(params, lr=1.0))
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.max_grad_norm = max_grad_norm
        self.client_state = ClientStateStore()
        self.task = getattr(datamodule, "task", "classification")
        if self.task == "classification":
            self.loss_fn: nn.Module = nn.CrossEntropyLoss()
            self.score_name = "acc"
            num_classes = int(datamodule.num_classes)
            self.val_score: Metric = MulticlassAccuracy(num_classes=num_classes, average="micro")
            self.test_score: Metric = MulticlassAccuracy(num_classes=num_classes, average="micro")
        elif self.task == "regression":
            self.loss_fn = _SquaredError()
            self.score_name = "r2"
            self.val_score = R2Score()
            self.test_score = R2Score()
        else:
            raise ConfigError(f"Unknown data task {self.task!r}; a datamodule's task is classification or regression.")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_score_best = MaxMetric()
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

    def generator(self, round_idx: int, client_id: int, purpose: str) -> torch.Generator:
        """The CPU generator of stream (run seed, round, client, purpose)."""
        return torch_generator(seed=self.seed, round_idx=round_idx, client_id=client_id, purpose=purpose)

    # ------------------------------------------------------------------ method hooks
    def server_parameters(self) -> list[nn.Parameter]:
        """Parameters the server optimiser updates (default: the global model's)."""
        return list(self.model.parameters())

    def broadcast_state(self, round_idx: int) -> Tensor:
        """The flat tensor the server broadcasts to the cohort (default: global weights)."""
        return flat_parameters(self.model)

    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Loss of one local mini-batch (default: cross-entropy)."""
        return self.loss_fn(model(x), y)

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local training on one client from the broadcast it decoded; uploads the model delta."""
        model = self.client_model
        assign_flat_(model, received)
        loss, num_samples = self.local_train(client_id=client_id, round_idx=round_idx, model=model)
        return ClientResult(upload=flat_parameters(model) - received, num_samples=num_samples, loss=loss)

    def local_train(self, *, client_id: int, round_idx: int, model: nn.Module) -> tuple[Tensor, int]:
        """Local SGD on one client's data, in place on ``model``; returns (mean loss, samples).

        Runs ``local_epochs`` (or ``local_steps``) of :meth:`local_loss` with a fresh
        ``client_optimizer``, batches and augmentation from the client's own streams, and
        :meth:`on_local_step_end` after every step.
        """
        model.train()
        optimizer = self.client_optimizer(model.parameters())
        x, y = self.client_data(client_id)
        augment_gen = self.generator(round_idx, client_id, "augment")
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        for idx in self.client_batches(client_id=client_id, round_idx=round_idx, num_samples=len(y)):
            optimizer.zero_grad(set_to_none=True)
            loss = self.local_loss(model, self.datamodule.augment(x[idx], augment_gen), y[idx])
            loss.backward()
            if self.max_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
            optimizer.step()
            self.on_local_step_end(model)
            loss_sum += loss.detach()
            steps += 1
        return loss_sum / max(steps, 1), len(y)

    def on_local_step_end(self, model: nn.Module) -> None:
        """Called after each local optimiser step (e.g. a projection such as hard thresholding)."""

    def server_update(self, *, round_idx: int, uploads: list[ClientUpload], cohort: Cohort) -> Tensor:
        """Pseudo-gradient for the server optimiser: −(sample-weighted mean of client deltas)."""
        weights = normalised_weights(torch.tensor([u.num_samples for u in uploads]))
        return -weighted_mean(torch.stack([u.update for u in uploads]), weights.to(self.device))

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

    # ------------------------------------------------------------------ the round
    def _federated_callbacks(self) -> list[FederatedCallback]:
        return [cb for cb in self.trainer.callbacks if isinstance(cb, FederatedCallback)]  # type: ignore[attr-defined]

    def _select_cohort(self, round_idx: int) -> Cohort:
        samplers = [cb for cb in self._federated_callbacks() if isinstance(cb, ClientSampler)]
        if len(samplers) > 1:
            raise ConfigError(
                f"Only one client sampler may be active, found {len(samplers)}; keep a single sampler=... choice."
            )
        if not samplers:
            return Cohort.full(round_idx=round_idx, num_clients=self.num_clients)
        return samplers[0].select_cohort(self.trainer, self, round_idx)

    def _encode(self, encoded: Iterable[Message | None], default: Callable[[], Message]) -> Message:
        for message in encoded:
            if message is not None:
                return message
        return default()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        round_idx = self.global_step
        started = time.perf_counter()
        callbacks = self._federated_callbacks()
        for cb in callbacks:
            cb.on_round_start(self.trainer, self, round_idx)
        cohort = self._select_cohort(round_idx)
        for cb in callbacks:
            cb.on_cohort_selected(self.trainer, self, cohort)

        state = self.broadcast_state(round_idx)
        down = self._encode(
            (cb.encode_downlink(self.trainer, self, round_idx, state) for cb in callbacks),
            lambda: self.downlink_codec.encode(state),
        )
        for cb in callbacks:
            cb.on_server_broadcast(self.trainer, self, round_idx, down, cohort)
        received = down.decode().to(self.device)

        uploads: list[ClientUpload] = []
        losses: list[Tensor] = []
        for client_id in cohort.client_ids:
            result = self.client_update(client_id=client_id, round_idx=round_idx, received=received)
            self._check_finite(result, client_id, round_idx)
            message = self._encode(
                (cb.encode_uplink(self.trainer, self, round_idx, client_id, result.upload) for cb in callbacks),
                lambda: self.uplink_codec.encode(result.upload),  # noqa: B023 - called inside this iteration
            )
            for cb in callbacks:
                cb.on_client_upload(self.trainer, self, round_idx, client_id, message)
            uploads.append(ClientUpload(client_id, message.decode().to(self.device), result.num_samples))
            losses.append(result.loss)

        pseudo_gradient = self.server_update(round_idx=round_idx, uploads=uploads, cohort=cohort)
        for cb in callbacks:
            cb.on_aggregate(self.trainer, self, round_idx, pseudo_gradient)
        optimizer = self.optimizers()
        optimizer.zero_grad()  # type: ignore[union-attr]
        set_flat_grad_(self.server_parameters(), pseudo_gradient)
        optimizer.step()  # type: ignore[union-attr]

        train_loss = torch.stack(losses).mean()
        metrics: dict[str, Any] = {"train/loss": train_loss, "time/round_s": time.perf_counter() - started}
        self.log("train/loss", train_loss, on_step=True, on_epoch=False)
        self.log("time/round_s", metrics["time/round_s"], on_step=True, on_epoch=False)
        self.log("round", float(round_idx + 1), on_step=True, on_epoch=False, prog_bar=True)
        for cb in callbacks:
            cb.on_round_end(self.trainer, self, round_idx, metrics)

    def _check_finite(self, result: ClientResult, client_id: int, round_idx: int) -> None:
        if not (torch.isfinite(result.loss).all() and torch.isfinite(result.upload).all()):
            raise NonFiniteLossError(
                f"Client {client_id} produced a non-finite loss ({result.loss.item():.4g}) in round {round_idx}; "
                "lower the client learning rate (method.client_optimizer.lr) or set method.max_grad_norm."
            )

    # ------------------------------------------------------------------ Lightning plumbing
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.server_optimizer(self.server_parameters())

    def train_dataloader(self) -> DataLoader[int]:
        rounds = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 1
        return DataLoader(_Rounds(rounds), batch_size=None)

    def val_dataloader(self) -> Any:
        return self.datamodule.val_dataloader()

    def test_dataloader(self) -> Any:
        return self.datamodule.test_dataloader()

    def on_fit_start(self) -> None:
        self.client_model.to(self.device)
        if self.trainer.val_check_interval and self.trainer.check_val_every_n_epoch is not None:
            rank_zero_warn("Set trainer.check_val_every_n_epoch=null so that evaluation counts rounds.")

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
        score = self.val_score.compute()
        self.val_score_best.update(score)
        self.log(f"val/{self.score_name}", score, prog_bar=True)
        self.log("val/loss", self.val_loss.compute())
        self.log(f"val/{self.score_name}_best", self.val_score_best.compute())
        self.val_score.reset()
        self.val_loss.reset()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_score, self.test_loss)

    def on_test_epoch_end(self) -> None:
        self.log(f"test/{self.score_name}", self.test_score.compute())
        self.log("test/loss", self.test_loss.compute())
        self.test_score.reset()
        self.test_loss.reset()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["client_state"] = self.client_state.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.client_state.load_state_dict(checkpoint.get("client_state", {}))
