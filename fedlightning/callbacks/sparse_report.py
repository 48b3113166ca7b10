"""``SparseModelReport``: the test-time report of a method whose evaluated network is sparse.

Methods that evaluate a sparse network (E-FLoPS, Fed-IHT, FedAvg + pruning) implement
``evaluated_parameters()`` (the flat parameters that validation and test use) and name this
callback in ``needed_callbacks``; the runner attaches it (:mod:`fedlightning.callbacks.declared`).
At the end of testing it logs ``model/density``, ``model/nonzero``, ``model/macs``,
``model/macs_dense`` and, with a known true support, ``test/support_recovery``
(:func:`fedlightning.metrics.sparse_report.sparse_model_metrics`), and the global-zero
process writes ``selected_features.json`` into ``trainer.default_root_dir``
(:func:`fedlightning.metrics.sparse_report.write_selected_features`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.metrics.sparse_report import sparse_model_metrics, write_selected_features

__all__ = ["SparseEvaluated", "SparseModelReport"]


@runtime_checkable
class SparseEvaluated(Protocol):
    """A module whose evaluated network is ``model`` at the flat parameters ``evaluated_parameters()``."""

    model: nn.Module

    @property
    def datamodule(self) -> Any: ...

    def evaluated_parameters(self) -> Tensor: ...


class SparseModelReport(L.Callback):
    """Log the sparse-model metrics and write the selected features when testing ends."""

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not isinstance(pl_module, SparseEvaluated):
            raise TypeError(f"SparseModelReport needs evaluated_parameters() on {type(pl_module).__name__}.")
        flat = pl_module.evaluated_parameters().detach()
        for name, value in sparse_model_metrics(pl_module.model, flat, pl_module.datamodule).items():
            pl_module.log(name, torch.tensor(value, dtype=torch.float64))
        if trainer.is_global_zero:
            write_selected_features(pl_module.model, flat, pl_module.datamodule, trainer.default_root_dir)
