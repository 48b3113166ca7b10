"""What a sparse-model method reports at test time: density, MACs, selected features.

Methods that evaluate a sparse network (E-FLoPS, Fed-IHT, FedAvg + pruning) mix in
:class:`SparseModelReport` and implement :meth:`SparseModelReport.evaluated_parameters`.
At the end of testing it logs ``model/density`` (fraction of non-zero evaluated
parameters), ``model/nonzero``, ``model/macs`` and ``model/macs_dense`` (per-sample MACs,
:func:`~fedlightning.metrics.inference_cost.count_macs`), and, when the data module knows
the true support (synthetic regression), ``test/support_recovery``. It also writes
``selected_features.json`` (input features used by the first weight layer, with the data
module's ``probe_ids``/``gene_names`` when it has them) into the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedlightning.metrics.inference_cost import count_macs
from fedlightning.metrics.sparsity import density, selected_input_features, support_recovery

__all__ = ["SparseModelReport", "unflatten"]


def unflatten(model: nn.Module, flat: Tensor) -> dict[str, Tensor]:
    """``{name: tensor}`` views of ``flat`` shaped like ``model``'s parameters (for ``functional_call``)."""
    out: dict[str, Tensor] = {}
    offset = 0
    for name, p in model.named_parameters():
        out[name] = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    if offset != flat.numel():
        raise ValueError(f"A flat vector of {flat.numel()} values does not fit a model with {offset} parameters.")
    return out


class SparseModelReport:
    """Mixin for a ``FederatedModule`` whose evaluated network is sparse."""

    model: nn.Module
    datamodule: Any

    def evaluated_parameters(self) -> Tensor:
        """The flat parameters of the network that validation and test evaluate."""
        raise NotImplementedError

    def sparse_model_metrics(self) -> dict[str, float]:
        """``model/*`` (and ``test/support_recovery``) of the evaluated network."""
        flat = self.evaluated_parameters().detach()
        input_shape = tuple(getattr(self.datamodule, "input_shape", ()))
        macs, dense_macs, _ = count_macs(self.model, input_shape, flat)
        metrics = {
            "model/density": density(flat),
            "model/nonzero": float(torch.count_nonzero(flat)),
            "model/macs": float(macs),
            "model/macs_dense": float(dense_macs),
        }
        truth = getattr(self.datamodule, "true_support", None)
        if truth is not None:
            metrics["test/support_recovery"] = support_recovery(selected_input_features(self.model, flat), truth)
        return metrics

    def write_selected_features(self, folder: str | Path) -> Path:
        """Write ``selected_features.json``: the input features the first weight layer uses."""
        flat = self.evaluated_parameters().detach().cpu()
        chosen = selected_input_features(self.model, flat).tolist()
        first = next(p for p in self.model.parameters() if p.ndim == 2)
        weights: Tensor | None = flat[: first.numel()].reshape(first.shape)  # first 2-D parameter comes first
        if next(iter(self.model.parameters())) is not first:
            weights = None
        ids = getattr(self.datamodule, "probe_ids", None) or None
        names = getattr(self.datamodule, "gene_names", None) or None
        rows = []
        for j in chosen:
            row: dict[str, Any] = {"index": j}
            if ids:
                row["probe_id"] = ids[j]
            if names:
                row["name"] = names[j]
            if weights is not None:
                row["weights"] = weights[:, j].tolist()
            rows.append(row)
        path = Path(folder) / "selected_features.json"
        path.write_text(json.dumps({"num_selected": len(chosen), "features": rows}, indent=1))
        return path

    def report_sparse_model(self) -> None:
        """Log the sparse-model metrics and write the selected features (call in ``on_test_epoch_end``)."""
        for name, value in self.sparse_model_metrics().items():
            self.log(name, torch.tensor(value, dtype=torch.float64))  # type: ignore[attr-defined]
        trainer = self.trainer  # type: ignore[attr-defined]
        if trainer.is_global_zero:
            self.write_selected_features(trainer.default_root_dir)
