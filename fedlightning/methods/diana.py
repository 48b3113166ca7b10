"""DIANA and VR-DIANA (thesis Ch. 3, Algorithm 2): compress gradient *differences* to learned shifts.

Client ``i`` keeps a shift ``h_i`` (``module.client_state``, zero at start) and uploads
``g_i − h_i``; the uplink callback (``compressor=<name>``, an unbiased operator) compresses it
to ``Δ̂_i``. Both sides then set ``h_i ← h_i + α Δ̂_i`` (the server's copy is updated from the
decoded message in :meth:`DIANA.on_upload_decoded`, so client and server stay identical), and the
server steps with ``g = h + mean_i Δ̂_i`` where ``h = (1/n) Σ_i h_i`` (kept under the server
id), then ``h ← h + (α/n) Σ_i Δ̂_i``; with a cohort ``S`` the mean runs over ``S``.

Gradient estimators ``g_i`` (``variant``):

* ``"full"`` — the full local gradient: DIANA with exact gradients, converges linearly to the
  exact optimum (the shifts learn ``∇f_i(x*)``);
* ``"sgd"`` — a mini-batch gradient (the "DIANA-SGD" baseline): linear rate to a neighbourhood;
* ``"lsvrg"`` — VR-DIANA variant 1: ``∇f_iB(x) − ∇f_iB(w_i) + μ_i`` with the reference point
  ``w_i`` reset to ``x`` with probability ``batch_size/m_i`` (the client's own coin);
* ``"saga"`` — VR-DIANA variant 2: a table of per-sample gradients, refreshed at the sampled
  indices.

Parameters read from the operator's metadata when ``"auto"``:

* ``alpha = 1/(ω + 1)`` (Theorem 3.5.4, Corollary 3.5.5);
* VR variants: ``γ = 1/(L(1 + 36(ω+1)/n))`` with ``L`` the single-sample smoothness (Thm 3.5.4);
* DIANA (full/sgd): ``γ = min(α/(2μ), 1/(L(1 + 2ω/n)))`` with ``μ = l2`` (the DIANA step
  rule of Horváth et al. 2019 as we read it; ``L`` the local-objective smoothness).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, WeightedMean
from fedlightning.federated.module import ClientResult
from fedlightning.federated.rng import SERVER
from fedlightning.methods.dcsgd import GradientMethod

log = logging.getLogger(__name__)

__all__ = ["DIANA", "VRDIANA"]

_VARIANTS = ("full", "sgd", "lsvrg", "saga")


class DIANA(GradientMethod):
    """DIANA / VR-DIANA on the round engine (one iteration per round).

    Args:
        variant: ``"full"``, ``"sgd"``, ``"lsvrg"`` or ``"saga"``.
        alpha: shift learning rate, or ``"auto"`` = ``1/(ω + 1)``.
        lr: step size γ, or ``"auto"`` (see the module docstring).
        Other arguments as :class:`~fedlightning.methods.dcsgd.GradientMethod`.
    """

    supported_aggregation = ("normalised",)

    def __init__(self, *, variant: str = "full", alpha: float | str = "auto", **kwargs: Any) -> None:
        if variant not in _VARIANTS:
            raise ConfigError(f"method.variant must be one of {', '.join(_VARIANTS)} (got {variant!r}).")
        kwargs.setdefault("full_gradient", variant == "full")
        super().__init__(**kwargs)
        if isinstance(alpha, str) and alpha != "auto":
            raise ConfigError(f"method.alpha must be a number or 'auto' (got {alpha!r}).")
        self.variant = variant
        self.alpha_setting = alpha
        self.alpha = float(alpha) if not isinstance(alpha, str) else float("nan")

    # ------------------------------------------------------------------ parameters from metadata
    def on_fit_start(self) -> None:
        super().on_fit_start()
        meta = self.compression_metadata()
        if not meta.unbiased or meta.omega is None:
            raise ConfigError(f"DIANA needs an unbiased uplink compressor; {meta.name} is biased.")
        if meta.error_feedback:
            raise ConfigError("DIANA's shifts replace error feedback: set compressor.error_feedback=false.")
        omega, n = float(meta.omega), self.num_clients
        if self.alpha_setting == "auto":
            self.alpha = 1.0 / (omega + 1.0)
        if self.lr_setting == "auto":
            if self.variant in ("lsvrg", "saga"):
                self.lr = 1.0 / (self.sample_smoothness() * (1 + 36 * (omega + 1) / n))
            else:
                L = self.smoothness()
                self.lr = 1.0 / (L * (1 + 2 * omega / n))
                if self.l2 > 0:
                    self.lr = min(self.lr, self.alpha / (2 * self.l2))
        log.info("%s: alpha %.4g, step %.4g (compressor %s)", type(self).__name__, self.alpha, self.lr, meta)

    # ------------------------------------------------------------------ client side
    def _per_sample_grads(self, x_flat: Tensor, features: Tensor, targets: Tensor) -> Tensor:
        """(m, d) per-sample gradients of ``f_ij`` at ``x_flat`` (SAGA table)."""
        from fedlightning.federated.params import assign_flat_

        model = self.client_model
        assign_flat_(model, x_flat)
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss_one(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
            out = functional_call(model, p, (xb.unsqueeze(0),))
            loss = self.loss_fn(out, yb.unsqueeze(0))
            if self.l2:
                loss = loss + 0.5 * self.l2 * sum((v * v).sum() for v in p.values())
            return loss

        g = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, features, targets)
        return torch.cat([g[k].reshape(len(features), -1) for k in params], dim=1)

    def gradient_estimate(self, client_id: int, round_idx: int, x_flat: Tensor) -> Tensor:
        """``g_i`` of the configured variant at ``x_flat`` (updates VR state)."""
        feats, targets = self.client_data(client_id)
        m = len(targets)
        if self.variant == "full":
            return self.flat_gradient(x_flat, feats, targets)
        idx = self.sample_batch(client_id, round_idx, m)
        g_x = self.flat_gradient(x_flat, feats[idx], targets[idx])
        if self.variant == "sgd":
            return g_x
        store = self.client_state
        if self.variant == "lsvrg":
            w = store.get(client_id, "svrg_w")
            if w is None:
                w = x_flat.detach().clone()
                store.set(client_id, "svrg_w", w)
                store.set(client_id, "svrg_mu", self.flat_gradient(w, feats, targets))
            g = g_x - self.flat_gradient(w, feats[idx], targets[idx]) + store.get(client_id, "svrg_mu")
            coin = torch.rand((), generator=self.generator(round_idx, client_id, "svrg_coin"))
            if float(coin) < len(idx) / m:
                store.set(client_id, "svrg_w", x_flat.detach().clone())
                store.set(client_id, "svrg_mu", self.flat_gradient(x_flat, feats, targets))
            return g
        table = store.get(client_id, "saga_table")
        if table is None:
            table = self._per_sample_grads(x_flat, feats, targets)
            store.set(client_id, "saga_table", table)
            store.set(client_id, "saga_mean", table.mean(0))
        mean = store.get(client_id, "saga_mean")
        new_rows = self._per_sample_grads(x_flat, feats[idx], targets[idx])
        g = new_rows.mean(0) - table[idx].mean(0) + mean
        uniq, first = _unique_last(idx)
        delta = (new_rows[first] - table[uniq]).sum(0) / m
        table[uniq] = new_rows[first]
        store.set(client_id, "saga_mean", mean + delta)
        return g

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        g = self.gradient_estimate(client_id, round_idx, received)
        h = self.client_state.get(client_id, "diana_h")
        if h is None:
            h = torch.zeros_like(g)
        feats, targets = self.client_data(client_id)
        with torch.no_grad():
            loss = self.local_loss(self.client_model, feats, targets)
        return ClientResult(upload=g - h, num_samples=len(targets), loss=loss.detach())

    # ------------------------------------------------------------------ server side
    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        """Both sides apply h_i ← h_i + α Δ̂_i with the decoded message."""
        h_i = self.client_state.get(client_id, "diana_h")
        h_i = torch.zeros_like(decoded) if h_i is None else h_i
        self.client_state.set(client_id, "diana_h", h_i + self.alpha * decoded)

    def server_delta(self, *, round_idx: int, aggregator: Aggregator) -> Tensor:
        """Δ = −γ (h + mean_S Δ̂_i); then h ← h + (α/n) Σ_S Δ̂_i."""
        assert isinstance(aggregator, WeightedMean)
        mean = aggregator.result()
        h = self.client_state.get(SERVER, "diana_h")
        if h is None:
            h = torch.zeros_like(mean)
        self.client_state.set(SERVER, "diana_h", h + self.alpha * mean * aggregator.count / self.num_clients)
        return -self.lr * (h + mean)


class VRDIANA(DIANA):
    """VR-DIANA (Algorithm 2); ``variant`` is ``"lsvrg"`` (default) or ``"saga"``."""

    def __init__(self, *, variant: str = "lsvrg", **kwargs: Any) -> None:
        if variant not in ("lsvrg", "saga"):
            raise ConfigError(f"VR-DIANA's variant is 'lsvrg' or 'saga' (got {variant!r}).")
        super().__init__(variant=variant, **kwargs)


def _unique_last(idx: Tensor) -> tuple[Tensor, Tensor]:
    """Unique indices and, for each, the position of one occurrence in ``idx``."""
    uniq, inverse = torch.unique(idx, return_inverse=True)
    first = torch.empty(len(uniq), dtype=torch.long, device=idx.device)
    first[inverse] = torch.arange(len(idx), device=idx.device)
    return uniq, first
