"""The terms of E-FLoPS's local objective and their variants.

Paper: E-FLoPS, arXiv 2607.00275; hard-concrete gates of Louizos et al., arXiv 1712.01312.
Each client minimises over θ̃ and φ = log α

    L = ℓ(h(x; θ̃ ⊙ z)) + λ c(φ) + (μ/2) c² + T_t KL(q(z) ‖ p(z)),

with the L0 density D(φ) (:data:`DENSITY_ESTIMATORS`, ``method.density_estimator``), the
constraint c = c(D, ρ) (:data:`CONSTRAINT_SCALES`, ``method.constraint_scale``), the dual step
on λ for D = ρ or D ≤ ρ (:data:`CONSTRAINTS`, ``method.constraint``), the prior p(z) =
Bernoulli(p) (:data:`PRIORS`, ``method.prior``) and the temperature T_t of round t
(:data:`TEMPERATURE_SCHEDULES`, ``method.temperature_schedule``). Each key takes a name of
its table or a ``_target_`` to one of the classes here.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import ClassVar, Literal

import torch
from torch import Tensor

from fedlightning.methods.strategy import Strategy
from fedlightning.models.hard_concrete import HardConcrete

__all__ = [
    "CONSTRAINTS",
    "CONSTRAINT_SCALES",
    "DENSITY_ESTIMATORS",
    "PRIORS",
    "TEMPERATURE_SCHEDULES",
    "AbsoluteScale",
    "ConstantTemperature",
    "Constraint",
    "ConstraintName",
    "ConstraintScale",
    "ConstraintScaleName",
    "CosineDecay",
    "DensityEstimator",
    "DensityEstimatorName",
    "Equality",
    "ExpectedGate",
    "Inequality",
    "LinearDecay",
    "LogScale",
    "Prior",
    "PriorName",
    "ProbNonzero",
    "RelativeScale",
    "TargetPrior",
    "TemperatureSchedule",
    "TemperatureScheduleName",
    "UniformPrior",
    "annealed_temperature",
    "dual_ascent_step",
    "kl_to_constraint_pull",
]


# ---------------------------------------------------------------------------------------- density D(φ)
class DensityEstimator(Strategy):
    """D(φ), the expected fraction of open gates, differentiable in log α."""

    @abstractmethod
    def __call__(self, hc: HardConcrete, log_alpha: Tensor, nodes: int) -> Tensor:
        """D for the gates ``hc`` at ``log_alpha`` (``nodes``: quadrature points where one is used)."""


class ProbNonzero(DensityEstimator):
    """D(φ) = mean_j P(z_j ≠ 0), the closed-form L0 surrogate (Louizos et al., arXiv 1712.01312).

    >>> round(float(ProbNonzero()(HardConcrete(), torch.zeros(3), 32)), 4)  # 1 / (1 + (1/11)^(2/3)) = 0.8318
    0.8318
    """

    name = "prob_nonzero"

    def __call__(self, hc: HardConcrete, log_alpha: Tensor, nodes: int) -> Tensor:
        return hc.prob_nonzero(log_alpha).mean()


class ExpectedGate(DensityEstimator):
    """D(φ) = mean_j E[z_j] by the midpoint rule over u with ``nodes`` points (the FLoPS text, arXiv 2512.23071).

    >>> float(ExpectedGate()(HardConcrete(), torch.zeros(3), 4))  # symmetric at log α = 0: E[z] = 1/2
    0.5
    """

    name = "expected_gate"

    def __call__(self, hc: HardConcrete, log_alpha: Tensor, nodes: int) -> Tensor:
        return hc.expected_gate(log_alpha, nodes=nodes).mean()


DensityEstimatorName = Literal["prob_nonzero", "expected_gate"]
"""The names of :data:`DENSITY_ESTIMATORS`."""

DENSITY_ESTIMATORS: dict[str, DensityEstimator] = {"prob_nonzero": ProbNonzero(), "expected_gate": ExpectedGate()}
"""``method.density_estimator`` → D(hc, log α, quadrature nodes)."""


# ---------------------------------------------------------------------------------------- constraint c(D, ρ)
class ConstraintScale(Strategy):
    """c(D, ρ); every scale has one feasible set (c ≤ 0 iff D ≤ ρ) and its own dual dynamics."""

    @abstractmethod
    def __call__(self, density: Tensor, rho: float) -> Tensor:
        """c at the density ``density`` for the target ``rho``."""


class AbsoluteScale(ConstraintScale):
    """c = D − ρ (the text): dual steps below the target are ρ times smaller than the overshoot above it.

    >>> round(float(AbsoluteScale()(torch.tensor(0.04), 0.02)), 4)
    0.02
    """

    name = "absolute"

    def __call__(self, density: Tensor, rho: float) -> Tensor:
        return density - rho


class RelativeScale(ConstraintScale):
    """c = D/ρ − 1: a density at ρ/2 moves λ as fast as one at 1.5 ρ.

    >>> float(RelativeScale()(torch.tensor(0.04), 0.02))
    1.0
    """

    name = "relative"

    def __call__(self, density: Tensor, rho: float) -> Tensor:
        return density / rho - 1.0


class LogScale(ConstraintScale):
    """c = log D − log ρ: over- and undershoot by a factor move λ alike.

    >>> round(float(LogScale()(torch.tensor(0.04), 0.02)), 4)  # log 2
    0.6931
    """

    name = "log"

    def __call__(self, density: Tensor, rho: float) -> Tensor:
        return torch.log(density) - math.log(rho)


ConstraintScaleName = Literal["log", "relative", "absolute"]
"""The names of :data:`CONSTRAINT_SCALES`."""

CONSTRAINT_SCALES: dict[str, ConstraintScale] = {
    "log": LogScale(),
    "relative": RelativeScale(),
    "absolute": AbsoluteScale(),
}
"""``method.constraint_scale`` → c(D, ρ).

>>> [round(float(CONSTRAINT_SCALES[k](torch.tensor(0.04), 0.02)), 4) for k in ("log", "relative", "absolute")]
[0.6931, 1.0, 0.02]
"""


# ---------------------------------------------------------------------------------------- the dual step on λ
def dual_ascent_step(lagrange: float, constraint: float, lr: float, *, nonnegative: bool) -> float:
    """λ ← λ + η_λ c, projected on λ ≥ 0 when ``nonnegative`` (the inequality D ≤ ρ).

    >>> dual_ascent_step(0.5, 0.2, 2.0, nonnegative=False), dual_ascent_step(0.1, -0.2, 1.0, nonnegative=True)
    (0.9, 0.0)
    """
    new = lagrange + lr * constraint
    return max(0.0, new) if nonnegative else new


class Constraint(Strategy):
    """How λ enforces the target density: D = ρ (λ free in sign) or D ≤ ρ (λ ≥ 0)."""

    nonnegative: ClassVar[bool]
    """λ is projected on λ ≥ 0 after every dual step."""

    def dual_step(self, lagrange: float, c: float, lr: float) -> float:
        """λ + η_λ c, projected (:func:`dual_ascent_step`)."""
        return dual_ascent_step(lagrange, c, lr, nonnegative=self.nonnegative)

    @abstractmethod
    def violation(self, c: Tensor) -> Tensor:
        """The part of c that the augmented-Lagrangian term (μ/2) · violation² penalises."""


class Equality(Constraint):
    """D = ρ, the target density of the text: λ is free in sign and any c ≠ 0 is penalised.

    >>> Equality().dual_step(2.0, -0.75, 4.0), Equality().violation(torch.tensor([-0.5, 0.25])).tolist()
    (-1.0, [-0.5, 0.25])
    """

    name = "equality"
    nonnegative = False

    def violation(self, c: Tensor) -> Tensor:
        return c


class Inequality(Constraint):
    """D ≤ ρ: λ ≥ 0, and only c > 0 is penalised.

    >>> Inequality().dual_step(2.0, -0.75, 4.0), Inequality().violation(torch.tensor([-0.5, 0.25])).tolist()
    (0.0, [0.0, 0.25])
    """

    name = "inequality"
    nonnegative = True

    def violation(self, c: Tensor) -> Tensor:
        return c.clamp_min(0.0)


ConstraintName = Literal["inequality", "equality"]
"""The names of :data:`CONSTRAINTS`."""

CONSTRAINTS: dict[str, Constraint] = {"inequality": Inequality(), "equality": Equality()}
"""``method.constraint`` → the dual projection and the penalised violation."""


# ---------------------------------------------------------------------------------------- prior p(z)
class Prior(Strategy):
    """p(z_j) = Bernoulli(p) of the KL term; :meth:`probability` gives p for the target density ρ."""

    @abstractmethod
    def probability(self, rho: float) -> float:
        """p for the target density ``rho``."""


class TargetPrior(Prior):
    """p = ρ (the text).

    >>> TargetPrior().probability(0.02)
    0.02
    """

    name = "target"

    def probability(self, rho: float) -> float:
        return rho


class UniformPrior(Prior):
    """p = 1/2: the KL is log 2 minus the gate entropy (entropy maximisation).

    >>> UniformPrior().probability(0.02)
    0.5
    """

    name = "uniform"

    def probability(self, rho: float) -> float:
        return 0.5


PriorName = Literal["target", "uniform"]
"""The names of :data:`PRIORS`."""

PRIORS: dict[str, Prior] = {"target": TargetPrior(), "uniform": UniformPrior()}
"""``method.prior`` → p."""


def kl_to_constraint_pull(pi: Tensor, lagrange: float, temperature: float, prior: float) -> Tensor:
    """|∂(T · KL)/∂π_j| / |∂(λ c)/∂π_j| per gate, for c = D − ρ and the mean KL to Bernoulli(``prior``).

    Both terms are means over |θ|, so the factor 1/|θ| (and ∂π_j/∂φ_j) cancels and the ratio is
    T |logit π_j − logit p| / |λ|: how strongly the entropy term pulls a gate relative to the
    density constraint (inf where λ = 0).

    >>> [round(v, 4) for v in kl_to_constraint_pull(torch.tensor([0.5, 0.9]), -2.0, 0.1, 0.5).tolist()]
    [0.0, 0.1099]
    """
    p = torch.as_tensor(prior, dtype=pi.dtype, device=pi.device)
    q = pi.clamp(1e-7, 1.0 - 1e-7)
    pull = temperature * (torch.logit(q) - torch.logit(p)).abs()
    return pull / abs(lagrange) if lagrange != 0 else torch.full_like(pull, math.inf)


# ---------------------------------------------------------------------------------------- temperature T_t
class TemperatureSchedule(Strategy):
    """T_t of round t (numbered from 1) of R: T at round 1; with s = (t − 1)/(R − 1) ∈ [0, 1]."""

    def at(self, temperature: float, *, round_idx: int, rounds: int) -> float:
        """T_t for the round-1 temperature ``temperature`` (T itself when R ≤ 1)."""
        if rounds <= 1:
            return temperature
        s = min(max((round_idx - 1) / (rounds - 1), 0.0), 1.0)
        return self.anneal(temperature, s)

    @abstractmethod
    def anneal(self, temperature: float, s: float) -> float:
        """T_t at the fraction ``s`` of the run."""


class ConstantTemperature(TemperatureSchedule):
    """T_t = T (the text names no schedule).

    >>> ConstantTemperature().at(0.4, round_idx=3, rounds=3)
    0.4
    """

    name = "constant"

    def anneal(self, temperature: float, s: float) -> float:
        return temperature


class LinearDecay(TemperatureSchedule):
    """T_t = T (1 − s): 0 at the last round.

    >>> [LinearDecay().at(0.4, round_idx=t, rounds=3) for t in (1, 2, 3)]
    [0.4, 0.2, 0.0]
    """

    name = "linear"

    def anneal(self, temperature: float, s: float) -> float:
        return temperature * (1.0 - s)


class CosineDecay(TemperatureSchedule):
    """T_t = T (1 + cos π s)/2: 0 at the last round.

    >>> round(CosineDecay().at(0.4, round_idx=2, rounds=3), 6)
    0.2
    """

    name = "cosine"

    def anneal(self, temperature: float, s: float) -> float:
        return temperature * 0.5 * (1.0 + math.cos(math.pi * s))


TemperatureScheduleName = Literal["constant", "linear", "cosine"]
"""The names of :data:`TEMPERATURE_SCHEDULES`."""

TEMPERATURE_SCHEDULES: dict[str, TemperatureSchedule] = {
    "constant": ConstantTemperature(),
    "linear": LinearDecay(),
    "cosine": CosineDecay(),
}
"""``method.temperature_schedule`` → T_t."""


def annealed_temperature(temperature: float, *, round_idx: int, rounds: int, schedule: str) -> float:
    """T_t of round ``round_idx`` (numbered from 1) of ``rounds`` under the schedule named ``schedule``.

    >>> [annealed_temperature(0.4, round_idx=t, rounds=3, schedule="linear") for t in (1, 2, 3)]
    [0.4, 0.2, 0.0]
    """
    chosen = TEMPERATURE_SCHEDULES.get(schedule)
    if chosen is None:
        raise ValueError(f"unknown temperature schedule {schedule!r}; choose one of {', '.join(TEMPERATURE_SCHEDULES)}")
    return chosen.at(temperature, round_idx=round_idx, rounds=rounds)
