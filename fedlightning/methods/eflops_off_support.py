"""E-FLoPS off the support: what a coordinate that no message carries becomes.

Paper: E-FLoPS, arXiv 2607.00275 (gates of Louizos et al., arXiv 1712.01312). A message
carries only its top-m coordinates; the receiver fills θ̃ elsewhere by ``method.off_support``
(:data:`OFF_SUPPORT_WEIGHTS`) and log α elsewhere by ``method.off_support_gates``
(:data:`OFF_SUPPORT_GATES`): closed gates, closed gates with gradient regrowth, a per-tensor
statistic carried in the message, or the initial gate.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

import torch
from torch import Tensor

from fedlightning.methods.eflops_support import Selection, TopMSupport
from fedlightning.methods.strategy import Strategy
from fedlightning.models.hard_concrete import HardConcrete

__all__ = [
    "OFF_SUPPORT_GATES",
    "OFF_SUPPORT_WEIGHTS",
    "ClosedGateGradients",
    "ClosedGates",
    "InitialWeights",
    "OffSupportGates",
    "OffSupportGatesName",
    "OffSupportWeights",
    "OffSupportWeightsName",
    "RegrowGates",
    "ResetGates",
    "ResumeGates",
    "ZeroWeights",
    "expand_groups",
    "off_support_means",
    "regrow_candidates",
]


# ---------------------------------------------------------------------------------------- maths
def off_support_means(pi: Tensor, support: Tensor, sizes: list[int], fallback: float) -> Tensor:
    """Mean of ``pi`` over the coordinates outside ``support``, per group of ``sizes`` coordinates.

    A group entirely inside the support gets ``fallback``.

    >>> pi = torch.tensor([0.9, 0.1, 0.3, 0.8, 0.2]); s = torch.tensor([True, False, False, True, True])
    >>> [round(v, 4) for v in off_support_means(pi, s, [3, 2], 0.5).tolist()]
    [0.2, 0.5]
    """
    out = []
    for p, sup in zip(torch.split(pi, sizes), torch.split(support, sizes), strict=True):
        off = ~sup
        out.append(p[off].mean() if off.any() else p.new_tensor(fallback))
    return torch.stack(out)


def expand_groups(values: Tensor, sizes: list[int]) -> Tensor:
    """One value per group, repeated over the group's coordinates.

    >>> expand_groups(torch.tensor([1.0, 2.0]), [2, 1]).tolist()
    [1.0, 1.0, 2.0]
    """
    return torch.repeat_interleave(values, torch.tensor(sizes, device=values.device))


def regrow_candidates(
    theta: Tensor, log_alpha: Tensor, closed: Tensor, grad_mean: Tensor, lr: float, log_alpha_open: float
) -> tuple[Tensor, Tensor]:
    """(θ̃, log α) with every ``closed`` coordinate replaced by its regrowth candidate.

    A closed gate (z_j = 0) passes no gradient to θ̃_j, but the data loss still has a gradient
    g_j = ∂ℓ/∂θ_j at the effective weight θ_j = θ̃_j z_j = 0. Its candidate is one SGD step
    from an open gate, θ̃_j − η ḡ_j with ḡ_j the mean of g_j over the local steps, at the
    shared initial gate ``log_alpha_open``; it then competes for the top m like any other
    coordinate (a gradient regrowth in the spirit of RigL, arXiv 1911.11134).

    >>> th, la = torch.tensor([1.0, 0.25]), torch.tensor([3.0, -10.0])
    >>> t, a = regrow_candidates(th, la, torch.tensor([False, True]), torch.tensor([5.0, -4.0]), 0.5, 0.0)
    >>> t.tolist(), a.tolist()
    ([1.0, 2.25], [3.0, 0.0])
    """
    theta_new = torch.where(closed, theta - lr * grad_mean, theta)
    log_alpha_new = torch.where(closed, torch.full_like(log_alpha, log_alpha_open), log_alpha)
    return theta_new, log_alpha_new


# ---------------------------------------------------------------------------------------- θ̃ off the support
class OffSupportWeights(Strategy):
    """θ̃ at the coordinates outside a received support."""

    @abstractmethod
    def fill(self, theta_init: Tensor, like: Tensor) -> Tensor:
        """θ̃ off the support, shaped and placed as ``like`` (``theta_init``: θ̃⁰ from the shared seed)."""


class InitialWeights(OffSupportWeights):
    """θ̃⁰, derived from the shared run seed: free for both sides.

    >>> InitialWeights().fill(torch.tensor([0.5, -0.5]), torch.zeros(2)).tolist()
    [0.5, -0.5]
    """

    name = "init"

    def fill(self, theta_init: Tensor, like: Tensor) -> Tensor:
        return theta_init.to(like.device)


class ZeroWeights(OffSupportWeights):
    """0.

    >>> ZeroWeights().fill(torch.tensor([0.5, -0.5]), torch.ones(2)).tolist()
    [0.0, 0.0]
    """

    name = "zero"

    def fill(self, theta_init: Tensor, like: Tensor) -> Tensor:
        return torch.zeros_like(like)


OffSupportWeightsName = Literal["init", "zero"]
"""The names of :data:`OFF_SUPPORT_WEIGHTS`."""

OFF_SUPPORT_WEIGHTS: dict[str, OffSupportWeights] = {"init": InitialWeights(), "zero": ZeroWeights()}
"""``method.off_support`` → θ̃ off the broadcast support."""


# ---------------------------------------------------------------------------------------- log α off the support
class ClosedGateGradients:
    """Σ over a client's local steps of g = ∂ℓ/∂θ at its closed coordinates (θ = 0 there), for regrowth.

    Args:
        closed: the coordinates the received message did not carry.
        device: where the sum lives.
    """

    def __init__(self, closed: Tensor, device: torch.device | str) -> None:
        self.closed = closed
        self.grad_sum = torch.zeros(closed.numel(), device=device)
        self.gated: list[Tensor] = []

    def watch(self, gated: list[Tensor]) -> None:
        """Keep the gradients of this step's gated weights θ̃ ⊙ z (non-leaf tensors)."""
        for g in gated:
            g.retain_grad()
        self.gated = gated

    def add_step(self) -> None:
        """Add the gradients of the watched step."""
        grads = [g.grad if g.grad is not None else torch.zeros_like(g) for g in self.gated]
        self.grad_sum.add_(torch.cat([g.reshape(-1) for g in grads]))

    def candidates(
        self, theta: Tensor, log_alpha: Tensor, *, steps: int, lr: float, log_alpha_open: float
    ) -> tuple[Tensor, Tensor]:
        """:func:`regrow_candidates` with the mean gradient over ``steps`` SGD steps of learning rate ``lr``."""
        return regrow_candidates(theta, log_alpha, self.closed, self.grad_sum / max(steps, 1), lr, log_alpha_open)


class OffSupportGates(Strategy):
    """log α at the coordinates outside a received support, and what the variant adds to a round."""

    carries_statistics: ClassVar[bool] = False
    """Every message carries π_off, the mean P(z ≠ 0) off the support of each parameter tensor."""
    regrows: ClassVar[bool] = False
    """Closed coordinates compete for the support through an SGD prediction (needs an SGD client optimiser)."""

    def screening(self, round_idx: int) -> bool:
        """Whether λ is held in the engine's round ``round_idx`` (0 for round 1)."""
        return False

    @abstractmethod
    def log_alpha(
        self,
        like: Tensor,
        *,
        round_idx: int,
        pi_off: Tensor,
        hc: HardConcrete,
        log_alpha_init: float,
        pi_min: float,
        sizes: list[int],
    ) -> Tensor:
        """log α of every coordinate as if none were on the support, shaped as ``like``."""

    def regrowth(self, closed: Tensor, round_idx: int, device: torch.device | str) -> ClosedGateGradients | None:
        """The gradient sums a client keeps for regrowth (``None``: it keeps none)."""
        return None

    def after_rebuild_(
        self, log_alpha: Tensor, theta: Tensor, *, hc: HardConcrete, selection: Selection, support: TopMSupport
    ) -> None:
        """Adjust the server's rebuilt log α in place."""


class ClosedGates(OffSupportGates):
    """A gate no message carries is closed (log α = ``log_alpha_min``) on both sides.

    Round 1 starts from the shared open initial gates with λ held (a screening round), so D
    counts the gates the model holds.

    >>> gates = ClosedGates()
    >>> [gates.screening(0), gates.screening(1)]
    [True, False]
    >>> hc = HardConcrete(log_alpha_min=-10.0, log_alpha_max=10.0)
    >>> kw = dict(pi_off=torch.zeros(0), hc=hc, log_alpha_init=0.5, pi_min=0.01, sizes=[2])
    >>> [gates.log_alpha(torch.zeros(2), round_idx=t, **kw).tolist() for t in (0, 1)]  # round 1 open, then closed
    [[0.5, 0.5], [-10.0, -10.0]]
    """

    name = "closed"

    def screening(self, round_idx: int) -> bool:
        return round_idx < 1

    def log_alpha(
        self,
        like: Tensor,
        *,
        round_idx: int,
        pi_off: Tensor,
        hc: HardConcrete,
        log_alpha_init: float,
        pi_min: float,
        sizes: list[int],
    ) -> Tensor:
        return torch.full_like(like, log_alpha_init if round_idx < 1 else hc.log_alpha_min)


class RegrowGates(ClosedGates):
    """As :class:`ClosedGates`, and a closed coordinate re-enters the upload when its SGD-predicted weight
    at the initial gate beats the m-th score (:func:`regrow_candidates`); the server closes every gate
    outside its own top m after the rebuild.

    >>> gates, closed = RegrowGates(), torch.tensor([True, False])
    >>> gates.regrowth(closed, 0, "cpu") is None, gates.regrowth(closed, 1, "cpu").grad_sum.tolist()
    (True, [0.0, 0.0])
    """

    name = "regrow"
    regrows = True

    def regrowth(self, closed: Tensor, round_idx: int, device: torch.device | str) -> ClosedGateGradients | None:
        return ClosedGateGradients(closed, device) if round_idx >= 1 else None  # round 1: every gate starts open

    def after_rebuild_(
        self, log_alpha: Tensor, theta: Tensor, *, hc: HardConcrete, selection: Selection, support: TopMSupport
    ) -> None:
        """Clients may send different coordinates: keep the top m open, close the rest."""
        keep = support.mask(selection.scores(hc, theta, log_alpha))
        log_alpha.masked_fill_(~keep, hc.log_alpha_min)


class ResumeGates(OffSupportGates):
    """Off-support log α from the message's per-tensor mean π_off (clamped to [π_min, 1 − 10⁻⁷]).

    >>> hc = HardConcrete()
    >>> la = ResumeGates().log_alpha(torch.zeros(3), round_idx=1, pi_off=torch.tensor([0.5, 0.9]), hc=hc,
    ...     log_alpha_init=0.0, pi_min=0.01, sizes=[2, 1])
    >>> [round(v, 4) for v in hc.prob_nonzero(la).tolist()]
    [0.5, 0.5, 0.9]
    """

    name = "resume"
    carries_statistics = True

    def log_alpha(
        self,
        like: Tensor,
        *,
        round_idx: int,
        pi_off: Tensor,
        hc: HardConcrete,
        log_alpha_init: float,
        pi_min: float,
        sizes: list[int],
    ) -> Tensor:
        pi = expand_groups(pi_off.clamp(pi_min, 1.0 - 1e-7), sizes)
        return hc.log_alpha_from_prob_nonzero(pi.to(like))


class ResetGates(OffSupportGates):
    """Off-support log α restarts at ``log_alpha_init``; non-senders count as closed on the server.

    >>> ResetGates().log_alpha(torch.zeros(2), round_idx=3, pi_off=torch.zeros(0), hc=HardConcrete(),
    ...     log_alpha_init=0.5, pi_min=0.01, sizes=[2]).tolist()
    [0.5, 0.5]
    """

    name = "reset"

    def log_alpha(
        self,
        like: Tensor,
        *,
        round_idx: int,
        pi_off: Tensor,
        hc: HardConcrete,
        log_alpha_init: float,
        pi_min: float,
        sizes: list[int],
    ) -> Tensor:
        return torch.full_like(like, log_alpha_init)


OffSupportGatesName = Literal["closed", "regrow", "resume", "reset"]
"""The names of :data:`OFF_SUPPORT_GATES`."""

OFF_SUPPORT_GATES: dict[str, OffSupportGates] = {
    "closed": ClosedGates(),
    "regrow": RegrowGates(),
    "resume": ResumeGates(),
    "reset": ResetGates(),
}
"""``method.off_support_gates`` → log α off the support."""
