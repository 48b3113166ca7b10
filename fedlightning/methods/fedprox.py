"""FedProx: FedAvg whose clients minimise their loss plus a proximal term to the received model.

Paper: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
arXiv 1812.06127. Client k approximately minimises

    h_k(w; w_t) = F_k(w) + (μ/2) ‖w − w_t‖²

from w_t with its local optimiser (here every mini-batch loss carries the term, as in the
paper's reference implementation), and the server averages as FedAvg does. μ = 0 is FedAvg.

>>> w = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])}
>>> w_t = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])}
>>> float(proximal_term(w, w_t, mu=0.5))  # 0.25 · (1 + 4 + 4)
2.25
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.module import FederatedModule

__all__ = ["FedProx", "proximal_term"]


def proximal_term(params: Mapping[str, Tensor], received: Mapping[str, Tensor], *, mu: float) -> Tensor:
    """(μ/2) Σ ‖w − w_t‖² over the parameters (differentiable in ``params``, not in ``received``)."""
    total = sum((params[n] - received[n].detach()).pow(2).sum() for n in params)
    return 0.5 * mu * torch.as_tensor(total)


class FedProx(FederatedModule):
    """FedAvg with the proximal term (μ/2)‖w − w_t‖² in every client's local loss.

    Args:
        mu: μ ≥ 0, the weight of the proximal term (``method.mu``).
        **kwargs: the engine's options (:class:`~fedlightning.federated.module.FederatedModule`).
    """

    stateless_clients = True  # a client starts every round from the broadcast and keeps nothing

    def __init__(self, *, mu: float = 0.01, **kwargs: object) -> None:
        if not mu >= 0:
            raise ConfigError(f"method.mu is FedProx's proximal weight μ and must be at least 0 (got {mu}).")
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.mu = float(mu)

    @override
    def local_penalty(self, params: Mapping[str, Tensor], received: Mapping[str, Tensor]) -> Tensor | None:
        return proximal_term(params, received, mu=self.mu)
