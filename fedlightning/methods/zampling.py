"""Zampling: Local, Federated and continuous (arXiv 2503.14246).

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246. Names follow the paper: ``p`` ∈ [0,1]^n the probability vector (the server
state), ``s`` the client's score (s = p at the start of a round), ``Q`` the fixed m × n
matrix with ``d`` non-zeros per row, ``z`` ~ Bernoulli(p) the mask, w = Q·z the weights
(:mod:`fedlightning.models.zampling`).

One round of *Federated Zampling* (§"Our Framework"):

1. the server broadcasts p (float32, or losslessly with ⌈log2(K+1)⌉ bits per coordinate);
2. each client sets s = p and, for every local mini-batch, samples z ~ Bernoulli(clip(s)),
   runs the network with w = Q·z and steps s ← s − η·∇ with the straight-through gradient
   ∇_s L = (Qᵀ·∇_w L) ⊙ 1{0 < p < 1} (Adam, as in the paper);
3. it samples z_new ~ Bernoulli(clip(s)) and uploads it (n bits bit-packed, or range-coded
   with the broadcast p as the shared model);
4. the server sets p ← (1/K)·Σ_k z_new^k.

*Local Zampling* is the same method with one client holding all data that uploads p_new
itself (``upload: probabilities``) and keeps its Adam state (``reset_optimizer: false``), so
that one round is one epoch. The *continuous model* (``sampling: false``) trains with
w = Q·p and no sampling, with the same gradient rule.

Decisions on the paper's gaps (method-references §1.6, documented in the configs):

* a fresh mask is drawn for every mini-batch (the paper's "each round" loop is written per
  update step); the clip is applied in Local Zampling too;
* the server average is the plain mean 1/K Σ_k (as in the paper), not sample-weighted;
* the client's Adam state is reset every round by default (``reset_optimizer``);
* "up to 100 epochs with early stopping" is replaced by a fixed ``local_epochs``;
* the paper's gradient mask freezes coordinates where the average hit exactly 0 or 1;
  ``p_clamp: ε`` (FedPM's remedy) trains from clamp(p, ε, 1 − ε) instead. Default off.

Other score estimators (``estimator``): ``zhou`` (p = sigmoid(s), dL/ds = σ'(s)·Qᵀ∇_w L;
Zhou et al. 2019, arXiv 1905.01067) and ``fedpm`` (the same, times p; Isik et al. 2023,
arXiv 2209.15328).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.compression.arithmetic import BernoulliRangeCodec, LatticeCodec, bernoulli_cross_entropy_bits
from fedlightning.compression.codecs import BitPackCodec, Float32Codec
from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.message import Codec, Message
from fedlightning.federated.module import ClientResult, ClientUpload, FederatedModule
from fedlightning.federated.params import assign_flat_, num_parameters
from fedlightning.federated.rng import SERVER
from fedlightning.models.zampling import SparseQ, ZampledNetwork, ZampledWeights, row_fan_in, zampling_q

__all__ = [
    "Zampling",
    "accuracy_deviation",
    "frozen_fraction",
    "hypercube_indicator",
    "mean_of_bits",
    "perturb_in_hypercube",
    "perturbation_support",
    "probability_from_score",
    "relative_sensitivity",
    "score_from_probability",
    "trainable_size",
]

Estimator = Literal["zampling", "zhou", "fedpm"]
OptimizerFactory = Callable[[Iterable[Tensor]], torch.optim.Optimizer]
_LOGIT_EPS = 1e-6


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


def probability_from_score(s: Tensor, estimator: Estimator) -> Tensor:
    """p = clip(s, 0, 1) for Zampling, sigmoid(s) for Zhou and FedPM (differentiable).

    >>> probability_from_score(torch.tensor([-0.5, 0.25, 1.5]), "zampling").tolist()
    [0.0, 0.25, 1.0]
    """
    return s.clamp(0.0, 1.0) if estimator == "zampling" else torch.sigmoid(s)


def score_from_probability(p: Tensor, estimator: Estimator) -> Tensor:
    """The inverse map: s = p (Zampling) or logit(p) with p kept in [1e-6, 1 − 1e-6].

    >>> score_from_probability(torch.tensor([0.5]), "zhou").tolist()
    [0.0]
    """
    if estimator == "zampling":
        return p.clone()
    return torch.logit(p.clamp(_LOGIT_EPS, 1.0 - _LOGIT_EPS))


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


def hypercube_indicator(p: Tensor, tau: float) -> Tensor:
    """𝕀(p)_j = 1{τ ≤ p_j ≤ 1 − τ}: the free directions of the τ-hypercube C_τ (paper, Def. τ-Hypercube).

    >>> hypercube_indicator(torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0]), 0.1).tolist()
    [False, False, True, False, False]
    """
    if not 0.0 <= tau <= 0.5:
        raise ConfigError(f"method.sensitivity_taus must lie in [0, 0.5] (got {tau}).")
    return (p >= tau) & (p <= 1.0 - tau)


def perturbation_support(p: Tensor, tau: float, region: Literal["hypercube", "complement"]) -> Tensor:
    """Which coordinates the sensitivity study perturbs.

    ``hypercube``: 𝕀(p), the paper's stated rule τ ≤ p_j ≤ 1 − τ (C_τ's free directions).
    ``complement``: p_j < τ or p_j > 1 − τ. The paper's text also says that τ = 0.5 perturbs
    "all values p_j", which only this reading gives; both are offered, the stated rule is
    the default.

    >>> perturbation_support(torch.tensor([0.0, 0.3, 0.5, 1.0]), 0.5, "complement").tolist()
    [True, True, False, True]
    """
    inside = hypercube_indicator(p, tau)
    if region == "hypercube":
        return inside
    if region == "complement":
        return ~inside
    raise ConfigError(f"method.sensitivity_region={region!r} is not supported; choose hypercube or complement.")


def perturb_in_hypercube(
    p: Tensor, tau: float, generator: torch.Generator, region: Literal["hypercube", "complement"] = "hypercube"
) -> tuple[Tensor, Tensor]:
    """The paper's sensitivity perturbation: (clip(p + ε_τ, 0, 1), ε_τ), ε_τ,j ~ N(0, 1) on the support.

    Only the coordinates of :func:`perturbation_support` move (by default τ ≤ p_j ≤ 1 − τ);
    the result is clipped back into [0, 1] so it stays a valid Bernoulli parameter (the
    paper does not say how it handles values leaving [0, 1]; clipping is our decision).

    >>> gen = torch.Generator().manual_seed(0)
    >>> q, eps = perturb_in_hypercube(torch.tensor([0.0, 1.0, 0.5]), 0.01, gen)
    >>> q[:2].tolist(), eps[:2].tolist()
    ([0.0, 1.0], [0.0, 0.0])
    """
    support = perturbation_support(p, tau, region)
    eps = torch.where(support, torch.randn(p.shape, generator=generator, dtype=p.dtype), torch.zeros_like(p))
    return (p + eps).clamp(0.0, 1.0), eps


def relative_sensitivity(reference: float, perturbed: float) -> float:
    """The paper's "sensitivity": (reference − perturbed) / reference (relative accuracy drop).

    >>> relative_sensitivity(1.0, 0.75)
    0.25
    """
    return (reference - perturbed) / reference if reference > 0 else float("nan")


def accuracy_deviation(reference: float, perturbed: float, eps_norm: float) -> float:
    """The paper's "deviation": accuracy drop in percentage points per unit ‖ε_τ‖₂.

    The paper's table is consistent with accuracies in percent (its regular-training row
    gives ‖ε_τ‖ ≈ 130 ≈ √n for the small architecture at m/n = 1), so the drop is × 100.

    >>> accuracy_deviation(0.75, 0.5, 5.0)
    5.0
    """
    return 100.0 * (reference - perturbed) / eps_norm if eps_norm > 0 else 0.0


class _RecordingCodec:
    """Delegates to ``inner`` and records every encoded message's bit count in ``sink``."""

    def __init__(self, inner: Codec, sink: list[int]) -> None:
        self.inner, self.sink, self.name = inner, sink, inner.name

    def encode(self, x: Tensor) -> Message:
        message = self.inner.encode(x)
        self.sink.append(message.num_bits)
        return message

    def decode(self, message: Message) -> Tensor:
        return self.inner.decode(message)


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
            (sigmoid, gradient times p).
        sampling: train with w = Q·z (true) or the continuous model w = Q·p (false).
        upload: ``sample`` (z_new, binary) or ``probabilities`` (p_new as float32; Local Zampling).
        p_init: ``uniform`` (paper), ``beta`` (Beta(a, a), ``p_init_beta`` = a), ``half``
            (p = 0.5) or ``score_normal`` (p = sigmoid(N(0,1)), FedPM).
        p_clamp: if set to ε, clients train from and sample with clamp(p, ε, 1 − ε) (remedy for
            frozen coordinates); null keeps the paper's behaviour.
        reset_optimizer: a fresh client optimiser every round (true) or kept per client.
        uplink: ``bitpack`` (n bits) or ``arithmetic`` (range-coded with the broadcast p).
        downlink: ``float32`` (paper) or ``lattice`` (lossless ⌈log2(K+1)⌉ bits per coordinate).
        val_samples: sampled networks per validation; test_samples: per test.
        sensitivity_taus: at test time, the parameter-sensitivity study of the paper
            (§"Generalisation Properties via Parameter Sensitivity"): for each τ, perturb p
            ``sensitivity_perturbations`` times inside C_τ (:func:`perturb_in_hypercube`) and
            log the expected network's and the mean of ``sensitivity_samples`` sampled networks'
            accuracy, sensitivity and deviation as ``test/sensitivity/<τ>/...``. Empty: off.
            ``sensitivity_region`` picks the perturbed coordinates (:func:`perturbation_support`).
        client_optimizer: factory over the scores (default Adam, lr 0.1 as in the paper's
            federated runs).
        **kwargs: the remaining :class:`FederatedModule` arguments.
    """

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
        val_samples: int = 20,
        test_samples: int = 100,
        sensitivity_taus: Sequence[float] = (),
        sensitivity_perturbations: int = 10,
        sensitivity_samples: int = 10,
        sensitivity_region: Literal["hypercube", "complement"] = "hypercube",
        client_optimizer: OptimizerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model=model,
            datamodule=datamodule,
            seed=seed,
            client_optimizer=client_optimizer or (lambda params: torch.optim.Adam(params, lr=0.1)),
            **kwargs,
        )
        _choice("method.estimator", estimator, ("zampling", "zhou", "fedpm"))
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
        if val_samples < 1 or test_samples < 1:
            raise ConfigError("method.val_samples and method.test_samples must be at least 1.")
        if p_init_beta <= 0:
            raise ConfigError(f"method.p_init_beta must be positive (got {p_init_beta}).")
        for tau in sensitivity_taus:
            perturbation_support(torch.zeros(1), float(tau), sensitivity_region)  # validates τ and region
        if sensitivity_perturbations < 1 or sensitivity_samples < 1:
            raise ConfigError("method.sensitivity_perturbations and method.sensitivity_samples must be at least 1.")
        self.m = num_parameters(model)
        self.n = trainable_size(m=self.m, compression=compression, n=n)
        self.d = int(d)
        self.q_seed = int(seed if q_seed is None else q_seed)
        self.estimator: Estimator = estimator
        self.sampling = sampling
        self.upload = upload
        self.p_clamp = p_clamp
        self.reset_optimizer = reset_optimizer
        self.uplink = uplink
        self.downlink = downlink
        self.val_samples = int(val_samples)
        self.test_samples = int(test_samples)
        self.sensitivity_taus = tuple(float(t) for t in sensitivity_taus)
        self.sensitivity_perturbations = int(sensitivity_perturbations)
        self.sensitivity_samples = int(sensitivity_samples)
        self.sensitivity_region: Literal["hypercube", "complement"] = sensitivity_region
        self.q: SparseQ = self.build_q(model)
        if self.q.shape != (self.m, self.n):
            raise ConfigError(f"Q has shape {self.q.shape} but the model needs ({self.m}, {self.n}).")
        self.net = ZampledNetwork(self.client_model)
        self.eval_net = ZampledNetwork(self.model)
        gen = torch.Generator().manual_seed(self.q_seed + 1)
        self.p = nn.Parameter(self.initial_p(p_init, p_init_beta, gen), requires_grad=False)
        self._levels: int | None = None  # K of the last average (lattice downlink)
        self._model_p: Tensor | None = None  # the broadcast p both sides know this round
        self._target: Tensor | None = None
        self._round_up_bits: list[int] = []
        self._round_xent: list[float] = []
        self._eval_batches: list[tuple[Tensor, Tensor]] = []
        self._val_best_index: tuple[int, int] | None = None  # (global step, mask index)

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

    def aggregate(self, *, round_idx: int, uploads: Tensor) -> Tensor:
        """The new server p from the (K, n) stack of uploads: their plain mean."""
        return mean_of_bits(uploads)

    def effective_p(self, p: Tensor) -> Tensor:
        """What clients train from and sample with: p, or clamp(p, ε, 1 − ε) with ``p_clamp``."""
        return p if self.p_clamp is None else p.clamp(self.p_clamp, 1.0 - self.p_clamp)

    # ------------------------------------------------------------------ codecs
    @property
    def uplink_codec(self) -> Codec:  # type: ignore[override]
        """Bit-packed or range-coded mask (float32 for ``upload: probabilities``), recorded."""
        if self.upload == "probabilities":
            inner: Codec = Float32Codec()
        elif self.uplink == "arithmetic":
            assert self._model_p is not None
            inner = BernoulliRangeCodec(model_p=self._model_p)
        else:
            inner = BitPackCodec()
        return _RecordingCodec(inner, self._round_up_bits)

    @property
    def downlink_codec(self) -> Codec:  # type: ignore[override]
        """Float32 (paper), or the lossless lattice codec once p is a mean of K bits."""
        if self.downlink == "lattice" and self._levels is not None:
            return LatticeCodec(levels=self._levels)
        return Float32Codec()  # the paper; also round 0, whose p(0) is not a mean of bits

    # ------------------------------------------------------------------ hooks
    @override
    def server_parameters(self) -> list[nn.Parameter]:
        return [self.p]

    @override
    def broadcast_state(self, round_idx: int) -> Tensor:
        state = self.p.detach().clone()
        self._model_p = self.effective_p(state).cpu()
        return state

    @override
    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        p_start = self.effective_p(received)
        s = score_from_probability(p_start, self.estimator).detach().requires_grad_(True)
        optimizer = self.client_optimizer([s])
        if not self.reset_optimizer:
            saved = self.client_state.get(client_id, "optimizer")
            if saved is not None:
                optimizer.load_state_dict(saved)
        weights = ZampledWeights(self.q, mask_frozen=self.estimator == "zampling", scale_by_p=self.estimator == "fedpm")
        mask_gen = self.generator(round_idx, client_id, "zampling_mask")
        augment_gen = self.generator(round_idx, client_id, "augment")
        x, y = self.client_data(client_id)
        self.client_model.train()
        loss_sum = torch.zeros(())
        steps = 0
        for idx in self.client_batches(client_id=client_id, round_idx=round_idx, num_samples=len(y)):
            p = probability_from_score(s, self.estimator)
            z = torch.bernoulli(p.detach(), generator=mask_gen) if self.sampling else p.detach()
            w = weights(p, z)
            loss = self.loss_fn(self.net.forward(self.datamodule.augment(x[idx], augment_gen), w), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.max_grad_norm is not None:
                nn.utils.clip_grad_norm_([s], self.max_grad_norm)
            optimizer.step()
            loss_sum += loss.detach()
            steps += 1
        if not self.reset_optimizer:
            self.client_state.set(client_id, "optimizer", optimizer.state_dict())
        p_new = probability_from_score(s.detach(), self.estimator)
        if self.upload == "sample":
            upload = torch.bernoulli(p_new, generator=self.generator(round_idx, client_id, "zampling_upload"))
            if self._model_p is not None:
                self._round_xent.append(bernoulli_cross_entropy_bits(upload, self._model_p))
        else:
            upload = p_new
        return ClientResult(upload=upload, num_samples=len(y), loss=loss_sum / max(steps, 1))

    @override
    def server_update(self, *, round_idx: int, uploads: list[ClientUpload], cohort: Cohort) -> Tensor:
        target = self.aggregate(round_idx=round_idx, uploads=torch.stack([u.update for u in uploads]))
        self._target = target.detach()
        self._levels = len(uploads) if self.upload == "sample" else None
        return self.p.detach() - target  # SGD(lr=1): p ← p − (p − target) = target

    @override
    def training_step(self, batch: Any, batch_idx: int) -> None:
        self._round_up_bits.clear()
        self._round_xent.clear()
        super().training_step(batch, batch_idx)
        if self._target is not None and float((self.p.detach() - self._target).abs().max()) <= 1e-5:
            with torch.no_grad():  # remove the rounding of p − (p − target) so p is exactly the mean
                self.p.copy_(self._target)
        p_eff = self.effective_p(self.p.detach())
        log = {
            "model/frozen_fraction": frozen_fraction(p_eff),
            "model/saturated_fraction": frozen_fraction(self.p.detach()),
            "model/p_mean": float(self.p.detach().mean()),
            "model/n": float(self.n),
            "model/m": float(self.m),
        }
        if self._round_up_bits:
            log["comm/uplink_bits_per_param"] = sum(self._round_up_bits) / (len(self._round_up_bits) * self.n)
        if self._round_xent:
            log["comm/uplink_xent_bits_per_param"] = sum(self._round_xent) / (len(self._round_xent) * self.n)
        for name, value in log.items():
            self.log(name, value, on_step=True, on_epoch=False)

    # ------------------------------------------------------------------ evaluation
    def expected_weights(self) -> Tensor:
        """w = Q·p (the expected network)."""
        return self.q.matvec(self.effective_p(self.p.detach()))

    def _load_expected(self) -> None:
        assign_flat_(self.model, self.expected_weights().to(self.device))
        self._eval_batches = []

    @override
    def on_validation_epoch_start(self) -> None:
        self._load_expected()

    @override
    def on_test_epoch_start(self) -> None:
        self._load_expected()

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self._eval_batches.append((batch[0].detach(), batch[1].detach()))

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        self._eval_batches.append((batch[0].detach(), batch[1].detach()))

    @torch.no_grad()
    def _accuracy(self, w: Tensor) -> float:
        correct, total = 0, 0
        for x, y in self._eval_batches:
            out = self.eval_net.forward(x, w)
            correct += int((out.argmax(dim=1) == y).sum())
            total += len(y)
        return correct / max(total, 1)

    @torch.no_grad()
    def sampled_accuracies(self, num_samples: int) -> Tensor:
        """Accuracy of ``num_samples`` networks w = Q·z, z ~ Bernoulli(p), on the stashed split.

        The masks come from the server stream of the current round, so validation and test
        see the same first masks (the mask chosen on validation is scored on test).
        """
        gen = self.generator(self.global_step, SERVER, "zampling_eval_masks")
        return self._accuracies_sampled_from(self.effective_p(self.p.detach()).cpu(), num_samples, gen)

    def _accuracies_sampled_from(self, p: Tensor, num_samples: int, gen: torch.Generator) -> Tensor:
        """Accuracy of ``num_samples`` networks w = Q·z, z ~ Bernoulli(p) drawn from ``gen``."""
        accs = [
            self._accuracy(self.q.matvec(torch.bernoulli(p, generator=gen)).to(self.device)) for _ in range(num_samples)
        ]
        return torch.tensor(accs, dtype=torch.float64)

    def _log_sampled(self, split: str, num_samples: int) -> None:
        if self.task != "classification" or not self._eval_batches:
            return
        expected = self._accuracy(self.expected_weights().to(self.device))
        accs = self.sampled_accuracies(num_samples)
        p = self.effective_p(self.p.detach())
        discretised = self._accuracy(self.q.matvec((p >= 0.5).float()).to(self.device))
        metrics = {
            f"{split}/acc_sampled_mean": float(accs.mean()),
            f"{split}/acc_sampled_std": float(accs.std()) if len(accs) > 1 else 0.0,
            f"{split}/acc_sampled_max": float(accs.max()),
            f"{split}/acc_discretised": discretised,
            f"{split}/integrality_gap": expected - float(accs.mean()),
        }
        best = int(accs.argmax())
        if split == "val":
            self._val_best_index = (self.global_step, best)
            metrics["val/acc_best_mask"] = float(accs[best])
        else:
            chosen = self._val_best_index
            index = (
                chosen[1] if chosen is not None and chosen[0] == self.global_step and chosen[1] < len(accs) else best
            )
            metrics["test/acc_best_mask"] = float(accs[index])
        for name, value in metrics.items():
            self.log(name, value)
        self._eval_batches = []

    @override
    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_sampled("val", self.val_samples)

    @override
    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        if self.sensitivity_taus and self.task == "classification" and self._eval_batches:
            for name, value in self.sensitivity_metrics().items():
                self.log(name, value)
        self._log_sampled("test", self.test_samples)

    @torch.no_grad()
    def sensitivity_metrics(self) -> dict[str, float]:
        """The paper's parameter-sensitivity table row for each τ, on the stashed split.

        References are the unperturbed expected network Q·p and the mean of
        ``sensitivity_samples`` sampled networks; each of ``sensitivity_perturbations``
        perturbed vectors p̃ = clip(p + ε_τ, 0, 1) is scored the same way. Sensitivity is the
        relative accuracy drop, deviation the drop in percentage points per unit ‖ε_τ‖₂; all
        are averaged over the perturbations (``_std``: their standard deviation).
        """
        gen = self.generator(self.global_step, SERVER, "zampling_sensitivity")
        p = self.effective_p(self.p.detach()).cpu()

        def scores(vector: Tensor) -> tuple[float, float]:
            expected = self._accuracy(self.q.matvec(vector).to(self.device))
            return expected, float(self._accuracies_sampled_from(vector, self.sensitivity_samples, gen).mean())

        reference = scores(p)
        out: dict[str, float] = {
            "test/sensitivity/reference_acc_expected": reference[0],
            "test/sensitivity/reference_acc_sampled": reference[1],
        }
        for tau in self.sensitivity_taus:
            rows: dict[str, list[float]] = {}
            for _ in range(self.sensitivity_perturbations):
                perturbed, eps = perturb_in_hypercube(p, tau, gen, self.sensitivity_region)
                norm = float(eps.norm())
                for kind, ref, acc in zip(("expected", "sampled"), reference, scores(perturbed), strict=True):
                    rows.setdefault(f"acc_{kind}", []).append(acc)
                    rows.setdefault(f"sensitivity_{kind}", []).append(relative_sensitivity(ref, acc))
                    rows.setdefault(f"deviation_{kind}", []).append(accuracy_deviation(ref, acc, norm))
                rows.setdefault("eps_norm", []).append(norm)
            support = perturbation_support(p, tau, self.sensitivity_region)
            out[f"test/sensitivity/{tau:g}/perturbed_fraction"] = float(support.float().mean())
            for key, values in rows.items():
                t = torch.tensor(values, dtype=torch.float64)
                out[f"test/sensitivity/{tau:g}/{key}"] = float(t.mean())
                out[f"test/sensitivity/{tau:g}/{key}_std"] = float(t.std()) if len(values) > 1 else 0.0
        return out

    @override
    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.device.type != "cpu":
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
