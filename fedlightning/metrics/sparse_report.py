"""What a sparse-model method reports at test time: density, MACs, selected features.

Pure helpers over an evaluated flat parameter vector; the Lightning side is the callback
:class:`fedlightning.callbacks.sparse_report.SparseModelReport`, which methods whose
evaluated network is sparse (E-FLoPS, Fed-IHT, FedAvg + pruning) name in ``needed_callbacks``.

* :func:`sparse_model_metrics`: ``model/density`` (fraction of non-zero evaluated
  parameters), ``model/nonzero``, ``model/macs`` and ``model/macs_dense`` (per-sample MACs,
  :func:`~fedlightning.metrics.inference_cost.count_macs`) and, when the data module knows the
  true support (synthetic regression), ``test/support_recovery``;
* :func:`write_selected_features`: ``selected_features.json``, the input features used by the
  first weight layer, with the data module's ``probe_ids``/``gene_names`` when it has them.

>>> import types, torch
>>> from torch import nn
>>> flat = torch.tensor([0.0, 2.0, 0.0, 1.0])  # nn.Linear(3, 1): weights [0, 2, 0], bias 1
>>> sparse_model_metrics(nn.Linear(3, 1), flat, types.SimpleNamespace(input_shape=(3,)))
{'model/density': 0.5, 'model/nonzero': 2.0, 'model/macs': 1.0, 'model/macs_dense': 3.0}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fedlightning.metrics.inference_cost import count_macs
from fedlightning.metrics.sparsity import density, selected_input_features, support_recovery

__all__ = ["sparse_model_metrics", "unflatten", "write_selected_features"]


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


def sparse_model_metrics(model: nn.Module, flat: Tensor, datamodule: Any) -> dict[str, float]:
    """``model/*`` (and ``test/support_recovery``) of ``model`` evaluated at the parameters ``flat``."""
    flat = flat.detach()
    input_shape = tuple(getattr(datamodule, "input_shape", ()))
    macs, dense_macs, _ = count_macs(model, input_shape, flat)
    metrics = {
        "model/density": density(flat),
        "model/nonzero": float(torch.count_nonzero(flat)),
        "model/macs": float(macs),
        "model/macs_dense": float(dense_macs),
    }
    truth = getattr(datamodule, "true_support", None)
    if truth is not None:
        metrics["test/support_recovery"] = support_recovery(selected_input_features(model, flat), truth)
    return metrics


def write_selected_features(model: nn.Module, flat: Tensor, datamodule: Any, folder: str | Path) -> Path:
    """Write ``selected_features.json``: the input features the first weight layer of ``model`` uses."""
    flat = flat.detach().cpu()
    chosen = selected_input_features(model, flat).tolist()
    first = next(p for p in model.parameters() if p.ndim == 2)
    weights: Tensor | None = flat[: first.numel()].reshape(first.shape)  # first 2-D parameter comes first
    if next(iter(model.parameters())) is not first:
        weights = None
    ids = getattr(datamodule, "probe_ids", None) or None
    names = getattr(datamodule, "gene_names", None) or None
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
