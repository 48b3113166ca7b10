"""Held-out evaluation of the global model: its metrics, sharded loaders and the end of a pass.

Each process evaluates a contiguous, unpadded slice of the validation or test set; the
metrics are built with ``sync_on_compute=False`` and reduce by sum, so at the end of a pass every
state of every metric is summed across processes in one all-reduce
(:func:`~fedlightning.federated.metric_sync.sum_states_across_processes`) and the score and loss
are those of the whole set. The held-out losses are checked by the divergence guard
(:mod:`fedlightning.federated.divergence`).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import R2Score

from fedlightning.errors import ConfigError
from fedlightning.federated.distribution import ProcessShare
from fedlightning.federated.metric_sync import sum_states_across_processes

if TYPE_CHECKING:
    from fedlightning.federated.divergence import DivergenceWatch


class _SquaredError(nn.Module):
    """Mean squared error with the model's (B, 1) output matched to (B,) targets."""

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        return nn.functional.mse_loss(prediction.reshape(target.shape), target)


class HeldOutEvaluation(ProcessShare):
    """Validation and test of :class:`~fedlightning.federated.module.FederatedModule` (a mixin).

    The metrics are attributes of the module (``val_score``, ``val_loss``, ``val_score_best``,
    ``test_score``, ``test_loss``), so its ``state_dict`` holds them (``val_score_best`` survives
    resume).
    """

    _divergence_watch: DivergenceWatch  # set by FederatedModule

    def _build_held_out_metrics(self, datamodule: Any) -> None:
        """The task's loss and score (accuracy, or R² for regression) and the held-out metrics."""
        self.task = getattr(datamodule, "task", "classification")
        if self.task == "classification":
            self.loss_fn: nn.Module = nn.CrossEntropyLoss()
            self.score_name = "acc"
            num_classes = int(datamodule.num_classes)
            # (summed across processes by hand at the end of each evaluation: evaluation_metrics)
            # (no per-batch argument checks: each is a host read; the data were checked when loaded)
            accuracy = functools.partial(
                MulticlassAccuracy, num_classes=num_classes, average="micro", sync_on_compute=False, validate_args=False
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
        # A non-finite loss propagates into the mean (no per-batch NaN filter, which would hide it
        # and read the device once per batch); the divergence guard stops on it at the pass's end.
        self.val_loss = MeanMetric(sync_on_compute=False, nan_strategy="disable")
        self.test_loss = MeanMetric(sync_on_compute=False, nan_strategy="disable")
        # Every process updates it with the same (reduced) score, so it needs no sync of its own.
        self.val_score_best = MaxMetric(sync_on_compute=False)
        self.val_score_best.persistent(True)  # survives resume

    def val_dataloader(self) -> Any:
        return self._held_out("val")

    def test_dataloader(self) -> Any:
        return self._held_out("test")

    def _held_out(self, split: Literal["val", "test"]) -> Any:
        """This process's shard of a held-out set, served on the module's device; the metrics' sums are all-reduced.

        Each process evaluates a contiguous, unpadded slice, so the reduced accuracy and loss
        are those of the whole set. On an accelerator the shard is copied there once per
        loader (Lightning asks for one per ``fit`` or ``test``), so a pass moves no batch from
        the host. A datamodule whose loaders take no shard arguments is evaluated in full by
        every process (the same value, computed ``world_size`` times); one whose loaders take
        no ``device`` serves its batches from the host.
        """
        loader = getattr(self.datamodule, f"{split}_dataloader")
        accepts = inspect.signature(loader).parameters
        options: dict[str, Any] = {}
        if self.world_size > 1 and "world_size" in accepts:
            options.update(rank=self.process_rank, world_size=self.world_size)
        if self.device.type != "cpu" and "device" in accepts:
            options["device"] = self.device
        return loader(**options)

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
            score, loss = torch.stack([self.test_score.compute().float(), self.test_loss.compute().float()]).tolist()
            self._divergence_watch.check_global_loss("test", loss)
            self.log(f"test/{self.score_name}", score)
            self.log("test/loss", loss)
            return
        # one host read of the pass's results
        score, loss = torch.stack([self.val_score.compute().float(), self.val_loss.compute().float()]).tolist()
        if not self.trainer.sanity_checking:
            self._divergence_watch.check_global_loss("validation", loss)
        self.val_score_best.update(self.val_score.compute())
        self.log(f"val/{self.score_name}", score, prog_bar=True)
        self.log("val/loss", loss)
        self.log(f"val/{self.score_name}_best", float(self.val_score_best.compute()))

    def _end_evaluation(self, stage: Literal["val", "test"]) -> None:
        metrics = self.evaluation_metrics(stage)
        sum_states_across_processes(metrics)  # one collective for every state
        self.log_evaluation(stage)
        for metric in metrics:
            metric.reset()
