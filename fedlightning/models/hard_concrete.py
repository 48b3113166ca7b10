"""Hard-concrete gates (Louizos, Welling & Kingma, "Learning Sparse Neural Networks through
L0 Regularization", ICLR 2018, arXiv 1712.01312).

A gate z ∈ [0, 1] is a stretched and clipped binary-concrete variable:

    u ~ U(ε, 1 − ε),  s = sigmoid((log u − log(1 − u) + log α) / β),
    s̄ = s (ζ − γ) + γ,  z = min(1, max(0, s̄)),

with temperature β = 2/3 and stretch interval (γ, ζ) = (−0.1, 1.1), as in the authors'
``AMLab-Amsterdam/L0_regularization`` code. The gate is exactly zero with probability
Q(s̄ ≤ 0) = sigmoid(β log(−γ/ζ) − log α), so

    P(z ≠ 0) = sigmoid(log α − β log(−γ/ζ)),

the closed-form L0 surrogate. The deterministic test-time gate (paper eq. 13) has no
temperature: ẑ = min(1, max(0, sigmoid(log α)(ζ − γ) + γ)); it is exactly zero once
sigmoid(log α) ≤ −γ/(ζ − γ) = 1/12, i.e. for P(z ≠ 0) ≤ 0.31. ``E[z]`` has no closed form; it is
computed by a fixed midpoint rule over u (:func:`expected_gate`, differentiable in log α, but
exactly zero when no node lands in the open region) or over the gate value x of the tail
integral E[z] = ∫₀¹ P(z > x) dx (:func:`expected_gate_tail`, strictly positive for finite log α).

>>> import torch
>>> round(float(prob_nonzero(torch.tensor(0.0))), 3)
0.832
>>> float(test_gate(torch.tensor(0.0)))
0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "BETA",
    "EPSILON",
    "GAMMA",
    "LOG_ALPHA_RANGE",
    "ZETA",
    "HardConcrete",
    "bernoulli_kl",
    "expected_gate",
    "expected_gate_tail",
    "gate_survival",
    "log_alpha_from_prob_nonzero",
    "prob_nonzero",
    "sample_gate",
    "test_gate",
    "uniform_noise",
]

BETA = 2.0 / 3.0
GAMMA = -0.1
ZETA = 1.1
EPSILON = 1e-6
#: Louizos et al. clamp log α to [log 1e-2, log 1e2] after every optimiser step.
LOG_ALPHA_RANGE = (math.log(1e-2), math.log(1e2))


def uniform_noise(shape: tuple[int, ...] | torch.Size, generator: torch.Generator, eps: float = EPSILON) -> Tensor:
    """u ~ U(ε, 1 − ε) drawn on CPU from ``generator``."""
    return torch.rand(shape, generator=generator) * (1.0 - 2.0 * eps) + eps


def sample_gate(
    log_alpha: Tensor, u: Tensor, *, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA
) -> Tensor:
    """Reparameterised hard-concrete sample z(u; log α), differentiable in ``log_alpha``.

    >>> import torch
    >>> float(sample_gate(torch.tensor(0.0), torch.tensor(0.5)))  # s = 1/2, s̄ = 0.5
    0.5
    """
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    return torch.clamp(s * (zeta - gamma) + gamma, 0.0, 1.0)


def prob_nonzero(log_alpha: Tensor, *, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """P(z ≠ 0) = sigmoid(log α − β log(−γ/ζ)) (the closed-form L0 surrogate)."""
    return torch.sigmoid(log_alpha - beta * math.log(-gamma / zeta))


def log_alpha_from_prob_nonzero(p: Tensor, *, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """Inverse of :func:`prob_nonzero`: log α = logit(p) + β log(−γ/ζ).

    >>> import torch
    >>> float(log_alpha_from_prob_nonzero(prob_nonzero(torch.tensor(1.25))))  # doctest: +ELLIPSIS
    1.25...
    """
    return torch.logit(p) + beta * math.log(-gamma / zeta)


def test_gate(log_alpha: Tensor, *, gamma: float = GAMMA, zeta: float = ZETA) -> Tensor:
    """Deterministic test-time gate ẑ = clip(sigmoid(log α)(ζ − γ) + γ, 0, 1) (no temperature)."""
    return torch.clamp(torch.sigmoid(log_alpha) * (zeta - gamma) + gamma, 0.0, 1.0)


test_gate.__test__ = False  # type: ignore[attr-defined]  # a gate, not a pytest test


def expected_gate(
    log_alpha: Tensor, *, nodes: int = 32, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA
) -> Tensor:
    """E[z] by the midpoint rule over u ∈ (0, 1) with ``nodes`` points (differentiable).

    >>> import torch
    >>> round(float(expected_gate(torch.tensor(0.0), nodes=2000)), 3)  # symmetric: E[z] = 1/2
    0.5
    """
    u = (torch.arange(nodes, dtype=log_alpha.dtype, device=log_alpha.device) + 0.5) / nodes
    z = sample_gate(log_alpha.unsqueeze(-1), u, beta=beta, gamma=gamma, zeta=zeta)
    return z.mean(dim=-1)


def gate_survival(
    x: Tensor | float, log_alpha: Tensor, *, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA
) -> Tensor:
    """P(z > x) for x ∈ [0, 1): sigmoid(log α − β logit((x − γ)/(ζ − γ))).

    s̄ > x ⇔ s > t with t = (x − γ)/(ζ − γ), and P(s > t) = sigmoid(log α − β logit t) for the
    binary-concrete s; at x = 0 this is :func:`prob_nonzero`.

    >>> import torch
    >>> float(gate_survival(0.5, torch.tensor(0.0)))  # t = 1/2: sigmoid(0)
    0.5
    """
    t = (torch.as_tensor(x, dtype=log_alpha.dtype, device=log_alpha.device) - gamma) / (zeta - gamma)
    return torch.sigmoid(log_alpha - beta * torch.logit(t))


def expected_gate_tail(
    log_alpha: Tensor, *, nodes: int = 32, beta: float = BETA, gamma: float = GAMMA, zeta: float = ZETA
) -> Tensor:
    """E[z] = ∫₀¹ P(z > x) dx by the midpoint rule over x with ``nodes`` points.

    The integrand is smooth and positive on [0, 1], so unlike :func:`expected_gate` (nodes in
    u) the result is strictly positive for every finite log α, however small P(z ≠ 0) is.

    >>> import torch
    >>> float(expected_gate_tail(torch.tensor(0.0), nodes=4))  # symmetric nodes: exactly 1/2
    0.5
    """
    total = torch.zeros_like(log_alpha)
    for k in range(nodes):  # one node at a time: O(|θ|) memory for large networks
        total = total + gate_survival((k + 0.5) / nodes, log_alpha, beta=beta, gamma=gamma, zeta=zeta)
    return total / nodes


def bernoulli_kl(q: Tensor, p: float | Tensor, eps: float = 1e-7) -> Tensor:
    """KL(Bernoulli(q) ‖ Bernoulli(p)) elementwise, in nats.

    >>> import torch
    >>> round(float(bernoulli_kl(torch.tensor(0.5), 0.25)), 4)  # 0.5 ln 2 + 0.5 ln(2/3)
    0.1438
    """
    q = q.clamp(eps, 1.0 - eps)
    p_t = torch.as_tensor(p, dtype=q.dtype, device=q.device).clamp(eps, 1.0 - eps)
    return q * (torch.log(q) - torch.log(p_t)) + (1.0 - q) * (torch.log1p(-q) - torch.log1p(-p_t))


@dataclass(frozen=True, kw_only=True)
class HardConcrete:
    """The hard-concrete distribution with its constants and the log α clamp.

    Attributes:
        beta: temperature β (2/3).
        gamma: lower stretch limit γ (−0.1).
        zeta: upper stretch limit ζ (1.1).
        log_alpha_min: lower clamp of log α (Louizos: log 1e-2).
        log_alpha_max: upper clamp of log α (Louizos: log 1e2).
    """

    beta: float = BETA
    gamma: float = GAMMA
    zeta: float = ZETA
    log_alpha_min: float = LOG_ALPHA_RANGE[0]
    log_alpha_max: float = LOG_ALPHA_RANGE[1]

    def __post_init__(self) -> None:
        if not (self.beta > 0 and self.gamma < 0 and self.zeta > 1):
            raise ValueError(
                "Hard-concrete constants need beta > 0, gamma < 0 < 1 < zeta "
                f"(got {self.beta}, {self.gamma}, {self.zeta})."
            )
        if not self.log_alpha_min < self.log_alpha_max:
            raise ValueError(
                f"log_alpha_min must be below log_alpha_max (got {self.log_alpha_min}, {self.log_alpha_max})."
            )

    def sample(self, log_alpha: Tensor, u: Tensor) -> Tensor:
        """A reparameterised gate sample."""
        return sample_gate(log_alpha, u, beta=self.beta, gamma=self.gamma, zeta=self.zeta)

    def prob_nonzero(self, log_alpha: Tensor) -> Tensor:
        """P(z ≠ 0) in closed form."""
        return prob_nonzero(log_alpha, beta=self.beta, gamma=self.gamma, zeta=self.zeta)

    def log_alpha_from_prob_nonzero(self, p: Tensor) -> Tensor:
        """log α whose P(z ≠ 0) is ``p``, clamped to the allowed range."""
        log_alpha = log_alpha_from_prob_nonzero(p, beta=self.beta, gamma=self.gamma, zeta=self.zeta)
        return log_alpha.clamp(self.log_alpha_min, self.log_alpha_max)

    def expected_gate(self, log_alpha: Tensor, nodes: int = 32) -> Tensor:
        """E[z] by quadrature."""
        return expected_gate(log_alpha, nodes=nodes, beta=self.beta, gamma=self.gamma, zeta=self.zeta)

    def expected_gate_tail(self, log_alpha: Tensor, nodes: int = 32) -> Tensor:
        """E[z] by quadrature of the tail integral (strictly positive)."""
        return expected_gate_tail(log_alpha, nodes=nodes, beta=self.beta, gamma=self.gamma, zeta=self.zeta)

    def test_gate(self, log_alpha: Tensor) -> Tensor:
        """Deterministic test-time gate."""
        return test_gate(log_alpha, gamma=self.gamma, zeta=self.zeta)

    def clamp_(self, log_alpha: Tensor) -> Tensor:
        """Clamp log α in place (after every optimiser step)."""
        with torch.no_grad():
            return log_alpha.clamp_(self.log_alpha_min, self.log_alpha_max)

    @property
    def min_prob_nonzero(self) -> float:
        """The smallest P(z ≠ 0) the clamp allows (the density floor of the L0 surrogate)."""
        return float(self.prob_nonzero(torch.tensor(self.log_alpha_min, dtype=torch.float64)))
