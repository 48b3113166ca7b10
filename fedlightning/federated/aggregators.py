"""Aggregators: uploads folded into fixed-size sums as they arrive.

An :class:`Aggregator` is the server-side state of one round. The engine calls
``accumulate(decoded, weight=...)`` once per decoded upload (so memory does not depend on the
cohort size), ``all_reduce(reduce)`` once when every process has accumulated its share of the
cohort (one collective over one flat float64 tensor), and then hands the aggregator to the
method's server step. Sums are kept in float64: the order in which processes add their shares
then almost never changes the float32 result, so 1 and 2 processes give the same model.

Partial participation (FedAvg, McMahan et al., arXiv 1602.05629; the unbiased estimator as in
Horváth's thesis, arXiv 2207.00392, ch. 6). For a cohort S drawn with inclusion probabilities
p_i and client shares w_i (n_i/n, or 1/N for uniform weighting) over the whole federation:

* ``"normalised"``: Σ_{i∈S} w_i Δ_i / Σ_{i∈S} w_i, what FedAvg uses in practice (biased for
  random cohorts, sums to one);
* ``"unbiased"``: Σ_{i∈S} (w_i / p_i) Δ_i, whose expectation over the cohort is Σ_i w_i Δ_i.

>>> shares, probs = torch.tensor([1 / 6, 2 / 6]), torch.tensor([2 / 3, 2 / 3])
>>> participation_weights(shares, probs, "normalised").tolist()
[0.3333333333333333, 0.6666666666666666]
>>> participation_weights(shares, probs, "unbiased").tolist()
[0.25, 0.5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "Aggregator",
    "Estimator",
    "WeightedMean",
    "accumulate_upload",
    "fold_",
    "participation_weights",
    "upload_coefficient",
]

Estimator = Literal["normalised", "unbiased"]
Reduce = Callable[[Tensor], Tensor]
ESTIMATORS: tuple[Estimator, ...] = ("normalised", "unbiased")


FOLD_BLOCK = 32_768
"""Entries of the float64 sums (256 KiB) that :func:`fold_` updates in one call on the CPU."""


def fold_(sums: Tensor, x: Tensor, *, weight: float) -> None:
    """``sums += weight * x`` in place, where ``x`` may have another dtype (float32 uploads, float64 sums).

    The same bits as ``sums.add_(x, alpha=weight)``. On the CPU, PyTorch first converts an input
    of another dtype whole into a temporary of the output's dtype; for an upload of a few
    hundred thousand entries that temporary does not stay in cache, so the entries are folded a
    block at a time.

    >>> sums = torch.zeros(3, dtype=torch.float64)
    >>> fold_(sums, torch.tensor([1.0, 2.0, 4.0]), weight=0.5)
    >>> sums.tolist()
    [0.5, 1.0, 2.0]
    """
    n = sums.numel()
    if sums.device.type != "cpu" or x.dtype == sums.dtype or n <= FOLD_BLOCK:
        sums.add_(x, alpha=weight)
        return
    for start in range(0, n, FOLD_BLOCK):
        sums[start : start + FOLD_BLOCK].add_(x[start : start + FOLD_BLOCK], alpha=weight)


def participation_weights(shares: Tensor, inclusion_probabilities: Tensor, estimator: Estimator) -> Tensor:
    """The coefficient of each cohort member's update (float64).

    Args:
        shares: w_i of the cohort members (their weight in the full-participation objective).
        inclusion_probabilities: p_i = P(i ∈ S).
        estimator: ``"normalised"`` (w_i / Σ_S w_j) or ``"unbiased"`` (w_i / p_i).
    """
    w = shares.to(torch.float64)
    if estimator == "normalised":
        total = w.sum()
        if total <= 0:
            raise ValueError("Cannot aggregate a cohort whose clients have zero weight.")
        return w / total
    if estimator == "unbiased":
        return w / inclusion_probabilities.to(torch.float64)
    raise ValueError(f"Unknown estimator {estimator!r}; choose normalised or unbiased.")


class Aggregator:
    """Fixed-size sums over the uploads of one round (see the module docstring).

    Subclasses keep their sums in :attr:`sums` (a flat float64 tensor) so that one
    collective reduces all of them.
    """

    def __init__(self) -> None:
        self.sums = torch.zeros(0, dtype=torch.float64)
        self.count = 0

    def accumulate(self, decoded: Tensor, *, weight: float) -> None:
        """Fold one decoded upload in with coefficient ``weight``."""
        raise NotImplementedError

    def accumulate_rows(
        self, rows: Tensor | Sequence[Tensor], *, weights: Sequence[float], masses: Sequence[float | None]
    ) -> None:
        """Fold a share's decoded uploads in, in order: the same sums as :meth:`accumulate` of each in turn.

        ``masses[k]`` is upload k's contribution to a normalising total weight (``None``: its weight);
        aggregators without one ignore it.
        """
        for row, weight, mass in zip(rows, weights, masses, strict=True):
            if mass is None:
                self.accumulate(row, weight=weight)
            else:
                self.accumulate(row, weight=weight, mass=mass)  # type: ignore[call-arg]  # WeightedMean's

    def packed(self, alongside: Tensor | None = None) -> Tensor:
        """The whole state as one float64 tensor: the sums, the upload count, then ``alongside``."""
        count = torch.tensor([float(self.count)], dtype=torch.float64, device=self.sums.device)
        extra = [] if alongside is None else [alongside.to(self.sums.device)]
        return torch.cat([self.sums, count, *extra])

    def all_reduce(self, reduce: Reduce, *, alongside: Tensor | None = None) -> Tensor:
        """Sum the state across processes (``reduce`` is an all-reduce with op sum).

        ``alongside`` (a 1-D float64 tensor, e.g. the round's statistics) is summed in the same
        collective and returned on its own device (an empty tensor without it).
        """
        packed = reduce(self.packed(alongside))  # a new tensor: the sums can be a view of it
        n = self.sums.numel()
        self.sums, self.count = packed[:n], round(float(packed[n]))
        extra = packed[n + 1 :]
        return extra if alongside is None else extra.to(alongside.device)

    @property
    def empty(self) -> bool:
        """No upload arrived (all dropped, or none sent)."""
        return self.count == 0


class WeightedMean(Aggregator):
    """Σ_i c_i x_i and Σ_i c_i for uploads x_i of dimension ``dim``.

    Args:
        dim: length of every decoded upload.
        normalise: divide by Σ_i c_i (the ``"normalised"`` estimator) or not (``"unbiased"``,
            whose coefficients already are w_i / p_i).
        device: where the sums live.

    >>> agg = WeightedMean(dim=2, normalise=True)
    >>> agg.accumulate(torch.tensor([1.0, 2.0]), weight=1.0)
    >>> agg.accumulate(torch.tensor([3.0, 6.0]), weight=3.0)
    >>> agg.result().tolist()
    [2.5, 5.0]
    """

    def __init__(self, *, dim: int, normalise: bool, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.dim = int(dim)
        self.normalise = normalise
        self.sums = torch.zeros(self.dim + 1, dtype=torch.float64, device=device)

    def accumulate(self, decoded: Tensor, *, weight: float, mass: float | None = None) -> None:
        """Add ``weight`` × ``decoded`` to the sum and ``mass`` (default ``weight``) to the total weight."""
        flat = decoded.reshape(-1)
        if flat.numel() != self.dim:
            raise ValueError(f"An upload of {flat.numel()} entries reached an aggregator of dimension {self.dim}.")
        fold_(self.sums[: self.dim], flat.to(self.sums.device), weight=float(weight))
        self.sums[self.dim] += float(weight if mass is None else mass)
        self.count += 1

    def accumulate_rows(
        self, rows: Tensor | Sequence[Tensor], *, weights: Sequence[float], masses: Sequence[float | None]
    ) -> None:
        """Fold a share's decoded uploads in: bit for bit the sums of :meth:`accumulate` of each in turn.

        Each entry of the sums receives its uploads in the share's order (float64 addition is not
        associative, so the order is kept), and the total weight is summed in that order too.

        >>> agg = WeightedMean(dim=2, normalise=True)
        >>> agg.accumulate_rows(torch.tensor([[1.0, 2.0], [3.0, 6.0]]), weights=[1.0, 3.0], masses=[None, None])
        >>> agg.result().tolist(), agg.count
        ([2.5, 5.0], 2)
        """
        if len(rows) != len(weights) or len(rows) != len(masses):
            raise ValueError("A share's uploads, weights and masses must be as many.")
        sums = self.sums[: self.dim]
        if isinstance(rows, Tensor):  # one transfer for the share; its rows as views, taken at once
            rows = rows.to(sums.device).unbind(0)
        total = float(self.sums[self.dim])
        for row, weight, mass in zip(rows, weights, masses, strict=True):
            flat = row.reshape(-1)
            if flat.numel() != self.dim:
                raise ValueError(f"An upload of {flat.numel()} entries reached an aggregator of dimension {self.dim}.")
            fold_(sums, flat.to(sums.device), weight=float(weight))
            total += float(weight if mass is None else mass)
        self.sums[self.dim] = total
        self.count += len(rows)

    def add_mass(self, mass: float) -> None:
        """Count a client in the total weight without an upload (it computed but was not chosen).

        >>> agg = WeightedMean(dim=1, normalise=True)
        >>> agg.accumulate(torch.tensor([3.0]), weight=2.0, mass=1.0)  # chosen with probability 1/2
        >>> agg.add_mass(1.0)  # a client of the same weight that was not chosen
        >>> agg.result().tolist()
        [3.0]
        """
        self.sums[self.dim] += float(mass)

    @property
    def total_weight(self) -> float:
        """Σ_i c_i."""
        return float(self.sums[self.dim])

    def weighted_sum(self) -> Tensor:
        """Σ_i c_i x_i (float64)."""
        return self.sums[: self.dim]

    def result(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The estimate: the weighted sum, divided by the total weight if normalising."""
        total = self.weighted_sum()
        if self.normalise:
            if self.total_weight <= 0:
                raise ValueError("No upload reached the aggregator this round.")
            total = total / self.total_weight
        return total.to(dtype)


def upload_coefficient(*, weight: float, q: float, chosen: bool, estimator: Estimator) -> tuple[float, float | None]:
    """An upload's coefficient in the sums and its mass in the total weight (``None``: the coefficient).

    See :func:`accumulate_upload` for the arguments.

    >>> upload_coefficient(weight=0.5, q=0.5, chosen=False, estimator="normalised")
    (1.0, None)
    >>> upload_coefficient(weight=0.5, q=0.25, chosen=True, estimator="normalised")
    (2.0, 0.0)
    """
    if not chosen and q == 1.0:
        return weight, None
    if not chosen:  # a known arrival probability: cancels in the normalised mean
        return (weight if estimator == "unbiased" else weight / q), None
    if estimator == "normalised":  # w_i/q_i; the cohort's weight was counted at the choice
        return weight / q, 0.0
    return weight, None  # w_i/(p_i q_i): upload_weight divided by the product; no normaliser


def accumulate_upload(
    aggregator: Aggregator, decoded: Tensor, *, weight: float, q: float, chosen: bool, estimator: Estimator
) -> None:
    """Fold one decoded upload into the round's sums with its coefficient under ``estimator``.

    ``weight`` is the method's ``upload_weight`` (w_i, divided by p_i·q when unbiased); ``q`` is the
    probability of the upload arriving, times its choice probability q_i when it was ``chosen``
    after local work. A known arrival probability cancels in the normalised mean; for a chosen
    upload the normalised estimator adds w_i/q_i (the cohort's weight was counted at the choice).

    >>> agg = WeightedMean(dim=1, normalise=True)
    >>> accumulate_upload(agg, torch.tensor([4.0]), weight=0.5, q=0.5, chosen=False, estimator="normalised")
    >>> agg.weighted_sum().tolist(), agg.total_weight
    ([4.0], 1.0)
    """
    coefficient, mass = upload_coefficient(weight=weight, q=q, chosen=chosen, estimator=estimator)
    if mass is None:
        aggregator.accumulate(decoded, weight=coefficient)
    else:
        assert isinstance(aggregator, WeightedMean)
        aggregator.accumulate(decoded, weight=coefficient, mass=mass)
