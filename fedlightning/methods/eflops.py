"""E-FLoPS: entropy-regularised federated learning with probabilistic gates (arXiv 2607.00275).

Every parameter j has a hard-concrete gate z_j with parameter φ_j = log α_j (Louizos et al.,
arXiv 1712.01312) and the network uses θ = θ̃ ⊙ z. One round:

1. The server broadcasts the top-m coordinates of its (θ̃, π = P(z ≠ 0)) and λ, m = ⌊ρ |θ|⌋
   (:mod:`fedlightning.compression.gated_sparse`, both directions).
2. Each client rebuilds (θ̃, log α, λ) from the message (off the support:
   :mod:`fedlightning.methods.eflops_off_support`) and runs local SGD on θ̃ and φ for

       L = (1/n_k) Σ_i ℓ(h(x_i; θ̃ ⊙ z), y_i) + λ c(φ) + (μ/2) c² + T_t (1/|θ|) Σ_j KL(q(z_j) ‖ p(z_j)),

   one gate sample per mini-batch, the L0 density constraint c = D(φ) − ρ with D(φ) =
   (1/|θ|) Σ_j P(z_j ≠ 0), q(z_j) = Bernoulli(P(z_j ≠ 0)), p = Bernoulli(ρ), and after every
   step λ ← λ + η_λ c (:mod:`fedlightning.methods.eflops_lagrangian`).
3. It uploads its own top m (:mod:`fedlightning.methods.eflops_support`) and λ.
4. The server rebuilds θ̃ and π̄ as sample-weighted means over the senders and recovers log α
   from π̄ (:mod:`fedlightning.methods.eflops_aggregation`).

The evaluated network is θ̃ ⊙ E[z] pruned to its m largest magnitudes. The multiplier enforces
a user-given *target* density, so the constraint is D = ρ and λ is free in sign. A gate no
message carries is closed on both sides (round 1 starts from the shared open initial gates
with λ held), so D counts the gates the model holds; T_t is constant (the text names no schedule).

Every choice above is a small strategy chosen by a config key, by name or by ``_target_``
(:meth:`fedlightning.methods.strategy.Strategy.choose`). Departures from the text are named options,
measured in ``benchmarks/results/eflops.md``: ``constraint_scale``, ``penalty`` (augmented
Lagrangian), ``constraint="inequality"``, ``density_estimator="expected_gate"``,
``prior="uniform"``, ``temperature_schedule``, ``off_support_gates="resume"`` / ``"regrow"`` /
``"reset"``, ``support_allocation="per_tensor"`` and an Adam optimiser.

On the ``vectorised`` backend a process's clients train at once on stacked (θ̃, log α, λ)
(:mod:`fedlightning.methods.eflops_stacked`), as :meth:`EFLoPS.client_update` trains each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedlightning.compression.gated_sparse import GateMessageCodec, pack_gate_state, unpack_gate_state
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, Estimator
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER
from fedlightning.methods import eflops_stacked
from fedlightning.methods.eflops_aggregation import (
    GATE_AGGREGATIONS,
    GateAggregation,
    GateAggregationName,
    GatedUploadSums,
)
from fedlightning.methods.eflops_lagrangian import (
    CONSTRAINT_SCALES,
    CONSTRAINTS,
    DENSITY_ESTIMATORS,
    PRIORS,
    TEMPERATURE_SCHEDULES,
    Constraint,
    ConstraintName,
    ConstraintScale,
    ConstraintScaleName,
    DensityEstimator,
    DensityEstimatorName,
    Prior,
    PriorName,
    TemperatureSchedule,
    TemperatureScheduleName,
    kl_to_constraint_pull,
)
from fedlightning.methods.eflops_off_support import (
    OFF_SUPPORT_GATES,
    OFF_SUPPORT_WEIGHTS,
    OffSupportGates,
    OffSupportGatesName,
    OffSupportWeights,
    OffSupportWeightsName,
    off_support_means,
)
from fedlightning.methods.eflops_support import (
    FINAL_SUPPORTS,
    SELECTIONS,
    SUPPORT_ALLOCATIONS,
    FinalSupport,
    FinalSupportName,
    Selection,
    SelectionName,
    SupportAllocation,
    SupportAllocationName,
    TopMSupport,
)
from fedlightning.metrics.sparse_report import unflatten
from fedlightning.metrics.sparsity import num_kept
from fedlightning.models.hard_concrete import HardConcrete, bernoulli_kl, uniform_noise

__all__ = ["EFLoPS"]


@dataclass
class _LocalGates:
    """One client's local-training state in :meth:`EFLoPS.client_update` (shared by the loss and the dual step)."""

    names: list[str]
    sizes: list[int]
    lagrange: float
    data_loss_sum: Tensor
    density: Tensor | None = None


class EFLoPS(FederatedModule):
    """E-FLoPS with hard-concrete gates, an L0 density constraint by dual ascent, and a KL term.

    Each variant key takes the name of a strategy in its table, or the strategy itself (a
    ``_target_`` config); the defaults are the text's algorithm.

    Args:
        density: target density ρ (``method.density``); m = ⌊ρ |θ|⌋ coordinates are sent.
        temperature: weight T of the KL (relative-entropy) regulariser at round 1.
        temperature_schedule: T_t, ``"constant"``, ``"linear"`` or ``"cosine"`` decay to 0 at the
            last round (:data:`~fedlightning.methods.eflops_lagrangian.TEMPERATURE_SCHEDULES`).
        prior: p(z_j) = Bernoulli(ρ) (``"target"``) or Bernoulli(1/2) (``"uniform"``: the KL is
            log 2 minus the gate entropy) (:data:`~fedlightning.methods.eflops_lagrangian.PRIORS`).
        density_estimator: D = mean P(z ≠ 0) (``"prob_nonzero"``, closed form) or mean E[z]
            (``"expected_gate"``, midpoint quadrature with ``quadrature_nodes`` nodes).
        quadrature_nodes: midpoints for ``expected_gate`` and for E[z] of the evaluated network.
        lambda_lr: dual-ascent step η_λ of the Lagrange multiplier.
        lambda_init: initial λ.
        log_alpha_lr: learning rate of the gate parameters (a second group of ``client_optimizer``).
        log_alpha_init: initial log α (0: P(z ≠ 0) = 0.83).
        log_alpha_min: lower clamp of log α (Louizos' −4.6 would floor P(z ≠ 0) at 0.047 > ρ).
        log_alpha_max: upper clamp of log α.
        selection: top-m score, |θ̃| P(z ≠ 0) (``"expected_magnitude"``) or |θ̃ ⊙ ẑ| with the
            test-time gate (``"test_gate"``) (:data:`~fedlightning.methods.eflops_support.SELECTIONS`).
        off_support: θ̃ off the broadcast support: its initial value (``"init"``, from the shared
            seed, no bits) or 0 (``"zero"``).
        constraint: ``"equality"`` (D = ρ, λ free in sign) or ``"inequality"`` (D ≤ ρ, λ ≥ 0).
        off_support_gates: log α off the support: ``"closed"``, ``"regrow"`` (needs an SGD
            ``client_optimizer``), ``"resume"`` or ``"reset"``
            (:data:`~fedlightning.methods.eflops_off_support.OFF_SUPPORT_GATES`).
        constraint_scale: c = D − ρ (``"absolute"``, the text), D/ρ − 1 (``"relative"``) or
            log D − log ρ (``"log"``).
        gate_aggregation: π̄_j averaged over the senders of j (``"senders"``) or all clients (``"all"``).
        penalty: μ of the augmented-Lagrangian term (μ/2) c² (0: the plain Lagrangian of the text).
        final_support: ``"top_m"`` (the m largest |θ̃ ⊙ E[z]|) or ``"test_gate"`` (top-m by
            ``selection`` times the test-time gate).
        support_allocation: how the top m is drawn, for the messages, the server's regrow
            rebuild and the final support alike: ``"global"`` (one ranking over all of θ) or
            ``"per_tensor"`` (:data:`~fedlightning.methods.eflops_support.SUPPORT_ALLOCATIONS`).
        **kwargs: the :class:`FederatedModule` arguments (no ``server_optimizer``: the server
            sets its rebuilt state).
    """

    uplink_payload = Payload.GATED_SPARSE
    downlink_payload = Payload.GATED_SPARSE
    sets_server_state = True
    needed_callbacks = ("sparse_report",)  # the test-time sparse-model report (fedlightning.callbacks.declared)
    client_weighting = "samples"
    stateless_clients = True  # weights and gates start from the broadcast; the dual variable is the server's
    supported_aggregation: ClassVar[tuple[Estimator, ...]] = ("normalised",)
    """A rebuilt state is a mean of the clients' states: dividing by p_i would rescale it."""
    client_metric_names = ("eflops/local_density",)

    def __init__(
        self,
        *,
        density: float,
        temperature: float = 1e-3,
        temperature_schedule: TemperatureScheduleName | TemperatureSchedule = "constant",
        prior: PriorName | Prior = "target",
        density_estimator: DensityEstimatorName | DensityEstimator = "prob_nonzero",
        quadrature_nodes: int = 32,
        lambda_lr: float = 0.0005,
        lambda_init: float = 0.0,
        log_alpha_lr: float = 0.05,
        log_alpha_init: float = 0.0,
        log_alpha_min: float = -10.0,
        log_alpha_max: float = 10.0,
        selection: SelectionName | Selection = "expected_magnitude",
        off_support: OffSupportWeightsName | OffSupportWeights = "init",
        constraint: ConstraintName | Constraint = "equality",
        off_support_gates: OffSupportGatesName | OffSupportGates = "closed",
        constraint_scale: ConstraintScaleName | ConstraintScale = "absolute",
        gate_aggregation: GateAggregationName | GateAggregation = "senders",
        penalty: float = 0.0,
        final_support: FinalSupportName | FinalSupport = "top_m",
        support_allocation: SupportAllocationName | SupportAllocation = "global",
        **kwargs: Any,
    ) -> None:
        model: nn.Module = kwargs["model"]
        dim = num_parameters(model)
        try:
            m = num_kept(density, dim)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        prior_ = Prior.choose("prior", prior, PRIORS)
        schedule = TemperatureSchedule.choose("temperature_schedule", temperature_schedule, TEMPERATURE_SCHEDULES)
        estimator = DensityEstimator.choose("density_estimator", density_estimator, DENSITY_ESTIMATORS)
        selection_ = Selection.choose("selection", selection, SELECTIONS)
        weights_off = OffSupportWeights.choose("off_support", off_support, OFF_SUPPORT_WEIGHTS)
        constraint_ = Constraint.choose("constraint", constraint, CONSTRAINTS)
        gates_off = OffSupportGates.choose("off_support_gates", off_support_gates, OFF_SUPPORT_GATES)
        scale = ConstraintScale.choose("constraint_scale", constraint_scale, CONSTRAINT_SCALES)
        aggregation = GateAggregation.choose("gate_aggregation", gate_aggregation, GATE_AGGREGATIONS)
        final = FinalSupport.choose("final_support", final_support, FINAL_SUPPORTS)
        allocation = SupportAllocation.choose("support_allocation", support_allocation, SUPPORT_ALLOCATIONS)
        if temperature < 0 or lambda_lr < 0 or lambda_init < 0 or penalty < 0:
            raise ConfigError(
                "method.temperature, method.lambda_lr, method.lambda_init and method.penalty must be >= 0."
            )
        factory = kwargs.get("client_optimizer")
        if gates_off.regrows and getattr(factory, "func", torch.optim.SGD) is not torch.optim.SGD:
            raise ConfigError(
                f"method.off_support_gates={gates_off.name} predicts a closed coordinate's weight by plain SGD "
                "steps; use method.client_optimizer._target_=torch.optim.SGD or another off_support_gates."
            )
        group_sizes = [p.numel() for p in model.parameters()]
        try:
            support = TopMSupport.of(allocation, sizes=group_sizes, rho=float(density), m=m)
        except ValueError as exc:
            raise ConfigError(
                f"method.support_allocation={allocation.name}: {exc}; raise method.density or use "
                "method.support_allocation=global."
            ) from None
        if quadrature_nodes < 1:
            raise ConfigError(f"method.quadrature_nodes must be at least 1 (got {quadrature_nodes}).")
        try:
            hc = HardConcrete(log_alpha_min=log_alpha_min, log_alpha_max=log_alpha_max)
        except ValueError as exc:
            raise ConfigError(f"method.log_alpha_min/max: {exc}") from None
        super().__init__(**kwargs)
        self.hc = hc
        self.rho = float(density)
        self.m = m
        self.dim = dim
        self.temperature = float(temperature)
        self.temperature_schedule = schedule
        self.prior = prior_
        self.density_estimator = estimator
        self.quadrature_nodes = int(quadrature_nodes)
        self.lambda_lr = float(lambda_lr)
        self.log_alpha_lr = float(log_alpha_lr)
        self.log_alpha_init = float(min(max(log_alpha_init, log_alpha_min), log_alpha_max))
        self.selection = selection_
        self.off_support = weights_off
        self.constraint = constraint_
        self.off_support_gates = gates_off
        self.constraint_scale = scale
        self.gate_aggregation = aggregation
        self.penalty = float(penalty)
        self.final_support = final
        self.support = support
        self.group_sizes = group_sizes
        self.num_groups = len(group_sizes) if gates_off.carries_statistics else 0
        self.uplink_channel.codec = GateMessageCodec(num_groups=self.num_groups)
        self.downlink_channel.codec = GateMessageCodec(num_groups=self.num_groups)
        self.pi_min = float(self.hc.prob_nonzero(torch.tensor(float(log_alpha_min))))
        # θ̃⁰ is derived from the shared run seed (the model was built from it): free for both sides.
        self.register_buffer("theta_init", flat_parameters(model).clone(), persistent=False)
        noise = torch.randn(dim, generator=self.generator(0, SERVER, "log_alpha_init")) * 0.01  # Louizos: N(·, 0.01²)
        self.log_alpha = nn.Parameter(self.hc.clamp_(torch.full((dim,), self.log_alpha_init) + noise))
        self.lagrange = nn.Parameter(torch.tensor([float(lambda_init)]))
        self._eval_cache: tuple[int, Tensor] | None = None

    @property
    def dense_message_bits(self) -> int:
        """Reference for compression factors: one dense float32 copy of the network θ."""
        return 32 * self.dim

    @property
    def uplink_numel(self) -> int:
        """Entries of one (decoded) message: [θ̃ (|θ|), π (|θ|), π_off (one per tensor, ``"resume"``), λ]."""
        return 2 * self.dim + self.num_groups + 1

    @property
    def support_budgets(self) -> list[int]:
        """Coordinates each tensor may send (``[m]`` for ``"global"``)."""
        return self.support.budgets

    # ------------------------------------------------------------------ the local objective
    def density_estimate(self, log_alpha: Tensor) -> Tensor:
        """D(φ): the differentiable estimate of the expected fraction of open gates."""
        return self.density_estimator(self.hc, log_alpha, self.quadrature_nodes)

    def constraint_value(self, density: Tensor) -> Tensor:
        """c(φ) for the density D under ``constraint_scale``."""
        return self.constraint_scale(density, self.rho)

    def kl_term(self, log_alpha: Tensor) -> Tensor:
        """(1/|θ|) Σ_j KL(Bernoulli(P(z_j ≠ 0)) ‖ prior)."""
        return bernoulli_kl(self.hc.prob_nonzero(log_alpha), self.prior.probability(self.rho)).mean()

    def temperature_at(self, round_idx: int) -> float:
        """T_t of the engine's ``round_idx`` (0 for round 1) under ``temperature_schedule``."""
        trainer = self.attached_trainer
        rounds = int(trainer.max_steps) if trainer is not None and trainer.max_steps and trainer.max_steps > 0 else 1
        return self.temperature_schedule.at(self.temperature, round_idx=round_idx + 1, rounds=rounds)

    def lagrangian(
        self, data_loss: Tensor, log_alpha: Tensor, lagrange: float | Tensor, temperature: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(L, D, c): L = data loss + λ c + (μ/2) violation(c)² + T · KL at the gates ``log_alpha``."""
        density = self.density_estimate(log_alpha)
        c = self.constraint_value(density)
        loss = data_loss + lagrange * c
        if self.penalty > 0:  # augmented Lagrangian: damps the primal-dual oscillation
            loss = loss + 0.5 * self.penalty * self.constraint.violation(c) ** 2
        if temperature > 0:
            loss = loss + temperature * self.kl_term(log_alpha)
        return loss, density, c

    # ------------------------------------------------------------------ messages
    def selection_scores(self, theta: Tensor, log_alpha: Tensor) -> Tensor:
        """Score of each coordinate for the top-m support."""
        return self.selection.scores(self.hc, theta, log_alpha)

    def support_mask(self, scores: Tensor) -> Tensor:
        """The top-m support of ``scores`` under ``support_allocation`` (never a score of 0)."""
        return self.support.mask(scores)

    def upload_message(self, theta: Tensor, log_alpha: Tensor, lagrange: Tensor) -> Tensor:
        """The gate-state message of (θ̃, log α, λ): the top-m support, its values and gate probabilities."""
        support = self.support_mask(self.selection_scores(theta, log_alpha))
        pi = self.hc.prob_nonzero(log_alpha)
        pi_off = off_support_means(pi, support, self.group_sizes, self.pi_min) if self.num_groups else None
        return pack_gate_state(theta, pi, support, lagrange, pi_off)

    # ------------------------------------------------------------------ server
    def server_parameters(self) -> list[nn.Parameter]:
        return [*self.model.parameters(), self.log_alpha, self.lagrange]

    def broadcast_state(self, round_idx: int) -> Tensor:
        return self.upload_message(flat_parameters(self.model), self.log_alpha.detach(), self.lagrange.detach())

    def make_aggregator(self, round_idx: int) -> GatedUploadSums:
        return GatedUploadSums(
            dim=self.dim,
            group_sizes=self.group_sizes,
            num_groups=self.num_groups,
            pi_min=self.pi_min,
            senders_only=self.gate_aggregation.senders_only,
            device=self.device,
        )

    def set_server_state(self, *, round_idx: int, aggregator: Aggregator) -> None:
        """The rebuilt (θ̃, log α = inverse of π̄, λ) replaces the global state."""
        assert isinstance(aggregator, GatedUploadSums)
        theta, pi, lagrange = aggregator.result()
        assign_flat_(self.model, theta)
        with torch.no_grad():
            self.log_alpha.copy_(self.hc.log_alpha_from_prob_nonzero(pi.clamp(self.pi_min, 1.0 - 1e-7)))
            self.lagrange.copy_(lagrange)
            self.off_support_gates.after_rebuild_(
                self.log_alpha, theta, hc=self.hc, selection=self.selection, support=self.support
            )
        self._eval_cache = None

    def server_metrics(self, round_idx: int) -> dict[str, float]:
        """λ, D = mean P(z ≠ 0) and T_t of the server state; ``model/*`` (D, the median KL/constraint
        pull over the m most open gates) also reach the run summary as the last round's values."""
        pi = self.hc.prob_nonzero(self.log_alpha.detach())
        lam = float(self.lagrange.detach().squeeze())
        temperature = self.temperature_at(round_idx)
        pull = kl_to_constraint_pull(torch.topk(pi, self.m).values, lam, temperature, self.prior.probability(self.rho))
        return {
            "eflops/lambda": lam,
            "eflops/mean_prob_nonzero": float(pi.mean()),
            "eflops/temperature": temperature,
            "model/expected_density": float(pi.mean()),
            "model/kl_pull_ratio": float(pull.median()),
        }

    # ------------------------------------------------------------------ client
    def client_start(self, received: Tensor, round_idx: int = 1) -> tuple[Tensor, Tensor, float]:
        """A client's starting (θ̃, log α, λ) rebuilt from the received gate-state message."""
        theta_s, pi, support, pi_off, lam = unpack_gate_state(received, self.num_groups)
        theta_init: Tensor = self.theta_init  # type: ignore[assignment]  # a registered buffer
        theta = torch.where(support, theta_s, self.off_support.fill(theta_init, theta_s))
        log_alpha = self.off_support_gates.log_alpha(
            pi,
            round_idx=round_idx,
            pi_off=pi_off,
            hc=self.hc,
            log_alpha_init=self.log_alpha_init,
            pi_min=self.pi_min,
            sizes=self.group_sizes,
        )
        if support.any():
            log_alpha[support] = self.hc.log_alpha_from_prob_nonzero(pi[support])
        return theta, log_alpha, float(lam)

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local primal steps on (θ̃, log α) by :meth:`local_train`, dual ascent on λ after each step."""
        model = self.client_model
        theta, log_alpha0, lam = self.client_start(received, round_idx)
        assign_flat_(model, theta)
        model.train()
        log_alpha = log_alpha0.clone().requires_grad_(True)
        params = list(model.parameters())
        local = _LocalGates(
            names=[n for n, _ in model.named_parameters()],
            sizes=[p.numel() for p in params],
            lagrange=lam,
            data_loss_sum=torch.zeros((), device=self.device),
        )
        gate_gen = self.generator(round_idx, client_id, "gates")
        temperature = self.temperature_at(round_idx)
        screening = self.off_support_gates.screening(round_idx)
        closed = ~unpack_gate_state(received, self.num_groups)[2]
        regrowth = self.off_support_gates.regrowth(closed, round_idx, self.device)

        def batch_loss(x: Tensor, y: Tensor) -> Tensor:
            """One gate sample per mini-batch; the Lagrangian of θ̃ ⊙ z."""
            u = uniform_noise((self.dim,), gate_gen).to(log_alpha.device)
            z = self.hc.sample(log_alpha, u)
            gated = {
                n: p * zj.view_as(p) for n, p, zj in zip(local.names, params, torch.split(z, local.sizes), strict=True)
            }
            if regrowth is not None:  # keep ∂ℓ/∂θ at the closed coordinates (θ = 0 there)
                regrowth.watch(list(gated.values()))
            data_loss = self.loss_fn(functional_call(model, gated, (x,)), y)
            loss, density, _ = self.lagrangian(data_loss, log_alpha, local.lagrange, temperature)
            local.density = density.detach()
            local.data_loss_sum += data_loss.detach()
            return loss

        def after_step() -> None:
            """Clamp log α, then λ ← λ + η_λ c(D) at the density of the step (held in a screening round)."""
            self.hc.clamp_(log_alpha)
            if regrowth is not None:
                regrowth.add_step()
            assert local.density is not None
            c = float(self.constraint_value(local.density))
            if not screening:
                local.lagrange = self.constraint.dual_step(local.lagrange, c, self.lambda_lr)

        groups: list[dict[str, Any]] = [{"params": params}, {"params": [log_alpha], "lr": self.log_alpha_lr}]
        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=groups,
            batch_loss=batch_loss,
            after_step=after_step,
        )
        theta_out, log_alpha_out = flat_parameters(model), log_alpha.detach()
        if regrowth is not None:
            if not isinstance(done.optimizer, torch.optim.SGD):
                raise ConfigError("method.off_support_gates=regrow needs an SGD client_optimizer.")
            theta_out, log_alpha_out = regrowth.candidates(
                theta_out,
                log_alpha_out,
                steps=done.steps,
                lr=float(done.optimizer.param_groups[0]["lr"]),
                log_alpha_open=self.log_alpha_init,
            )
        upload = self.upload_message(theta_out, log_alpha_out, torch.tensor(local.lagrange))
        density = float(local.density) if local.density is not None else float("nan")
        return ClientResult(
            upload=upload,
            num_samples=done.num_samples,
            loss=local.data_loss_sum / max(done.steps, 1),  # the data term: train/loss compares across methods
            metrics={"eflops/local_density": density},
        )

    # ------------------------------------------------------------------ stacked clients (vectorised backend)
    def stacked_refusal(self) -> str | None:
        """Why the share cannot be trained at once as :meth:`client_update` trains each client (``None``: it can).

        See :func:`fedlightning.methods.eflops_stacked.stacked_refusal`.
        """
        return eflops_stacked.stacked_refusal(self)

    def stacked_client_updates(self, *, round_idx: int, share: list[int], received: Tensor) -> list[ClientResult]:
        """:meth:`client_update` of every client of ``share`` at once on stacked (θ̃, log α, λ).

        See :func:`fedlightning.methods.eflops_stacked.stacked_client_updates`.
        """
        return eflops_stacked.stacked_client_updates(self, round_idx=round_idx, share=share, received=received)

    # ------------------------------------------------------------------ evaluation
    def final_parameters(self, theta: Tensor, log_alpha: Tensor) -> Tensor:
        """The evaluated network for global (θ̃, log α) under ``final_support``."""
        return self.final_support.parameters(
            theta, log_alpha, hc=self.hc, nodes=self.quadrature_nodes, selection=self.selection, support=self.support
        )

    def evaluated_parameters(self) -> Tensor:
        """The evaluated flat parameters of the current global state (cached until the state changes)."""
        step = int(self.global_step)
        if self._eval_cache is None or self._eval_cache[0] != step:
            self._eval_cache = (step, self.final_parameters(flat_parameters(self.model), self.log_alpha.detach()))
        return self._eval_cache[1]

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.model, unflatten(self.model, self.evaluated_parameters()), (x,))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._eval_cache = None
