"""Fed-HT and FedIter-HT: federated (iterative) hard thresholding.

Paper: Tong, Liang, Zhu, Bi, "Federated Nonconvex Sparse Learning", arXiv 2101.00052. The
server keeps a τ-sparse global model: x_{t+1} = H_τ(Σ_k w_k x_k), where H_τ keeps the τ
largest |·| of the *whole* parameter vector (here τ = m = ⌊ρ |θ|⌋, the E-FLoPS budget) and
w_k = n_k / Σ_{k∈S} n_k over the uploaders (sample-weighted, normalised). The server sets this
state itself from the aggregated models (no server optimiser). ``client_threshold`` chooses
the client side:

* ``"none"``: Fed-HT; clients run local SGD and upload dense models (float32);
* ``"upload"``: clients threshold their model once before uploading;
* ``"every_step"``: FedIter-HT; clients project onto the τ-sparse set after every local step
  (iterative hard thresholding), and upload the τ-sparse model.

Choices of this implementation: thresholding is global over the whole vector, biases
included (not per output row), and the global model starts from the model's initialisation
thresholded to τ (a start from zeros cannot train a CNN). Sparse models cross the wire as
index-coded positions plus float32 values
(:class:`~fedlightning.compression.index_coding.SparseCodec`, payload
``Payload.SPARSE_MODEL``) in both directions; a dense upload (``"none"``, ``Payload.MODEL``)
costs 32 |θ| bits.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.compression.index_coding import SparseCodec
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, Estimator, WeightedMean
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.metrics.sparse_report import unflatten
from fedlightning.metrics.sparsity import num_kept, top_m_mask

__all__ = ["FedIHT", "hard_threshold", "iterative_hard_thresholding"]


def hard_threshold(x: Tensor, m: int) -> Tensor:
    """H_m(x): keep the m largest |x_j| of the whole vector, zero the rest.

    >>> import torch
    >>> hard_threshold(torch.tensor([0.5, -2.0, 1.0, 0.1]), 2).tolist()
    [0.0, -2.0, 1.0, 0.0]
    """
    return x * top_m_mask(x, m).to(x.dtype)


def iterative_hard_thresholding(
    x: np.ndarray, y: np.ndarray, *, m: int, loss: Literal["squared", "logistic"], steps: int = 1000
) -> np.ndarray:
    """Centralised IHT on θ = [w, b]: θ ← H_m(θ − η ∇f(θ)) from θ = 0, η = 1/L.

    The centralised counterpart of Fed-HT (Blumensath & Davies, "Iterative hard thresholding
    for compressed sensing", 2009; Tong et al., arXiv 2101.00052): f is the mean squared
    error /2 (L = σ_max([X, 1])² / n) or the mean logistic loss for y ∈ {0, 1}
    (L = σ_max([X, 1])² / (4 n)); H_m keeps the m largest |θ_j|, bias included, like the
    federated methods' budget m = ⌊ρ |θ|⌋.

    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    >>> iterative_hard_thresholding(x, np.array([3.0, 1.0, -3.0, -1.0]), m=1, loss="squared").round(6).tolist()
    [3.0, 0.0, 0.0]
    """
    xb = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    n = len(xb)
    lipschitz = float(np.linalg.norm(xb, 2) ** 2) / n / (4.0 if loss == "logistic" else 1.0)
    eta = 1.0 / lipschitz
    theta = np.zeros(xb.shape[1])
    for _ in range(steps):
        pred = xb @ theta
        residual = (1.0 / (1.0 + np.exp(-pred)) if loss == "logistic" else pred) - y
        theta = theta - eta * (xb.T @ residual) / n
        keep = np.argsort(-np.abs(theta), kind="stable")[:m]
        pruned = np.zeros_like(theta)
        pruned[keep] = theta[keep]
        theta = pruned
    return theta


class FedIHT(FederatedModule):
    """Federated hard thresholding (Fed-HT / FedIter-HT) to density ρ.

    Args:
        density: target density ρ (``method.density``); τ = m = ⌊ρ |θ|⌋.
        client_threshold: ``"none"`` (Fed-HT), ``"upload"`` or ``"every_step"`` (FedIter-HT).
        **kwargs: the :class:`FederatedModule` arguments (no ``server_optimizer``).
    """

    uplink_payload = Payload.SPARSE_MODEL
    downlink_payload = Payload.SPARSE_MODEL
    sets_server_state = True
    needed_callbacks = ("sparse_report",)  # the test-time sparse-model report (fedlightning.callbacks.declared)
    client_weighting = "samples"
    stateless_clients = True  # a client trains from the broadcast H_τ(x) and keeps nothing
    supported_aggregation: ClassVar[tuple[Estimator, ...]] = ("normalised",)
    """The new state is a mean of *models*: Σ (w_i/p_i) x_i would rescale the model itself."""

    def __init__(
        self,
        *,
        density: float,
        client_threshold: Literal["none", "upload", "every_step"] = "every_step",
        **kwargs: Any,
    ) -> None:
        model: nn.Module = kwargs["model"]
        try:
            m = num_kept(density, num_parameters(model))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if client_threshold not in ("none", "upload", "every_step"):
            raise ConfigError(
                f"method.client_threshold={client_threshold!r} is unknown; choose none, upload or every_step."
            )
        super().__init__(**kwargs)
        self.rho = float(density)
        self.m = m
        self.client_threshold = client_threshold
        self.downlink_channel.codec = SparseCodec(value_codec="float32")
        if client_threshold == "none":  # Fed-HT: dense float32 models (the engine's default codec)
            self.uplink_channel.payload = Payload.MODEL
        else:
            self.uplink_channel.codec = SparseCodec(value_codec="float32")
        assign_flat_(self.model, hard_threshold(flat_parameters(self.model), self.m))  # x_0 = H_τ(init)

    # ------------------------------------------------------------------ server
    def broadcast_state(self, round_idx: int) -> Tensor:
        return hard_threshold(flat_parameters(self.model), self.m)

    def make_aggregator(self, round_idx: int) -> Aggregator:
        """Σ_k w_k x_k and Σ_k w_k over the uploaded models (normalised in :meth:`set_server_state`)."""
        return WeightedMean(dim=num_parameters(self.model), normalise=True, device=self.device)

    def set_server_state(self, *, round_idx: int, aggregator: Aggregator) -> None:
        """x_{t+1} = H_τ(Σ_k w_k x_k / Σ_k w_k)."""
        assert isinstance(aggregator, WeightedMean)
        assign_flat_(self.model, hard_threshold(aggregator.result(), self.m))

    # ------------------------------------------------------------------ client
    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local training from the broadcast; uploads the local model (thresholded unless ``"none"``)."""
        model = self.client_model
        assign_flat_(model, received)
        model.train()

        def project() -> None:  # FedIter-HT: back onto the τ-sparse set after every local step
            assign_flat_(model, hard_threshold(flat_parameters(model), self.m))

        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=model.parameters(),
            batch_loss=lambda x, y: self.local_loss(model, x, y),
            after_step=project if self.client_threshold == "every_step" else None,
        )
        local = flat_parameters(model)
        if self.client_threshold != "none":
            local = hard_threshold(local, self.m)
        return ClientResult(upload=local, num_samples=done.num_samples, loss=done.loss)

    # ------------------------------------------------------------------ evaluation
    def evaluated_parameters(self) -> Tensor:
        """The τ-sparse global model."""
        return hard_threshold(flat_parameters(self.model), self.m)

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.model, unflatten(self.model, self.evaluated_parameters()), (x,))
