"""Zampling: Local, Federated and continuous (arXiv 2503.14246).

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246. Names follow the paper: ``p`` ∈ [0,1]^n the probability vector (the server
state), ``s`` the client's score (s = p at the start of a round), ``Q`` the fixed m × n
matrix with ``d`` non-zeros per row, ``z`` ~ Bernoulli(p) the mask, w = Q·z the weights
(:mod:`fedlightning.models.zampling`).

One round of *Federated Zampling* (§"Our Framework") on the round engine
(:mod:`fedlightning.federated.module`):

1. the server broadcasts p (a probability-vector payload: float32, or losslessly with
   ⌈log2(K+1)⌉ bits per coordinate once p is a mean of K bits);
2. each client sets s = p and trains it with the engine's local-training routine: for every
   local mini-batch it samples z ~ Bernoulli(clip(s)), runs the network with w = Q·z and
   steps s ← s − η·∇ with the straight-through gradient ∇_s L = (Qᵀ·∇_w L) ⊙ 1{0 < p < 1}
   (Adam, as in the paper);
3. it samples z_new ~ Bernoulli(clip(s)) and uploads it (a Bernoulli-mask payload: n bits
   bit-packed, or range-coded with the broadcast p as the shared model, falling back to the
   n bits where the range code would be longer, :class:`~fedlightning.compression.mask.MaskCodec`);
4. the server sets its state directly: p ← (1/K)·Σ_k z_new^k, the plain mean of the bits.

*Local Zampling* is the same method with one client holding all data that uploads p_new
itself (``upload: probabilities``) and keeps its Adam state (``reset_optimizer: false``), so
that one round is one epoch. The *continuous model* (``sampling: false``) trains with
w = Q·p and no sampling, with the same gradient rule.

Decisions where the paper leaves a choice open (also stated in ``configs/method/zampling.yaml``):

* a fresh mask is drawn for every mini-batch (the paper's "each round" loop is written per
  update step); the clip is applied in Local Zampling too;
* the server average is the plain mean 1/K Σ_k over the uploaders, as in the paper, not
  weighted by sample counts;
* the client's Adam state is reset every round by default (``reset_optimizer``);
* "up to 100 epochs with early stopping" is ``local_patience`` (client-side early stopping,
  :meth:`Zampling.client_update`): each client holds out ``local_val_fraction`` of its own
  data, scores ``local_val_samples`` sampled networks on it after every local epoch, stops
  after ``local_patience`` epochs without a gain above ``local_min_delta`` (``local_epochs`` is
  the cap) and uploads a mask of its best epoch's p. Default off: a fixed ``local_epochs``;
* the paper's gradient mask freezes coordinates where the average hit exactly 0 or 1;
  ``p_clamp: ε`` (FedPM's remedy, arXiv 2209.15328) trains from clamp(p, ε, 1 − ε) instead.
  Default off.

Score estimators (``estimator``, :class:`~fedlightning.models.zampling_estimators.ScoreEstimator`):
``zampling`` (p = clip(s), the masked straight-through gradient), ``zhou`` (p = sigmoid(s),
dL/ds = σ'(s)·Qᵀ∇_w L; Zhou et al., arXiv 1905.01067) and ``fedpm`` (the same, times p; Isik et
al., arXiv 2209.15328). A client trains its score as the model
:class:`~fedlightning.models.sampled_network.SampledNetwork`.

The sampled-network evaluation and the parameter-sensitivity study are the callback
:class:`fedlightning.callbacks.zampling_evaluation.ZamplingEvaluation`, which the method
declares in ``needed_callbacks`` and the runner attaches (:mod:`fedlightning.callbacks.declared`)
with the settings of the config node ``reports.zampling_evaluation``; the method reads none of them.

On the ``vectorised`` backend a share's clients train at once, their scores stacked
(:meth:`Zampling.stacked_client_updates`, :mod:`fedlightning.methods.zampling_stacked`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.compression.arithmetic import LatticeCodec, bernoulli_cross_entropy_bits
from fedlightning.compression.codecs import BitPackCodec, Float32Codec
from fedlightning.compression.mask import MaskCodec
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, WeightedMean
from fedlightning.federated.local.fused import chain_gradients_
from fedlightning.federated.module import ClientResult, FederatedModule, ParamsT
from fedlightning.federated.params import assign_flat_, num_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.methods import zampling_stacked
from fedlightning.models.sampled_network import SampledNetwork
from fedlightning.models.zampling import (
    SparseQ,
    ZampledNetwork,
    bernoulli_draw,
    row_fan_in,
    zampling_q,
)
from fedlightning.models.zampling_estimators import Estimator, score_estimator

__all__ = [
    "OPTIMIZER_KEY",
    "RANGE_METRIC",
    "XENT_METRIC",
    "Zampling",
    "bernoulli_draw",
    "frozen_fraction",
    "holdout_positions",
    "mean_of_bits",
    "trainable_size",
]

OptimizerFactory = Callable[[Iterable[Tensor]], torch.optim.Optimizer]
EPOCHS_METRIC = "train/local_epochs"
"""Per-round mean over uploads of the local epochs a client ran under client-side early stopping
(``local_patience``; logged only then)."""
XENT_METRIC = "comm/uplink_xent_bits_per_param"
"""Per-round mean over uploads of Σ_j −log2 P(z_j | p_j) / n: the ideal coded size of a mask."""
RANGE_METRIC = "comm/uplink_range_bits_per_param"
"""Per-round mean over uploads of the size of the mask under ``uplink: arithmetic``
(:class:`~fedlightning.compression.mask.MaskCodec`:
the range code, or n bits where that is shorter, plus its flag bit) / n, whatever the uplink codec:
a bit-packed run also reports what the range-coded uplink would have sent for the same masks."""
OPTIMIZER_KEY = "optimizer"
"""Key of a client's saved optimiser state in the client state store (``reset_optimizer: false``)."""


# ---------------------------------------------------------------------------------- pure maths
def trainable_size(*, m: int, compression: float | None, n: int | None) -> int:
    """n from ``method.n`` or ``method.compression`` = m/n (rounded down, at least 1).

    >>> trainable_size(m=266_610, compression=32, n=None)
    8331
    >>> trainable_size(m=10, compression=None, n=4)
    4
    """
    if (compression is None) == (n is None):
        raise ConfigError("Set exactly one of method.compression (= m/n) and method.n; set the other to null.")
    if n is not None:
        if not 1 <= n <= m:
            raise ConfigError(f"method.n must be between 1 and m={m} (got {n}).")
        return int(n)
    assert compression is not None
    if compression < 1:
        raise ConfigError(f"method.compression (= m/n) must be at least 1 (got {compression}).")
    return max(1, int(m // compression))


def mean_of_bits(uploads: Tensor) -> Tensor:
    """The server's p = (1/K)·Σ_k z^k over a (K, n) stack of masks.

    >>> mean_of_bits(torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])).tolist()
    [1.0, 0.5, 0.5]
    """
    return uploads.mean(dim=0)


def frozen_fraction(p: Tensor) -> float:
    """Fraction of coordinates with p exactly 0 or 1 (their gradient is masked forever).

    >>> frozen_fraction(torch.tensor([0.0, 0.3, 1.0, 0.5]))
    0.5
    """
    return float(((p <= 0) | (p >= 1)).float().mean()) if p.numel() else 0.0


def holdout_positions(num_samples: int, fraction: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A random split of ``range(num_samples)`` into (kept, held out), ``round(fraction · num_samples)``
    held out (at least 1, and at least 1 kept).

    >>> kept, held = holdout_positions(10, 0.25, torch.Generator().manual_seed(0))
    >>> len(kept), len(held), sorted(torch.cat([kept, held]).tolist()) == list(range(10))
    (8, 2, True)
    >>> [len(part) for part in holdout_positions(2, 0.01, torch.Generator().manual_seed(0))]
    [1, 1]
    """
    if num_samples < 2:
        raise ValueError(f"A client with {num_samples} sample(s) cannot hold any out for early stopping.")
    held = min(max(round(fraction * num_samples), 1), num_samples - 1)
    perm = torch.randperm(num_samples, generator=generator)
    return perm[held:], perm[:held]


# ---------------------------------------------------------------------------------- the method
class Zampling(FederatedModule):
    """Federated (and Local, and continuous) Zampling on any model.

    Args:
        model: the architecture; all its m weights and biases come from w = Q·z.
        datamodule: the federated data.
        seed: run seed (random streams); Q's seed is ``q_seed`` (default: derived from it).
        d: non-zeros per row of Q (1 ≤ d ≤ n).
        compression: m/n; or give ``n`` directly (exactly one of the two).
        n: number of trainable parameters.
        q_seed: the shared seed of Q (64 bits, sent once); default ``seed``.
        estimator: ``zampling`` (clip, masked straight-through), ``zhou`` (sigmoid) or ``fedpm``
            (sigmoid, gradient times p); see :data:`~fedlightning.models.zampling_estimators.SCORE_ESTIMATORS`.
        sampling: train with w = Q·z (true) or the continuous model w = Q·p (false).
        upload: ``sample`` (z_new, binary) or ``probabilities`` (p_new as float32; Local Zampling).
        p_init: ``uniform`` (paper), ``beta`` (Beta(a, a), ``p_init_beta`` = a), ``half``
            (p = 0.5) or ``score_normal`` (p = sigmoid(N(0,1)), FedPM).
        p_clamp: if set to ε, clients train from and sample with clamp(p, ε, 1 − ε) (remedy for
            frozen coordinates); null keeps the paper's behaviour.
        reset_optimizer: a fresh client optimiser every round (true) or kept per client.
        uplink: ``bitpack`` (n bits) or ``arithmetic`` (range-coded with the broadcast p, or
            bit-packed where that is shorter, behind one flag bit: :class:`~fedlightning.compression.mask.MaskCodec`).
        downlink: ``float32`` (paper) or ``lattice`` (lossless ⌈log2(K+1)⌉ bits per coordinate).
        local_patience: client-side early stopping (the paper's "up to 100 epochs with early
            stopping, 10 epochs of patience and a delta of 10^-4"): stop a client's round after
            this many local epochs without a gain above ``local_min_delta`` in the mean accuracy
            of ``local_val_samples`` sampled networks on its held-out ``local_val_fraction``
            of its data, and upload from its best epoch's p; ``local_epochs`` caps the epochs.
            ``None`` (default): exactly ``local_epochs``, every sample trains.
        client_optimizer: factory over the scores (default Adam, lr 0.1 as in the paper's
            federated runs).
        **kwargs: the remaining :class:`FederatedModule` arguments (no ``server_optimizer``:
            the server sets p itself).
    """

    uplink_payload = Payload.BERNOULLI_MASK
    downlink_payload = Payload.PROBABILITIES
    sets_server_state = True
    client_weighting = "uniform"  # the paper's plain mean 1/K Σ_k z^k over the uploaders
    local_work_hooks = (*FederatedModule.local_work_hooks, "client_network")
    # On the fused backend a client's step is taken by hand (SampledNetwork.fused_gradient_): it writes
    # ∂L/∂s and the client optimiser, whatever it is, applies it as usual.
    hand_stepped = True
    supported_aggregation = ("normalised",)
    client_metric_names: tuple[str, ...] = (XENT_METRIC, RANGE_METRIC)
    needed_callbacks = ("zampling_evaluation",)  # the sampled-network evaluation (fedlightning.callbacks.declared)

    def __init__(
        self,
        *,
        model: nn.Module,
        datamodule: Any,
        seed: int = 0,
        d: int = 10,
        compression: float | None = 32,
        n: int | None = None,
        q_seed: int | None = None,
        estimator: Estimator = "zampling",
        sampling: bool = True,
        upload: Literal["sample", "probabilities"] = "sample",
        p_init: Literal["uniform", "beta", "half", "score_normal"] = "uniform",
        p_init_beta: float = 1.0,
        p_clamp: float | None = None,
        reset_optimizer: bool = True,
        uplink: Literal["bitpack", "arithmetic"] = "bitpack",
        downlink: Literal["float32", "lattice"] = "float32",
        local_patience: int | None = None,
        local_min_delta: float = 1e-4,
        local_val_fraction: float = 0.1,
        local_val_samples: int = 10,
        client_optimizer: OptimizerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model=model,
            datamodule=datamodule,
            seed=seed,
            client_optimizer=client_optimizer or functools.partial(torch.optim.Adam, lr=0.1),
            **kwargs,
        )
        self.score_estimator = score_estimator(estimator)
        _choice("method.upload", upload, ("sample", "probabilities"))
        _choice("method.p_init", p_init, ("uniform", "beta", "half", "score_normal"))
        _choice("method.uplink", uplink, ("bitpack", "arithmetic"))
        _choice("method.downlink", downlink, ("float32", "lattice"))
        if p_clamp is not None and not 0 < p_clamp < 0.5:
            raise ConfigError(f"method.p_clamp must be in (0, 0.5) or null (got {p_clamp}).")
        if uplink == "arithmetic" and upload != "sample":
            raise ConfigError("method.uplink=arithmetic codes binary masks; it needs method.upload=sample.")
        if downlink == "lattice" and upload != "sample":
            raise ConfigError("method.downlink=lattice needs p to be a mean of bits; set method.upload=sample.")
        if local_patience is not None:
            if local_patience < 1:
                raise ConfigError(f"method.local_patience must be at least 1 or null (got {local_patience}).")
            if not 0 < local_val_fraction < 1:
                raise ConfigError(f"method.local_val_fraction must be in (0, 1) (got {local_val_fraction}).")
            if local_val_samples < 1:
                raise ConfigError(f"method.local_val_samples must be at least 1 (got {local_val_samples}).")
            if kwargs.get("local_steps") is not None:
                raise ConfigError(
                    "method.local_patience counts local epochs; set method.local_steps=null and cap the epochs "
                    "with method.local_epochs (the paper: 100)."
                )
            if kwargs.get("local_epochs", 1) <= local_patience:
                raise ConfigError(
                    f"method.local_patience={local_patience} can never end a round of at most "
                    f"method.local_epochs={kwargs.get('local_epochs', 1)} epochs (it needs patience + 1 of them); "
                    "raise method.local_epochs (the paper: 100) or set method.local_patience=null."
                )
        if p_init_beta <= 0:
            raise ConfigError(f"method.p_init_beta must be positive (got {p_init_beta}).")
        self.m = num_parameters(model)
        self.n = trainable_size(m=self.m, compression=compression, n=n)
        self.d = int(d)
        self.q_seed = int(seed if q_seed is None else q_seed)
        self.estimator: Estimator = estimator
        self.sampling = sampling
        self.upload = upload
        self.p_clamp = p_clamp
        self.reset_optimizer = reset_optimizer
        self.local_patience = local_patience
        self.local_min_delta = float(local_min_delta)
        self.local_val_fraction = float(local_val_fraction)
        self.local_val_samples = int(local_val_samples)
        self.uplink = uplink
        self.downlink = downlink
        self.q: SparseQ = self.build_q(model)
        if self.q.shape != (self.m, self.n):
            raise ConfigError(f"Q has shape {self.q.shape} but the model needs ({self.m}, {self.n}).")
        self.net = ZampledNetwork(self.client_model)
        gen = torch.Generator().manual_seed(self.q_seed + 1)
        self.p = nn.Parameter(self.initial_p(p_init, p_init_beta, gen), requires_grad=False)
        self._levels: int | None = None  # K of the last mean of bits (lattice downlink)
        # The wire formats (the codecs that depend on the round are set in broadcast_state).
        if upload == "probabilities":
            self.uplink_channel.payload = Payload.PROBABILITIES
            self.uplink_channel.codec = Float32Codec()
            self.client_metric_names = ()  # no mask, so no mask code length
        else:
            self.uplink_channel.codec = BitPackCodec()  # arithmetic: replaced every round
        if local_patience is not None:  # the epochs each client ran (fixed otherwise)
            self.client_metric_names = (EPOCHS_METRIC, *self.client_metric_names)
        self.downlink_channel.codec = Float32Codec()

    # ------------------------------------------------------------------ overridable pieces
    def build_q(self, model: nn.Module) -> SparseQ:
        """The paper's Q from the shared seed (override for diagonal Q: supermask, FedPM)."""
        return zampling_q(row_fan_in(model), n=self.n, d=self.d, seed=self.q_seed)

    def initial_p(self, kind: str, beta: float, gen: torch.Generator) -> Tensor:
        """p(0): U(0,1)^n in the paper; Beta(a, a), 0.5, or sigmoid(N(0,1)) on request."""
        if kind == "uniform":
            return torch.rand(self.n, generator=gen)
        if kind == "beta":
            return _beta_sample(float(beta), self.n, gen)
        if kind == "half":
            return torch.full((self.n,), 0.5)
        return torch.sigmoid(torch.randn(self.n, generator=gen))

    def aggregate(self, *, round_idx: int, aggregator: WeightedMean) -> Tensor:
        """The new server p from the round's sums: the plain mean (1/K)·Σ_k of the uploads."""
        return aggregator.result(torch.float32)

    def effective_p(self, p: Tensor) -> Tensor:
        """What clients train from and sample with: p, or clamp(p, ε, 1 − ε) with ``p_clamp``."""
        return p if self.p_clamp is None else p.clamp(self.p_clamp, 1.0 - self.p_clamp)

    # ------------------------------------------------------------------ engine hooks: server
    @property
    @override
    def uplink_numel(self) -> int:
        return self.n

    @override
    def server_parameters(self) -> list[nn.Parameter]:
        return [self.p]

    @override
    def broadcast_state(self, round_idx: int) -> Tensor:
        state = self.p.detach().clone()
        if self.downlink == "lattice" and self._levels is not None:
            self.downlink_channel.codec = LatticeCodec(levels=self._levels)
        else:
            self.downlink_channel.codec = Float32Codec()  # the paper; also round 0, whose p(0) is no mean of bits
        if self.uplink == "arithmetic":
            self.uplink_channel.codec = MaskCodec(model_p=self.effective_p(state).cpu())
        return state

    @override
    def make_aggregator(self, round_idx: int) -> Aggregator:
        return WeightedMean(dim=self.n, normalise=True, device=self.device)

    @override
    def set_server_state(self, *, round_idx: int, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, WeightedMean)
        new_p = self.aggregate(round_idx=round_idx, aggregator=aggregator)
        with torch.no_grad():
            self.p.copy_(new_p)
        self._levels = aggregator.count if self.uplink_channel.payload is Payload.BERNOULLI_MASK else None

    @override
    def server_metrics(self, round_idx: int) -> dict[str, float]:
        p = self.p.detach()
        return {
            "model/frozen_fraction": frozen_fraction(self.effective_p(p)),
            "model/saturated_fraction": frozen_fraction(p),
            "model/p_mean": float(p.mean()),
            "model/n": float(self.n),
            "model/m": float(self.m),
        }

    # ------------------------------------------------------------------ engine hooks: client
    @override
    def make_client_optimizer(self, params: ParamsT, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        optimizer = super().make_client_optimizer(params, client_id=client_id, round_idx=round_idx)
        if not self.reset_optimizer:
            saved = self.client_state.get(client_id, OPTIMIZER_KEY)
            if saved is not None:
                optimizer.load_state_dict(saved)
        return optimizer

    def client_network(self, *, client_id: int, round_idx: int, p_start: Tensor) -> SampledNetwork:
        """The client's model for one round, starting from the score of ``p_start``."""
        estimator = self.score_estimator
        return SampledNetwork(
            estimator.score(p_start),
            network=self.net,
            weights=estimator.weights(self.q),
            estimator=estimator,
            sampling=self.sampling,
            generator=self.generator(round_idx, client_id, "zampling_mask"),
            chain=self.local_runner.layers,
            chain_gradients=chain_gradients_,
        )

    def local_holdout(self, client_id: int, num_samples: int) -> tuple[Tensor, Tensor]:
        """(training, held-out) positions in a client's data for client-side early stopping.

        Drawn from the client's own stream once for the whole run, so every round holds out
        the same samples (:func:`holdout_positions`).
        """
        gen = self.generator(0, client_id, "local_holdout")
        return holdout_positions(num_samples, self.local_val_fraction, gen)

    @override
    def client_data(self, client_id: int) -> tuple[Tensor, Tensor]:
        """The client's training samples: all of them, or those not held out for early stopping."""
        x, y = super().client_data(client_id)
        if self.local_patience is None:
            return x, y
        train, _ = self.local_holdout(client_id, len(y))
        return x[train.to(x.device)], y[train.to(y.device)]

    @torch.no_grad()
    def local_holdout_accuracy(self, network: SampledNetwork, x: Tensor, y: Tensor, masks: torch.Generator) -> float:
        """Mean accuracy on (x, y) of ``local_val_samples`` networks sampled from the client's current p
        (of the network w = Q·p itself in the continuous model)."""
        p = network.probabilities().detach()
        draws = self.local_val_samples if self.sampling else 0
        z = torch.stack([bernoulli_draw(p, masks) for _ in range(draws)] or [p])
        out = self.net.forward_many(x, self.weights_of_many(z))
        return float((out.argmax(dim=-1) == y).double().mean())

    def _local_early_stopping(
        self, network: SampledNetwork, *, client_id: int, round_idx: int
    ) -> tuple[Callable[[int], bool], Callable[[], None]]:
        """``after_epoch`` for :meth:`local_train` and the call that restores the best epoch's score.

        After each local epoch :meth:`local_holdout_accuracy` scores the held-out samples (masks
        from the client's ``local_val`` stream of the round); training stops after
        ``local_patience`` epochs without a gain above ``local_min_delta`` over the best so far.
        """
        x_all, y_all = super().client_data(client_id)
        _, held = self.local_holdout(client_id, len(y_all))
        x, y = x_all[held.to(x_all.device)], y_all[held.to(y_all.device)]
        masks = self.generator(round_idx, client_id, "local_val")
        patience = self.local_patience
        assert patience is not None
        best_acc, best_score, stale = -math.inf, network.score.detach().clone(), 0

        def after_epoch(epochs: int) -> bool:
            nonlocal best_acc, best_score, stale
            acc = self.local_holdout_accuracy(network, x, y, masks)
            if acc > best_acc + self.local_min_delta:
                best_acc, best_score, stale = acc, network.score.detach().clone(), 0
            else:
                stale += 1
            return stale >= patience

        def restore() -> None:
            with torch.no_grad():
                network.score.copy_(best_score)

        return after_epoch, restore

    @override
    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local training from the broadcast p; uploads a fresh mask z_new ~ Bernoulli(p_new) (or p_new).

        With ``local_patience`` set, the client trains until its held-out accuracy stops
        improving (:meth:`_local_early_stopping`) and p_new is its best epoch's p.
        """
        p_start = self.effective_p(received)
        network = self.client_network(client_id=client_id, round_idx=round_idx, p_start=p_start)
        self.client_model.train()

        fused = self.local_runner.layers is not None  # the fused backend runs: steps by hand on its layers

        def batch_loss(x: Tensor, y: Tensor) -> Tensor:
            if fused:
                return network.fused_gradient_(x, y)
            network.resample()  # a fresh mask for every mini-batch
            return self.local_loss(network, x, y)

        after_epoch, restore = (
            self._local_early_stopping(network, client_id=client_id, round_idx=round_idx)
            if self.local_patience is not None
            else (None, None)
        )
        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=network.parameters(),
            batch_loss=batch_loss,
            after_step=lambda: self.on_local_step_end(network),
            after_epoch=after_epoch,
            writes_gradients=fused,
        )
        if restore is not None:
            restore()
        if not self.reset_optimizer:
            self.client_state.set(client_id, OPTIMIZER_KEY, done.optimizer.state_dict())
        upload, metrics = self.client_upload(
            client_id=client_id, round_idx=round_idx, p_new=network.probabilities().detach(), p_start=p_start
        )
        if self.local_patience is not None:
            metrics[EPOCHS_METRIC] = float(done.epochs)
        return ClientResult(upload=upload, num_samples=done.num_samples, loss=done.loss, metrics=metrics)

    def client_upload(
        self, *, client_id: int, round_idx: int, p_new: Tensor, p_start: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        """What a client sends after local training, and its per-client metrics.

        A fresh mask z_new ~ Bernoulli(p_new) from the client's ``zampling_upload`` stream, with
        its cross-entropy and range-coded length against the received p in bits per entry; or
        p_new itself where the uplink carries probabilities.
        """
        if self.uplink_channel.payload is not Payload.BERNOULLI_MASK:
            return p_new, {}
        upload = bernoulli_draw(p_new, self.generator(round_idx, client_id, "zampling_upload"))
        return upload, {
            XENT_METRIC: bernoulli_cross_entropy_bits(upload, p_start) / self.n,
            RANGE_METRIC: MaskCodec(model_p=p_start.cpu()).encode(upload).num_bits / self.n,
        }

    def stacked_refusal(self) -> str | None:
        """Why the ``vectorised`` backend cannot train this run's clients at once (``None``: it can).

        :func:`fedlightning.methods.zampling_stacked.stacked_refusal`: one clause naming the config key.
        """
        return zampling_stacked.stacked_refusal(self)

    def stacked_client_updates(self, *, round_idx: int, share: list[int], received: Tensor) -> list[ClientResult]:
        """:meth:`client_update` of every client of ``share`` at once, on the ``vectorised`` backend.

        The K clients' scores stacked as (K, n), each client's masks from its own stream
        (:mod:`fedlightning.methods.zampling_stacked`, arXiv 2503.14246).
        """
        return zampling_stacked.stacked_client_updates(self, round_idx=round_idx, share=share, received=received)

    # ------------------------------------------------------------------ evaluation
    def weights_of(self, z: Tensor) -> Tensor:
        """w = Q·z on this module's device."""
        return self.q.matvec(z.to(self.q.vals.device)).to(self.device)

    def weights_of_many(self, z: Tensor) -> Tensor:
        """w = Q·z for a batch of masks (B, n) → (B, m), on this module's device."""
        return self.q.matmat(z.to(self.q.vals.device)).to(self.device)

    def expected_weights(self) -> Tensor:
        """w = Q·p (the expected network)."""
        return self.weights_of(self.effective_p(self.p.detach()))

    @override
    def on_validation_epoch_start(self) -> None:
        assign_flat_(self.model, self.expected_weights())  # val/acc is the expected network's

    @override
    def on_test_epoch_start(self) -> None:
        assign_flat_(self.model, self.expected_weights())

    @override
    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.local_patience is not None and min(self.datamodule.client_sizes, default=2) < 2:
            raise ConfigError(
                f"method.local_patience holds out part of each client's data, but a client here has "
                f"{min(self.datamodule.client_sizes)} sample(s); use fewer clients or set method.local_patience=null."
            )
        self._q_to_device()

    @override
    def on_test_start(self) -> None:
        self._q_to_device()

    def _q_to_device(self) -> None:
        if self.q.vals.device != self.device:
            self.q = self.q.to(self.device)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["zampling_levels"] = self._levels

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._levels = checkpoint.get("zampling_levels")


def _beta_sample(a: float, size: int, gen: torch.Generator) -> Tensor:
    """``size`` draws of Beta(a, a), seeded from ``gen`` (torch.distributions takes no generator)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    return torch.from_numpy(np.random.default_rng(seed).beta(a, a, size=size)).to(torch.float32)


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not supported; choose one of {', '.join(allowed)}.")


def refuse_fixed_settings(method: str, fixed: dict[str, object], given: dict[str, object]) -> None:
    """Stop when a setting that ``method`` fixes was given another value (it would be ignored)."""
    for key, value in given.items():
        if value is not None and value != fixed[key]:
            raise ConfigError(
                f"{method} fixes method.{key}={fixed[key]} (Q = diag(w), one score per weight), so "
                f"method.{key}={value} would be ignored; remove it."
            )
