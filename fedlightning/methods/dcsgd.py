"""Distributed SGD with compressed gradients (thesis Algorithms 1, 4, 5, 6) on the round engine.

One round is one iteration: each client computes a gradient of its local objective
``f_i(x) = mean loss + (l2/2)‖x‖²`` at the broadcast ``x`` (the full local gradient, or a
mini-batch one with ``full_gradient=false``) and uploads the step ``−η g_i`` as a model
delta. The uplink compression callback (``compressor=<name>``) compresses it: without error
feedback this is DCSGD (Algorithm 5, ``C(η g) = η C(g)`` for the positively homogeneous
operators), with ``compressor.error_feedback=true`` it is exactly Algorithm 4/6
(``C(e_i + η g_i)``). The server averages the decoded steps uniformly (``f = (1/n) Σ f_i``) and
applies them (server SGD with lr 1); ``downlink=<name>`` (``downlink.scheme=aggregate``) adds
Algorithm 1's master compression: the server broadcasts ``C_M`` of the averaged step and every
node applies that same decoded step, so all share one ``x``
(:class:`~fedlightning.federated.downlink.AggregateDownlinkChannel`).

Step size ``lr="auto"`` reads the operator's metadata from the uplink channel
(``module.uplink_channel.metadata(d)``):

* unbiased, no EF: ``η = 1/(2 δ_n L)``, ``δ_n = ω/n + 1`` (Theorem 5.4.5);
* error feedback (any operator): ``η = 1/(14 (2δ + B) L)`` with ``B = 0`` for full
  gradients and ``B = 1`` otherwise (Theorem 4.7.5 (ii));
* biased without EF: ``η = 1/(δ L)`` (the single-node B³ rule, Theorem 4.5.3; distributed it
  may diverge, Example 4.7.1);
* a biased operator without a finite δ (Sign; Top-k followed by dithering whose ζ ≥ 2) has no
  such step size: ``lr=auto`` stops with a :class:`~fedlightning.errors.ConfigError` naming it.

``L`` is ``smoothness`` if given, else for linear models the logistic bound
``½ max_i λ_max(A_iᵀA_i/m_i) + l2`` (bias column included) computed from the client data.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.federated.channel import ChannelMetadata
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import assign_flat_, num_parameters
from fedlightning.federated.payloads import Payload

log = logging.getLogger(__name__)

__all__ = ["DCSGD", "GradientMethod"]


class GradientMethod(FederatedModule):
    """Shared machinery of one-gradient-per-round methods (DCSGD, DIANA, VR-DIANA).

    Clients upload (scaled) gradients; the server averages them uniformly over the uploaders
    (``f = (1/N) Σ f_i``) and steps with SGD(lr=1) on the mean.

    Args:
        lr: step size, or ``"auto"`` (see the method's rule).
        l2: ℓ2 regularisation ``(l2/2)‖x‖²`` inside every ``f_ij`` (makes logistic regression
            strongly convex with μ = l2).
        smoothness: ``L``; ``None`` derives it for linear models.
        full_gradient: use the full local gradient instead of a mini-batch of ``batch_size``.
        log_objective: log ``opt/objective`` (the full objective over all clients) each round.
    """

    uplink_payload = Payload.GRADIENT
    client_weighting = "uniform"

    def __init__(
        self,
        *,
        lr: float | str = "auto",
        l2: float = 0.0,
        smoothness: float | None = None,
        full_gradient: bool = True,
        log_objective: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(lr, str) and lr != "auto":
            raise ConfigError(f"method.lr must be a number or 'auto' (got {lr!r}).")
        if l2 < 0:
            raise ConfigError(f"method.l2 must be non-negative (got {l2}).")
        self.lr_setting = lr
        self.lr = float(lr) if not isinstance(lr, str) else float("nan")
        self.l2 = float(l2)
        self.smoothness_setting = smoothness
        self.full_gradient = bool(full_gradient)
        self.log_objective = bool(log_objective)
        self.objective_history: list[float] = []

    def cohort_loads(self, cohort: Cohort) -> list[float]:
        """The samples each member's one gradient reads: all of its data, or one mini-batch."""
        sizes = self.datamodule.client_sizes
        if self.full_gradient:
            return [float(sizes[cid]) for cid in cohort.client_ids]
        return [float(min(self.batch_size, sizes[cid])) for cid in cohort.client_ids]

    # ------------------------------------------------------------------ objective pieces
    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        loss = self.loss_fn(model(x), y)
        if self.l2:
            loss = loss + 0.5 * self.l2 * sum((p * p).sum() for p in model.parameters())
        return loss

    def flat_gradient(self, x_flat: Tensor, features: Tensor, targets: Tensor) -> Tensor:
        """∇ of the local loss (mean over the given samples) at flat parameters ``x_flat``."""
        model = self.client_model
        assign_flat_(model, x_flat)
        params = list(model.parameters())
        loss = self.local_loss(model, features, targets)
        grads = torch.autograd.grad(loss, params)
        return torch.cat([g.reshape(-1) for g in grads])

    def sample_batch(self, client_id: int, round_idx: int, m: int) -> Tensor:
        """Indices of one mini-batch of ``batch_size`` samples (with replacement)."""
        gen = self.generator(round_idx, client_id, "batches")
        return torch.randint(m, (min(self.batch_size, m),), generator=gen).to(self.device)

    def objective(self) -> float:
        """``(1/n) Σ_i f_i(x)`` at the global model."""
        total = 0.0
        with torch.no_grad():
            for cid in range(self.num_clients):
                x, y = self.client_data(cid)
                total += float(self.local_loss(self.model, x, y))
        return total / self.num_clients

    def _refuse_nonlinear_model(self) -> None:
        """Refuse a smoothness bound for a model whose L this class cannot compute (any but one Linear layer)."""
        linear = [m for m in self.model.modules() if isinstance(m, nn.Linear)]
        if len(linear) != 1 or sum(1 for p in self.model.parameters()) > 2:
            raise ConfigError(
                "method.lr=auto takes its step from the smoothness L of the local losses, which is computed only "
                "for a linear model (model=digits_logreg, logreg or logistic) and not for "
                f"{type(self.model).__name__}; set method.smoothness=<L> or a fixed step method.lr=<value>, "
                "or choose a linear model."
            )

    def smoothness(self) -> float:
        """``L`` of the local objectives (``smoothness`` or the logistic bound for linear models)."""
        if self.smoothness_setting is not None:
            return float(self.smoothness_setting)
        self._refuse_nonlinear_model()
        best = 0.0
        for cid in range(self.num_clients):
            x, _ = self.client_data(cid)
            a = torch.cat(
                [x.reshape(len(x), -1).double(), torch.ones(len(x), 1, dtype=torch.float64, device=x.device)], 1
            )
            best = max(best, float(torch.linalg.eigvalsh(a.T @ a / len(a))[-1]))
        return 0.5 * best + self.l2

    def sample_smoothness(self) -> float:
        """``max_j L_ij`` of single-sample losses (logistic bound), for the VR variants."""
        if self.smoothness_setting is not None:
            return float(self.smoothness_setting)
        self._refuse_nonlinear_model()
        best = 0.0
        for cid in range(self.num_clients):
            x, _ = self.client_data(cid)
            best = max(best, float((x.reshape(len(x), -1).double() ** 2).sum(1).max()) + 1.0)
        return 0.5 * best + self.l2

    def compression_metadata(self) -> ChannelMetadata:
        """ω, δ, unbiasedness and error feedback of the uplink channel's operator."""
        return self.uplink_channel.metadata(num_parameters(self.model))

    def server_metrics(self, round_idx: int) -> dict[str, float]:
        if not self.log_objective:
            return {}
        value = self.objective()
        self.objective_history.append(value)
        return {"opt/objective": value}


class DCSGD(GradientMethod):
    """Distributed (compressed) SGD; see the module docstring for the step-size rules."""

    stateless_clients = True  # a gradient at the broadcast x; error-feedback memory keeps the split by id

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.lr_setting != "auto":
            return
        meta = self.compression_metadata()
        if not meta.unbiased and not math.isfinite(meta.delta):
            raise ConfigError(
                f"method.lr=auto has no step size for the uplink compressor {meta.name}: it has no finite δ, so the "
                "thesis's rule 1/(δL) is zero; set method.lr to a number or pick a compressor with a finite δ."
            )
        L = self.smoothness()
        n = self.num_clients
        if meta.error_feedback:
            b = 0.0 if self.full_gradient else 1.0
            self.lr = 1.0 / (14 * (2 * meta.delta + b) * L)
        elif meta.unbiased:
            assert meta.omega is not None
            delta_n = meta.omega / n + 1
            self.lr = 1.0 / (2 * delta_n * L)
        else:
            self.lr = 1.0 / (meta.delta * L)
        log.info("DCSGD step size %.4g from %s and L = %.4g", self.lr, meta, L)

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        x, y = self.client_data(client_id)
        if not self.full_gradient:
            idx = self.sample_batch(client_id, round_idx, len(y))
            x, y = x[idx], y[idx]
        g = self.flat_gradient(received, x, y)
        with torch.no_grad():
            loss = self.local_loss(self.client_model, x, y)
        return ClientResult(upload=-self.lr * g, num_samples=len(y), loss=loss.detach())
