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
* ``"lsvrg"`` — VR-DIANA variant 1: ``∇f_iB(x) − ∇f_iB(w_i) + μ_i``; after computing it every
  client resets its reference point ``w_i`` to ``x`` when the round's single coin ``u^k`` (drawn
  by the server with probability ``1/m``, ``m = max_i m_i``, and sent with ``x`` as a one-bit
  control message, counted in the downlink bits) is 1;
* ``"saga"`` — VR-DIANA variant 2: a table of per-sample gradients, refreshed at the sampled
  indices.

With ``l1 > 0`` the server step is Algorithm 2's proximal one, ``x ← prox_{γR}(x − γ g)`` for
``R = l1‖x‖₁`` (soft thresholding), and the logged objective includes ``R``.

Parameters read from the operator's metadata when ``"auto"`` (thesis arXiv 2207.00392, Ch. 3):

* ``alpha = 1/(ω + 1)`` (Theorem 3.5.4, Corollary 3.5.5);
* VR variants: ``γ = 1/(L(1 + 36(ω+1)/n))`` with ``L`` the single-sample smoothness (Thm 3.5.4);
* DIANA with full gradients is Algorithm 2 with ``m = 1`` (each ``f_i`` is its own single
  term, the L-SVRG estimator is then ``∇f_i(x)``), so its thesis step is the same
  ``γ = 1/(L(1 + 36(ω+1)/n))`` with ``L`` the local-objective smoothness;
* DIANA-SGD (no variance reduction; the thesis states no step for it): the same rule with the
  local-objective ``L``.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from fedlightning.compression.codecs import BitPackCodec
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, WeightedMean
from fedlightning.federated.module import ClientResult
from fedlightning.federated.params import flat_parameters
from fedlightning.federated.rng import SERVER
from fedlightning.methods.dcsgd import GradientMethod

log = logging.getLogger(__name__)

__all__ = ["DIANA", "VRDIANA", "soft_threshold", "vr_diana_step"]

_VARIANTS = ("full", "sgd", "lsvrg", "saga")


class DIANA(GradientMethod):
    """DIANA / VR-DIANA on the round engine (one iteration per round).

    Args:
        variant: ``"full"``, ``"sgd"``, ``"lsvrg"`` or ``"saga"``.
        alpha: shift learning rate, or ``"auto"`` = ``1/(ω + 1)``.
        l1: weight of ``R = l1‖x‖₁``; ``> 0`` makes the server step proximal (Algorithm 2).
        lr: step size γ, or ``"auto"`` (see the module docstring).
        Other arguments as :class:`~fedlightning.methods.dcsgd.GradientMethod`.
    """

    supported_aggregation = ("normalised",)
    uplink_needs_unbiased: ClassVar[bool] = True
    """The step rule reads the uplink operator's ω, and the shifts h_i replace error feedback: the
    pre-flight (:mod:`fedlightning.preflight`) refuses a biased ``compressor=`` or one with error feedback."""

    def __init__(self, *, variant: str = "full", alpha: float | str = "auto", l1: float = 0.0, **kwargs: Any) -> None:
        if variant not in _VARIANTS:
            raise ConfigError(f"method.variant must be one of {', '.join(_VARIANTS)} (got {variant!r}).")
        kwargs.setdefault("full_gradient", variant == "full")
        super().__init__(**kwargs)
        if isinstance(alpha, str) and alpha != "auto":
            raise ConfigError(f"method.alpha must be a number or 'auto' (got {alpha!r}).")
        if l1 < 0:
            raise ConfigError(f"method.l1 must be non-negative (got {l1}).")
        self.l1 = float(l1)
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
            L = self.sample_smoothness() if self.variant in ("lsvrg", "saga") else self.smoothness()
            self.lr = vr_diana_step(smoothness=L, omega=omega, num_clients=n)
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

    def gradient_estimate(self, client_id: int, round_idx: int, x_flat: Tensor, *, coin: bool | None = None) -> Tensor:
        """``g_i`` of the configured variant at ``x_flat`` (updates VR state).

        ``coin``: the L-SVRG reset coin as the client received it (``None``: read the round's draw).
        """
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
            if self.reference_coin(round_idx) if coin is None else coin:
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
        coin = self.receive_coin(client_id, round_idx) if self.variant == "lsvrg" else None
        g = self.gradient_estimate(client_id, round_idx, received, coin=coin)
        h = self.client_state.get(client_id, "diana_h")
        if h is None:
            h = torch.zeros_like(g)
        feats, targets = self.client_data(client_id)
        with torch.no_grad():
            loss = self.local_loss(self.client_model, feats, targets)
        return ClientResult(upload=g - h, num_samples=len(targets), loss=loss.detach())

    def reference_coin(self, round_idx: int) -> bool:
        """Algorithm 2's ``u^k``: one coin per round, 1 with probability ``1/m`` (``m = max_i m_i``).

        Drawn from the server's stream of the round, so every client sees the same value; the
        server sends it to each client as a one-bit control message (:meth:`receive_coin`).
        """
        if getattr(self, "_coin", (None, False))[0] != round_idx:
            if getattr(self, "_max_m", None) is None:
                self._max_m = max(len(self.client_data(c)[1]) for c in range(self.num_clients))
            m = self._max_m
            draw = float(torch.rand((), generator=self.generator(round_idx, SERVER, "svrg_coin")))
            self._coin = (round_idx, draw < 1.0 / m)
        return self._coin[1]

    def receive_coin(self, client_id: int, round_idx: int) -> bool:
        """Client ``client_id`` receives ``u^k``: a one-bit downlink control message, counted by the accountant."""
        message = BitPackCodec().encode(torch.tensor([float(self.reference_coin(round_idx))]))
        for cb in self.federated_callbacks():
            cb.on_control_message(self.trainer, self, round_idx, client_id, "down", message)
        return bool(message.decode()[0])

    def objective(self) -> float:
        """``(1/n) Σ_i f_i(x) + R(x)`` with ``R = l1‖x‖₁``."""
        value = super().objective()
        if self.l1:
            with torch.no_grad():
                value += self.l1 * float(sum(p.abs().sum() for p in self.model.parameters()))
        return value

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
        step = -self.lr * (h + mean)
        if not self.l1:
            return step
        x = flat_parameters(self.model).to(step.device)
        return soft_threshold(x + step, self.lr * self.l1) - x  # x ← prox_{γR}(x − γ g)


class VRDIANA(DIANA):
    """VR-DIANA (Algorithm 2); ``variant`` is ``"lsvrg"`` (default) or ``"saga"``."""

    def __init__(self, *, variant: str = "lsvrg", **kwargs: Any) -> None:
        if variant not in ("lsvrg", "saga"):
            raise ConfigError(f"VR-DIANA's variant is 'lsvrg' or 'saga' (got {variant!r}).")
        super().__init__(variant=variant, **kwargs)


def vr_diana_step(*, smoothness: float, omega: float, num_clients: int) -> float:
    """γ = 1/(L(1 + 36(ω + 1)/n)), Theorem 3.5.4 of arXiv 2207.00392.

    >>> vr_diana_step(smoothness=2.0, omega=0.0, num_clients=36)
    0.25
    """
    return 1.0 / (smoothness * (1.0 + 36.0 * (omega + 1.0) / num_clients))


def soft_threshold(x: Tensor, tau: float) -> Tensor:
    """``prox_{τ‖·‖₁}(x) = sign(x) max(|x| − τ, 0)``.

    >>> soft_threshold(torch.tensor([1.5, 0.2, -3.0]), 1.0).tolist()
    [0.5, 0.0, -2.0]
    """
    return torch.sign(x) * (x.abs() - tau).clamp(min=0.0)


def _unique_last(idx: Tensor) -> tuple[Tensor, Tensor]:
    """Unique indices and, for each, the position of one occurrence in ``idx``."""
    uniq, inverse = torch.unique(idx, return_inverse=True)
    first = torch.empty(len(uniq), dtype=torch.long, device=idx.device)
    first[inverse] = torch.arange(len(idx), device=idx.device)
    return uniq, first
