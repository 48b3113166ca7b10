"""E-FLoPS's top-m support: which coordinates a message carries and which the evaluated network keeps.

Paper: E-FLoPS, arXiv 2607.00275: only the top-m coordinates, m = ⌊ρ |θ|⌋, are communicated
and kept. A coordinate's score comes from ``method.selection`` (:data:`SELECTIONS`); the m are
drawn over all of θ or per parameter tensor (``method.support_allocation``,
:data:`SUPPORT_ALLOCATIONS`, bound to a network as :class:`TopMSupport`); the evaluated network
is chosen by ``method.final_support`` (:data:`FINAL_SUPPORTS`). Gates are hard-concrete
(Louizos et al., arXiv 1712.01312).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedlightning.methods.strategy import Strategy
from fedlightning.metrics.sparsity import top_m_mask
from fedlightning.models.hard_concrete import HardConcrete

__all__ = [
    "FINAL_SUPPORTS",
    "SELECTIONS",
    "SUPPORT_ALLOCATIONS",
    "ExpectedMagnitude",
    "FinalSupport",
    "FinalSupportName",
    "GlobalTopM",
    "PerTensorTopM",
    "Selection",
    "SelectionName",
    "SupportAllocation",
    "SupportAllocationName",
    "TestGateMagnitude",
    "TestGateSupport",
    "TopMGated",
    "TopMSupport",
    "allocated_top_m_mask",
    "gated_top_m",
    "nonzero_top_m_mask",
    "per_tensor_budgets",
]


# ---------------------------------------------------------------------------------------- top-m maths
def nonzero_top_m_mask(scores: Tensor, m: int) -> Tensor:
    """The ``m`` largest |scores| among the non-zero ones (fewer when fewer are non-zero).

    A score of 0 carries nothing, so it is never selected: ties at zero do not fill the
    support with the lowest indices.

    >>> nonzero_top_m_mask(torch.tensor([0.0, 0.0, 2.0, -1.0, 0.0]), 3).tolist()
    [False, False, True, True, False]
    """
    return top_m_mask(scores, m) & (scores != 0)


def per_tensor_budgets(sizes: list[int], rho: float, m: int) -> list[int]:
    """k_t = max(1, ⌊ρ n_t⌋) coordinates for each parameter tensor t of n_t entries, Σ_t k_t ≤ m.

    Σ_t ⌊ρ n_t⌋ ≤ ⌊ρ Σ_t n_t⌋ = m; only the minimum of one coordinate per tensor can push the total above m,
    and then the largest budgets (the lower index among equal ones) give one coordinate back each
    until the total is m. Layers whose initial weights scale as 1/√fan-in keep their share of
    the support, which a single global ranking of magnitudes would hand to the small layers.

    Raises:
        ValueError: if there are more tensors than m (one coordinate each does not fit).

    >>> per_tensor_budgets([800, 32, 1000], 0.02, 36)
    [16, 1, 19]
    >>> per_tensor_budgets([10, 10, 100], 0.05, 6)
    [1, 1, 4]
    """
    if len(sizes) > m:
        raise ValueError(f"{len(sizes)} parameter tensors cannot keep one coordinate each within m = {m}")
    budgets = [max(1, math.floor(rho * n + 1e-9)) for n in sizes]
    while sum(budgets) > m:
        i = max(range(len(budgets)), key=lambda t: (budgets[t], -t))
        budgets[i] -= 1
    return budgets


def allocated_top_m_mask(scores: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
    """:func:`nonzero_top_m_mask` inside each group of ``sizes`` coordinates, ``budgets[t]`` in group t.

    >>> s = torch.tensor([0.9, 0.8, 0.7, 0.05, 0.0, 0.01])
    >>> allocated_top_m_mask(s, [1, 2], [3, 3]).tolist()
    [True, False, False, True, False, True]
    """
    parts = [nonzero_top_m_mask(chunk, k) for chunk, k in zip(torch.split(scores, sizes), budgets, strict=True)]
    return torch.cat(parts) if parts else torch.zeros_like(scores, dtype=torch.bool)


def gated_top_m(theta: Tensor, gate: Tensor, m: int) -> Tensor:
    """θ ⊙ g on the ``m`` coordinates of largest |θ ⊙ g|, zeros elsewhere (ties: lower index).

    >>> gated_top_m(torch.tensor([2.0, -3.0, 0.5, 1.0]), torch.tensor([0.9, 0.1, 0.8, 0.5]), 2).tolist()
    [1.7999999523162842, 0.0, 0.0, 0.5]
    """
    weighted = theta * gate
    return torch.where(top_m_mask(weighted, m), weighted, torch.zeros_like(weighted))


# ---------------------------------------------------------------------------------------- selection scores
class Selection(Strategy):
    """The score of each coordinate for the top-m support of a message."""

    @abstractmethod
    def scores(self, hc: HardConcrete, theta: Tensor, log_alpha: Tensor) -> Tensor:
        """Non-negative scores of (θ̃, log α); a score of 0 is never sent."""


class ExpectedMagnitude(Selection):
    """|θ̃_j| P(z_j ≠ 0).

    >>> scores = ExpectedMagnitude().scores(HardConcrete(), torch.tensor([-2.0, 0.5]), torch.tensor([0.0, 0.0]))
    >>> [round(v, 4) for v in scores.tolist()]  # P(z ≠ 0 | log α = 0) = 1 / (1 + (1/11)^(2/3)) = 0.8318
    [1.6636, 0.4159]
    """

    name = "expected_magnitude"

    def scores(self, hc: HardConcrete, theta: Tensor, log_alpha: Tensor) -> Tensor:
        return theta.abs() * hc.prob_nonzero(log_alpha)


class TestGateMagnitude(Selection):
    """|θ̃_j ẑ_j| with the deterministic test-time gate ẑ (0 once P(z ≠ 0) ≤ 0.31).

    >>> TestGateMagnitude().scores(HardConcrete(), torch.tensor([-2.0, 3.0]), torch.tensor([0.0, -5.0])).tolist()
    [1.0, 0.0]
    """

    __test__ = False  # not a pytest test class
    name = "test_gate"

    def scores(self, hc: HardConcrete, theta: Tensor, log_alpha: Tensor) -> Tensor:
        return (theta * hc.test_gate(log_alpha)).abs()


SelectionName = Literal["expected_magnitude", "test_gate"]
"""The names of :data:`SELECTIONS`."""

SELECTIONS: dict[str, Selection] = {"expected_magnitude": ExpectedMagnitude(), "test_gate": TestGateMagnitude()}
"""``method.selection`` → the top-m score."""


# ---------------------------------------------------------------------------------------- allocation of the m
class SupportAllocation(Strategy):
    """How the m coordinates are drawn: one ranking over all of θ, or a budget per parameter tensor."""

    @abstractmethod
    def budgets(self, sizes: list[int], rho: float, m: int) -> list[int]:
        """Coordinates each group may keep (one group, ``[m]``, for a single ranking).

        Raises:
            ValueError: if the allocation cannot fit into m.
        """

    @abstractmethod
    def mask(self, scores: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        """The support of ``scores`` (never a score of 0)."""

    @abstractmethod
    def keep_largest(self, theta: Tensor, gate: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        """θ ⊙ g on its largest |θ ⊙ g| under the budgets, zeros elsewhere (the evaluated network)."""


class GlobalTopM(SupportAllocation):
    """One top m over all of θ.

    >>> GlobalTopM().mask(torch.tensor([0.9, 0.8, 0.0, 0.1]), [2], [3, 1]).tolist()
    [True, True, False, False]
    """

    name = "global"

    def budgets(self, sizes: list[int], rho: float, m: int) -> list[int]:
        return [m]

    def mask(self, scores: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        return nonzero_top_m_mask(scores, budgets[0])

    def keep_largest(self, theta: Tensor, gate: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        return gated_top_m(theta, gate, budgets[0])


class PerTensorTopM(SupportAllocation):
    """The top k_t = max(1, ⌊ρ n_t⌋) of each parameter tensor by the same score (:func:`per_tensor_budgets`).

    >>> PerTensorTopM().mask(torch.tensor([0.9, 0.8, 0.0, 0.1]), [1, 1], [3, 1]).tolist()
    [True, False, False, True]
    """

    name = "per_tensor"

    def budgets(self, sizes: list[int], rho: float, m: int) -> list[int]:
        return per_tensor_budgets(sizes, rho, m)

    def mask(self, scores: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        return allocated_top_m_mask(scores, budgets, sizes)

    def keep_largest(self, theta: Tensor, gate: Tensor, budgets: list[int], sizes: list[int]) -> Tensor:
        weighted = theta * gate
        return torch.where(self.mask(weighted.abs(), budgets, sizes), weighted, torch.zeros_like(weighted))


SupportAllocationName = Literal["global", "per_tensor"]
"""The names of :data:`SUPPORT_ALLOCATIONS`."""

SUPPORT_ALLOCATIONS: dict[str, SupportAllocation] = {"global": GlobalTopM(), "per_tensor": PerTensorTopM()}
"""``method.support_allocation`` → how the top m is drawn, for the messages, the server's regrow
rebuild and the final support alike."""


@dataclass(frozen=True)
class TopMSupport:
    """An allocation bound to one network: its parameter tensors' sizes and each tensor's budget.

    Attributes:
        allocation: the strategy of ``method.support_allocation``.
        sizes: entries of each parameter tensor, in ``model.parameters()`` order.
        budgets: coordinates each group may keep (``[m]`` for :class:`GlobalTopM`).

    >>> support = TopMSupport.of(PerTensorTopM(), sizes=[3, 1], rho=0.5, m=2)
    >>> support.budgets, support.mask(torch.tensor([0.2, 0.9, 0.4, 0.1])).tolist()
    ([1, 1], [False, True, False, True])
    """

    allocation: SupportAllocation
    sizes: list[int]
    budgets: list[int]

    @classmethod
    def of(cls, allocation: SupportAllocation, *, sizes: list[int], rho: float, m: int) -> TopMSupport:
        """The allocation's budgets for tensors of ``sizes`` at density ``rho`` (m = ⌊ρ Σ sizes⌋)."""
        return cls(allocation, list(sizes), allocation.budgets(list(sizes), rho, m))

    def mask(self, scores: Tensor) -> Tensor:
        """The support of ``scores`` (never a score of 0)."""
        return self.allocation.mask(scores, self.budgets, self.sizes)

    def keep_largest(self, theta: Tensor, gate: Tensor) -> Tensor:
        """θ ⊙ g on its largest |θ ⊙ g|, zeros elsewhere."""
        return self.allocation.keep_largest(theta, gate, self.budgets, self.sizes)


# ---------------------------------------------------------------------------------------- the evaluated network
class FinalSupport(Strategy):
    """The evaluated network of the global (θ̃, log α)."""

    @abstractmethod
    def parameters(
        self,
        theta: Tensor,
        log_alpha: Tensor,
        *,
        hc: HardConcrete,
        nodes: int,
        selection: Selection,
        support: TopMSupport,
    ) -> Tensor:
        """Flat parameters of the evaluated network (``nodes``: quadrature points of E[z])."""


class TopMGated(FinalSupport):
    """θ̃ ⊙ E[z] on its m largest magnitudes: exactly m non-zeros.

    >>> TopMGated().parameters(torch.tensor([2.0, -1.0, 0.0]), torch.zeros(3), hc=HardConcrete(), nodes=4,
    ...     selection=ExpectedMagnitude(), support=TopMSupport(GlobalTopM(), [3], [1])).tolist()
    [1.0, 0.0, 0.0]
    """

    name = "top_m"

    def parameters(
        self,
        theta: Tensor,
        log_alpha: Tensor,
        *,
        hc: HardConcrete,
        nodes: int,
        selection: Selection,
        support: TopMSupport,
    ) -> Tensor:
        return support.keep_largest(theta, hc.expected_gate_tail(log_alpha, nodes=nodes))


class TestGateSupport(FinalSupport):
    """θ̃ ⊙ ẑ on the top m by ``selection``: the test-time gate may close coordinates of the support.

    >>> top_1 = TopMSupport(GlobalTopM(), [3], [1])  # scores |θ̃| P(z ≠ 0) = [1.66, 0.83, 0.005]: S = {0}
    >>> TestGateSupport().parameters(torch.tensor([2.0, -1.0, 9.0]), torch.tensor([0.0, 0.0, -9.0]),
    ...     hc=HardConcrete(), nodes=4, selection=ExpectedMagnitude(), support=top_1).tolist()  # ẑ_0 = 1/2
    [1.0, -0.0, 0.0]
    """

    __test__ = False  # not a pytest test class
    name = "test_gate"

    def parameters(
        self,
        theta: Tensor,
        log_alpha: Tensor,
        *,
        hc: HardConcrete,
        nodes: int,
        selection: Selection,
        support: TopMSupport,
    ) -> Tensor:
        return theta * hc.test_gate(log_alpha) * support.mask(selection.scores(hc, theta, log_alpha))


FinalSupportName = Literal["top_m", "test_gate"]
"""The names of :data:`FINAL_SUPPORTS`."""

FINAL_SUPPORTS: dict[str, FinalSupport] = {"top_m": TopMGated(), "test_gate": TestGateSupport()}
"""``method.final_support`` → the evaluated network."""
