"""FedAvg followed by post-training magnitude pruning (the E-FLoPS baseline).

Training: FedAvg (McMahan et al., arXiv 1602.05629), dense in both directions (float32).
Pruning: after training, keep the m = ⌊ρ |θ|⌋ largest |θ_j| (``scope="global"``, the
default: over the whole parameter vector, the same budget and the same selection scope as
E-FLoPS' top-m, so the two are compared at equal density) or the ⌊ρ |θ_l|⌋ largest of each
parameter tensor (``scope="layer"``), without fine-tuning (E-FLoPS, arXiv 2607.00275,
contrasts itself with "post-training pruning"). Validation and test evaluate the pruned
network; its test-time report (``model/density``, MACs, selected features) comes from the
:class:`~fedlightning.callbacks.sparse_report.SparseModelReport` callback it declares.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torch.func import functional_call

from fedlightning.errors import ConfigError
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.params import flat_parameters, num_parameters
from fedlightning.metrics.sparse_report import unflatten
from fedlightning.metrics.sparsity import num_kept, top_m_mask

__all__ = ["FedAvgPrune", "magnitude_prune"]


def magnitude_prune(flat: Tensor, sizes: list[int], rho: float, scope: Literal["global", "layer"]) -> Tensor:
    """Zero all but the largest-magnitude entries of ``flat`` (global or per parameter tensor).

    >>> import torch
    >>> magnitude_prune(torch.tensor([3.0, 1.0, -2.0, 0.5]), [2, 2], 0.5, "global").tolist()
    [3.0, 0.0, -2.0, 0.0]
    >>> magnitude_prune(torch.tensor([3.0, 1.0, -2.0, 0.5]), [2, 2], 0.5, "layer").tolist()
    [3.0, 0.0, -2.0, 0.0]
    """
    if scope == "global":
        return flat * top_m_mask(flat, num_kept(rho, flat.numel())).to(flat.dtype)
    parts = [p * top_m_mask(p, num_kept(rho, p.numel())).to(p.dtype) for p in torch.split(flat, sizes)]
    return torch.cat(parts)


class FedAvgPrune(FederatedModule):
    """Dense FedAvg, evaluated after magnitude pruning to density ρ.

    Args:
        density: target density ρ (``method.density``).
        scope: ``"global"`` or ``"layer"`` magnitude pruning.
        **kwargs: the :class:`FederatedModule` arguments.
    """

    needed_callbacks = ("sparse_report",)  # the test-time sparse-model report (fedlightning.callbacks.declared)
    stateless_clients = True  # dense FedAvg clients; pruning happens on the server's model only

    def __init__(self, *, density: float, scope: Literal["global", "layer"] = "global", **kwargs: Any) -> None:
        try:
            num_kept(density, num_parameters(kwargs["model"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if scope not in ("global", "layer"):
            raise ConfigError(f"method.scope={scope!r} is unknown; choose global or layer.")
        super().__init__(**kwargs)
        self.rho = float(density)
        self.scope = scope

    def evaluated_parameters(self) -> Tensor:
        """The pruned global model."""
        sizes = [p.numel() for p in self.model.parameters()]
        return magnitude_prune(flat_parameters(self.model), sizes, self.rho, self.scope)

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.model, unflatten(self.model, self.evaluated_parameters()), (x,))
