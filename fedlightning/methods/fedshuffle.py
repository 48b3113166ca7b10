"""FedShuffle and FedShuffleGen(b, w̃, q), with FedNova, FedAvg, FedAvgMin and FedAvgMean as its configs.

Paper: Horváth et al., "FedShuffle: Recipes for Better Use of Local Work in Federated Learning",
arXiv 2204.13169 (Horváth's thesis, arXiv 2207.00392, ch. 8, Algorithms 12 and 13). FedNova:
Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", arXiv 2007.07481.

Clients run E_i epochs over their data (random reshuffling: every pass of
:func:`~fedlightning.federated.batches.local_batches` draws a fresh permutation), so clients
with more data or more epochs take more local steps. FedShuffleGen optimises
f̂ = Σ_i ŵ_i f_i with (8.9)

    ŵ_i ∝ w̃_i |D_i| E_i / (q_i b_i),

b_i being the local step-size divisor (η_{l,i} = η_l / b_i) and 1/q_i the expected aggregation
multiplier. FedShuffle (b_i ∝ E_i |D_i|, unbiased weights w_i/p_i) has ŵ = w; FedAvg (one η_l
for every client, sum-one weights) weights client i by its step count, ŵ_i ∝ w_i E_i |D_i|,
which is |D_i|² / Σ_j |D_j|² under full participation with equal epochs.

With mini-batches of size B the step-size rule of the authors' code is used: client i takes
K_i = E_i ⌈|D_i| / B⌉ steps of size η_l K_max / K_i, with K_max = max_j ⌈|D_j| / B⌉ · max E
over the whole federation, so that every client's step sizes add up to η_l K_max.

Options (``method.*``):

* ``local_epochs``: an integer E (every client, every round) or ``[lo, hi]``, E_i uniform in
  {lo, …, hi}, drawn per client per round from the client's stream ``"epochs"``;
* ``step_size``: ``fedshuffle`` (η_l K_max / K_i) or ``fedavg`` (η_l for every client);
* ``update_scaling``: ``none`` or ``fednova``, the standard FedNova server step
  Δ = τ_eff Σ_i (w_i / Σ_S w) Δ_i / τ_i with τ_i = K_i and τ_eff = Σ_i (w_i / Σ_S w) τ_i over
  the uploaders (the standard form of arXiv 2007.07481);
* ``fixed_steps``: ``null`` (epochs), ``min`` or ``mean``: FedAvgMin / FedAvgMean, every cohort
  client runs K = min / round-half-up mean of the step counts the cohort's clients would take
  with their E_i;
* ``aggregation``: the engine's ``unbiased`` (Σ_S (w_i/p_i) Δ_i) or ``normalised`` estimator.

The model delta uploaded is Δ_i = y_i − x and the server optimiser steps on −Δ (the engine's
convention), i.e. x ← x + η_g Δ: Algorithms 12 and 13 write Δ_i = y_i − x with x ← x − η_g Δ,
which would ascend.

Each round logs ``diag/objective_weight_tv``: the total-variation distance between w and the
objective weights ŵ realised by the rounds so far (each cohort client's first-order weight
c_i · η_{l,i} K_i · s_i, with c_i its aggregation coefficient and s_i FedNova's rescaling,
summed over rounds; in expectation and to first order in the step sizes this is ŵ of (8.9)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, fold_
from fedlightning.federated.batches import local_batches
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.module import FederatedModule, ParamsT

__all__ = [
    "EpochDistribution",
    "FedShuffle",
    "LocalStepSums",
    "LocalWork",
    "fednova_delta",
    "fixed_step_count",
    "local_step_count",
    "objective_weights",
    "step_size_scale",
    "total_variation",
]

StepSize = Literal["fedshuffle", "fedavg"]
UpdateScaling = Literal["none", "fednova"]
FixedSteps = Literal["min", "mean"]


@dataclass(frozen=True)
class EpochDistribution:
    """Local epochs E_i of one client in one round: uniform integers in {low, …, high}.

    >>> EpochDistribution.parse(3)
    EpochDistribution(low=3, high=3)
    >>> EpochDistribution.parse([2, 5]).support
    (2, 3, 4, 5)
    """

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigError(
                f"method.local_epochs needs 1 <= lo <= hi (got [{self.low}, {self.high}]); "
                "give an integer E or [lo, hi]."
            )

    @classmethod
    def parse(cls, value: int | Sequence[int]) -> EpochDistribution:
        """An integer E (fixed) or a pair [lo, hi] (uniform integers)."""
        if isinstance(value, int):
            return cls(low=value, high=value)
        values = [int(v) for v in value]
        if len(values) != 2:
            raise ConfigError(f"method.local_epochs must be an integer E or a pair [lo, hi] (got {list(value)}).")
        return cls(low=values[0], high=values[1])

    @property
    def support(self) -> tuple[int, ...]:
        """Every value E_i can take."""
        return tuple(range(self.low, self.high + 1))

    def draw(self, generator: torch.Generator) -> int:
        """One E_i from ``generator`` (a fixed E consumes nothing)."""
        if self.low == self.high:
            return self.low
        return int(torch.randint(self.low, self.high + 1, (1,), generator=generator))


def local_step_count(*, num_samples: int, batch_size: int, epochs: int) -> int:
    """K_i = E_i ⌈|D_i| / B⌉: the mini-batch steps of ``epochs`` passes over ``num_samples`` items.

    >>> local_step_count(num_samples=10, batch_size=4, epochs=2)
    6
    """
    return epochs * math.ceil(num_samples / batch_size)


def step_size_scale(*, steps: int, max_steps: int, rule: StepSize) -> float:
    """The client's per-step learning rate over η_l: K_max / K_i for FedShuffle, 1 for FedAvg.

    >>> step_size_scale(steps=4, max_steps=20, rule="fedshuffle"), step_size_scale(steps=4, max_steps=20, rule="fedavg")
    (5.0, 1.0)
    """
    if rule == "fedshuffle" and steps > 0:  # a client without data takes no step at all
        return max_steps / steps
    return 1.0


def fixed_step_count(step_counts: Sequence[int], rule: FixedSteps) -> int:
    """FedAvgMin / FedAvgMean: K = min, or mean rounded half up, of the cohort's step counts.

    >>> fixed_step_count([3, 4, 8], "min"), fixed_step_count([3, 4, 8], "mean"), fixed_step_count([3, 4], "mean")
    (3, 5, 4)
    """
    if not step_counts:
        raise ValueError("A fixed step count needs at least one cohort client.")
    if rule == "min":
        return min(step_counts)
    return math.floor(sum(step_counts) / len(step_counts) + 0.5)


def objective_weights(*, shares: Tensor, sizes: Tensor, epochs: Tensor, inverse_q: Tensor, b: Tensor) -> Tensor:
    """ŵ of (8.9): ŵ_i = w̃_i |D_i| E_i / (W q_i b_i), W normalising ŵ to sum one (float64).

    Args:
        shares: w̃_i, the aggregation weights.
        sizes: |D_i|.
        epochs: E_i.
        inverse_q: 1/q_i = E_S[(1/q_i^S) 1{i ∈ S}], the expected aggregation multiplier
            (1 for unbiased weights w̃_i / p_i).
        b: the local step-size divisors b_i.

    FedAvg under full participation with equal epochs (b_i = max_j E|D_j|) weights clients by
    |D_i|²; FedShuffle (b_i = E_i|D_i|) recovers w:

    >>> n = torch.tensor([1.0, 2.0, 3.0]); w = n / n.sum(); one = torch.ones(3); e = torch.tensor([2.0, 2.0, 2.0])
    >>> (14 * objective_weights(shares=w, sizes=n, epochs=e, inverse_q=one, b=(e * n).max() * one)).round().tolist()
    [1.0, 4.0, 9.0]
    >>> torch.allclose(objective_weights(shares=w, sizes=n, epochs=e, inverse_q=one, b=e * n), w.double())
    True
    """
    raw = shares.double() * sizes.double() * epochs.double() * inverse_q.double() / b.double()
    return raw / raw.sum()


def total_variation(p: Tensor, q: Tensor) -> float:
    """½ Σ_i |p_i − q_i|.

    >>> total_variation(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))
    0.5
    """
    return 0.5 * float((p.double() - q.double()).abs().sum())


def fednova_delta(*, scaled_sum: Tensor, total_weight: float, weighted_steps: float) -> Tensor:
    """FedNova's Δ = τ_eff Σ_i a_i Δ_i / τ_i, a_i = w_i / Σ w, τ_eff = Σ_i a_i τ_i.

    Args:
        scaled_sum: Σ_i w_i Δ_i / τ_i.
        total_weight: Σ_i w_i.
        weighted_steps: Σ_i w_i τ_i.

    >>> fednova_delta(scaled_sum=torch.tensor([1.0 * 2 / 2 + 3.0 * 4 / 4]), total_weight=4.0, weighted_steps=14.0)
    tensor([3.5000])
    """
    return scaled_sum * (weighted_steps / total_weight**2)


class LocalStepSums(Aggregator):
    """FedNova's sums over the uploads: Σ w_i Δ_i / τ_i, Σ w_i and Σ w_i τ_i.

    The method records each uploader's τ_i (:meth:`expect_steps`) before the engine folds the
    upload in with its weight w_i.

    >>> agg = LocalStepSums(dim=1)
    >>> agg.expect_steps(2); agg.accumulate(torch.tensor([1.0]), weight=1.0)
    >>> agg.expect_steps(4); agg.accumulate(torch.tensor([3.0]), weight=3.0)
    >>> agg.result().tolist()  # tau_eff = 14/4, mean of Delta_i/tau_i = (0.5 + 2.25) / 4
    [2.40625]
    """

    def __init__(self, *, dim: int, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.dim = int(dim)
        self.sums = torch.zeros(self.dim + 2, dtype=torch.float64, device=device)
        self._steps: int | None = None

    def expect_steps(self, steps: int) -> None:
        """τ_i of the next upload."""
        if steps < 1:
            raise ValueError(f"A FedNova upload needs at least one local step (got {steps}).")
        self._steps = steps

    @override
    def accumulate(self, decoded: Tensor, *, weight: float) -> None:
        if self._steps is None:
            raise RuntimeError("FedNova needs the uploader's local step count before its upload is folded in.")
        flat = decoded.reshape(-1)
        if flat.numel() != self.dim:
            raise ValueError(f"An upload of {flat.numel()} entries reached an aggregator of dimension {self.dim}.")
        fold_(self.sums[: self.dim], flat.to(self.sums.device), weight=float(weight) / self._steps)
        self.sums[self.dim] += float(weight)
        self.sums[self.dim + 1] += float(weight) * self._steps
        self._steps = None
        self.count += 1

    def result(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """FedNova's Δ (:func:`fednova_delta`)."""
        total = float(self.sums[self.dim])
        if total <= 0:
            raise ValueError("No upload reached the aggregator this round.")
        delta = fednova_delta(
            scaled_sum=self.sums[: self.dim], total_weight=total, weighted_steps=float(self.sums[self.dim + 1])
        )
        return delta.to(dtype)


@dataclass(frozen=True)
class LocalWork:
    """One client's local work in one round: E_i, the steps K_i it takes and its lr over η_l."""

    epochs: int
    steps: int
    lr_scale: float


class FedShuffle(FederatedModule):
    """FedShuffleGen(b, w̃, q) (Algorithm 13); the defaults are FedShuffle (Algorithm 12).

    Args:
        local_epochs: E (an integer) or [lo, hi] (E_i uniform in {lo, …, hi} per client and round).
        step_size: ``"fedshuffle"`` (η_l K_max / K_i) or ``"fedavg"`` (η_l).
        update_scaling: ``"none"`` or ``"fednova"`` (normalised aggregation only).
        fixed_steps: ``None`` (epochs), ``"min"`` (FedAvgMin) or ``"mean"`` (FedAvgMean).
        **kwargs: the :class:`~fedlightning.federated.module.FederatedModule` arguments
            (``local_steps`` must stay ``None``: local work is set by epochs).
    """

    stateless_clients = True  # E_i is drawn from the client's stream for the round; nothing is kept

    def __init__(
        self,
        *,
        local_epochs: int | Sequence[int] = 1,
        step_size: StepSize = "fedshuffle",
        update_scaling: UpdateScaling = "none",
        fixed_steps: FixedSteps | None = None,
        **kwargs: Any,
    ) -> None:
        epochs = EpochDistribution.parse(local_epochs)
        if kwargs.get("local_steps") is not None:
            raise ConfigError(
                "FedShuffle sizes local work by epochs (method.local_epochs, or method.fixed_steps=min|mean); "
                "set method.local_steps=null."
            )
        if step_size not in ("fedshuffle", "fedavg"):
            raise ConfigError(f"method.step_size must be fedshuffle or fedavg (got {step_size!r}).")
        if update_scaling not in ("none", "fednova"):
            raise ConfigError(f"method.update_scaling must be none or fednova (got {update_scaling!r}).")
        if fixed_steps not in (None, "min", "mean"):
            raise ConfigError(f"method.fixed_steps must be null, min or mean (got {fixed_steps!r}).")
        aggregation = kwargs.get("aggregation", "normalised")
        if update_scaling == "fednova" and aggregation != "normalised":
            raise ConfigError(
                "FedNova's update scaling is defined for the normalised weights w_i / Σ_S w_j; "
                "set method.aggregation=normalised."
            )
        if update_scaling == "fednova" and step_size == "fedshuffle":
            raise ConfigError(
                "FedNova's update scaling and FedShuffle's step sizes both undo the unequal step counts, "
                "so together they would under-weight clients with more local steps; "
                "use method.step_size=fedavg with method.update_scaling=fednova."
            )
        if fixed_steps is not None and (step_size != "fedavg" or update_scaling != "none"):
            raise ConfigError(
                f"FedAvg{fixed_steps.capitalize()} gives every cohort client the same number of steps with the plain "
                "local learning rate; set method.step_size=fedavg and method.update_scaling=none."
            )
        super().__init__(local_epochs=epochs.high, **kwargs)
        if update_scaling == "fednova" and self._client_momentum() != 0.0:
            raise ConfigError(
                "FedNova's normaliser tau_i = K_i holds for plain local SGD, not with momentum; "
                "set method.client_optimizer.momentum=0."
            )
        self.epoch_distribution = epochs
        self.step_size = step_size
        self.update_scaling = update_scaling
        self.fixed_steps = fixed_steps
        sizes = self.datamodule.client_sizes
        self.max_steps = epochs.high * max(math.ceil(n / self.batch_size) for n in sizes)
        """K_max over the whole federation."""
        self._plan: tuple[int, tuple[int, ...], dict[int, LocalWork]] | None = None
        self._aggregator: LocalStepSums | None = None
        self.register_buffer("objective_weight_sums", torch.zeros(len(sizes), dtype=torch.float64))

    def _client_momentum(self) -> float:
        probe = self.client_optimizer([torch.nn.Parameter(torch.zeros(1))])
        return float(probe.param_groups[0].get("momentum", 0.0) or 0.0)

    # ------------------------------------------------------------------ local work
    def client_epochs(self, *, client_id: int, round_idx: int) -> int:
        """E_i of ``client_id`` in ``round_idx``, from its own stream (same on every process and on resume)."""
        return self.epoch_distribution.draw(self.generator(round_idx, client_id, "epochs"))

    def work_plan(self, *, round_idx: int, client_ids: Sequence[int]) -> dict[int, LocalWork]:
        """Every listed client's local work in ``round_idx`` when ``client_ids`` is the cohort."""
        sizes = self.datamodule.client_sizes
        epochs = {cid: self.client_epochs(client_id=cid, round_idx=round_idx) for cid in client_ids}
        steps = {
            cid: local_step_count(num_samples=sizes[cid], batch_size=self.batch_size, epochs=epochs[cid])
            for cid in client_ids
        }
        if self.fixed_steps is not None:  # over the clients that hold data: an empty one cannot take a step
            counts = [k for k in steps.values() if k > 0]
            common = fixed_step_count(counts, self.fixed_steps) if counts else 0
            steps = dict.fromkeys(client_ids, common)
        return {
            cid: LocalWork(
                epochs=epochs[cid],
                steps=steps[cid],
                lr_scale=step_size_scale(steps=steps[cid], max_steps=self.max_steps, rule=self.step_size),
            )
            for cid in client_ids
        }

    @override
    def cohort_loads(self, cohort: Cohort) -> list[float]:
        """K_i of every cohort member: the local steps of its drawn epochs (what the processes balance)."""
        plan = self.round_plan(round_idx=cohort.round_idx, client_ids=cohort.client_ids)
        return [float(plan[cid].steps) for cid in cohort.client_ids]

    def round_plan(self, *, round_idx: int, client_ids: tuple[int, ...]) -> dict[int, LocalWork]:
        """:meth:`work_plan`, drawn once per round and cohort (the deal, every client and the metrics ask)."""
        if self._plan is None or self._plan[:2] != (round_idx, client_ids):
            self._plan = (round_idx, client_ids, self.work_plan(round_idx=round_idx, client_ids=client_ids))
        return self._plan[2]

    def local_work(self, *, client_id: int, round_idx: int) -> LocalWork:
        """This client's work in the round in progress (its cohort is the engine's ``round_cohort``)."""
        return self.round_plan(round_idx=round_idx, client_ids=self.round_cohort.client_ids)[client_id]

    @override
    def client_batches(self, *, client_id: int, round_idx: int, num_samples: int) -> Any:
        work = self.local_work(client_id=client_id, round_idx=round_idx)
        return local_batches(
            num_samples=num_samples,
            batch_size=self.batch_size,
            epochs=work.epochs,
            steps=work.steps if self.fixed_steps is not None else None,
            generator=self.generator(round_idx, client_id, "batches"),
        )

    @override
    def make_client_optimizer(self, params: ParamsT, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        optimizer = super().make_client_optimizer(params, client_id=client_id, round_idx=round_idx)
        scale = self.local_work(client_id=client_id, round_idx=round_idx).lr_scale
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * scale
        return optimizer

    # ------------------------------------------------------------------ server
    @override
    def make_aggregator(self, round_idx: int) -> Aggregator:
        if self.update_scaling == "fednova":
            self._aggregator = LocalStepSums(dim=self.uplink_numel, device=self.device)
            return self._aggregator
        return super().make_aggregator(round_idx)

    @override
    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        if self._aggregator is not None:
            # A client without data uploads Δ_i = 0 with w_i = 0: any τ_i ≥ 1 leaves the sums unchanged.
            self._aggregator.expect_steps(max(self.local_work(client_id=client_id, round_idx=round_idx).steps, 1))

    @override
    def server_delta(self, *, round_idx: int, aggregator: Aggregator) -> Tensor:
        if isinstance(aggregator, LocalStepSums):
            return aggregator.result()
        return super().server_delta(round_idx=round_idx, aggregator=aggregator)

    def round_objective_weights(self, round_idx: int) -> Tensor:
        """Each cohort client's first-order weight in this round's update (zero off the cohort, float64).

        Client i's update is ≈ −η_l (lr_scale_i K_i) ∇f_i(x) for small steps, and the server
        applies it with its aggregation coefficient c_i (w_i/p_i or w_i / Σ_S w_j), rescaled by
        τ_eff / τ_i under FedNova.
        """
        cohort = self.round_cohort
        plan = self.round_plan(round_idx=round_idx, client_ids=cohort.client_ids)
        sizes = torch.tensor(self.datamodule.client_sizes, dtype=torch.float64)
        shares = sizes / sizes.sum()
        ids = torch.tensor(cohort.client_ids)
        if self.aggregation == "unbiased":
            coefficient = shares[ids] / cohort.inclusion_probabilities.double()
        else:
            coefficient = shares[ids] / shares[ids].sum()
        steps = torch.tensor([plan[c].steps for c in cohort.client_ids], dtype=torch.float64)
        moved = torch.tensor([plan[c].lr_scale for c in cohort.client_ids], dtype=torch.float64) * steps
        if self.update_scaling == "fednova":
            moved = moved * float((coefficient * steps).sum()) / steps.clamp(min=1.0)
        weights = torch.zeros(len(sizes), dtype=torch.float64)
        weights[ids] = coefficient * moved
        return weights

    @override
    def server_metrics(self, round_idx: int) -> dict[str, float]:
        sums = cast(Tensor, self.objective_weight_sums)  # a registered buffer: checkpointed, survives resume
        sums += self.round_objective_weights(round_idx).to(sums)
        sums = sums.cpu()
        sizes = torch.tensor(self.datamodule.client_sizes, dtype=torch.float64)
        w_hat = sums / sums.sum()
        plan = self.round_plan(round_idx=round_idx, client_ids=self.round_cohort.client_ids)
        return {
            "diag/objective_weight_tv": total_variation(w_hat, sizes / sizes.sum()),
            "diag/local_steps_mean": sum(w.steps for w in plan.values()) / len(plan),
        }
