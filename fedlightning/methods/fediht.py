"""Fed-HT and FedIter-HT: federated (iterative) hard thresholding.

Paper: Tong, Liang, Zhu, Bi, "Federated Nonconvex Sparse Learning", arXiv 2101.00052. The
server keeps a τ-sparse global model: x_{t+1} = H_τ(Σ_k w_k x_k), where H_τ keeps the τ
largest |·| of the *whole* parameter vector (here τ = m = ⌊ρ |θ|⌋, the E-FLoPS budget).
``client_threshold`` chooses the client side:

* ``"none"`` — Fed-HT: clients run local SGD and upload dense models (float32);
* ``"upload"`` — clients threshold their model once before uploading (what the third-party
  Flower baseline ``adap/flower:baselines/fedht`` calls ``iterht``);
* ``"every_step"`` — FedIter-HT: clients project onto the τ-sparse set after every local step
  (iterative hard thresholding), and upload the τ-sparse model.

Differences from the Flower port, on purpose: thresholding is global over the whole vector
(the port keeps ``num_keep`` entries per output row and never thresholds biases), and the
global model starts from the model's initialisation thresholded to τ (the port starts from
zeros, which cannot train a CNN). Sparse models cross the wire as index-coded positions plus
float32 values (:class:`~fedlightning.compression.index_coding.SparseCodec`) in both
directions; a dense upload (``"none"``) costs 32 |θ| bits. The server optimiser acts on the
aggregate as in FedAvg (SGD(lr=1) is the paper's rule) and H_τ is applied after its step.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.compression.codecs import Float32Codec
from fedlightning.compression.index_coding import SparseCodec
from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.module import ClientResult, ClientUpload, FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters
from fedlightning.metrics.sparse_report import SparseModelReport, unflatten
from fedlightning.metrics.sparsity import num_kept, top_m_mask

__all__ = ["FedIHT", "hard_threshold"]


def hard_threshold(x: Tensor, m: int) -> Tensor:
    """H_m(x): keep the m largest |x_j| of the whole vector, zero the rest.

    >>> import torch
    >>> hard_threshold(torch.tensor([0.5, -2.0, 1.0, 0.1]), 2).tolist()
    [0.0, -2.0, 1.0, 0.0]
    """
    return x * top_m_mask(x, m).to(x.dtype)


class FedIHT(SparseModelReport, FederatedModule):
    """Federated hard thresholding (Fed-HT / FedIter-HT) to density ρ.

    Args:
        density: target density ρ (``method.density``); τ = m = ⌊ρ |θ|⌋.
        client_threshold: ``"none"`` (Fed-HT), ``"upload"`` or ``"every_step"`` (FedIter-HT).
        **kwargs: the :class:`FederatedModule` arguments.
    """

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
        self.downlink_codec = SparseCodec(value_codec="float32")
        self.uplink_codec = Float32Codec() if client_threshold == "none" else SparseCodec(value_codec="float32")
        self._project_global_()

    def _project_global_(self) -> None:
        assign_flat_(self.model, hard_threshold(flat_parameters(self.model), self.m))

    def broadcast_state(self, round_idx: int) -> Tensor:
        return hard_threshold(flat_parameters(self.model), self.m)

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        model = self.client_model
        assign_flat_(model, received)
        loss, num_samples = self.local_train(client_id=client_id, round_idx=round_idx, model=model)
        local = flat_parameters(model)
        if self.client_threshold != "none":
            local = hard_threshold(local, self.m)
        # Upload the (sparse) local model itself; the server forms the weighted mean of models.
        return ClientResult(upload=local, num_samples=num_samples, loss=loss)

    def on_local_step_end(self, model: nn.Module) -> None:
        if self.client_threshold == "every_step":  # FedIter-HT: project after every local step
            assign_flat_(model, hard_threshold(flat_parameters(model), self.m))

    def server_update(self, *, round_idx: int, uploads: list[ClientUpload], cohort: Cohort) -> Tensor:
        from fedlightning.federated.aggregation import normalised_weights, weighted_mean

        weights = normalised_weights(torch.tensor([u.num_samples for u in uploads])).to(self.device)
        mean_model = weighted_mean(torch.stack([u.update for u in uploads]), weights)
        return flat_parameters(self.model) - mean_model  # −(mean client delta), as in FedAvg

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._project_global_()  # x_{t+1} = H_τ(server step on the aggregate)

    def evaluated_parameters(self) -> Tensor:
        """The τ-sparse global model."""
        return hard_threshold(flat_parameters(self.model), self.m)

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.model, unflatten(self.model, self.evaluated_parameters()), (x,))

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self.report_sparse_model()
