"""FedShuffleGen (arXiv 2204.13169; thesis arXiv 2207.00392, ch. 8) and its configs.

The quadratic federation of the thesis' objective-inconsistency example: client i holds |D_i|
copies of e_i, so f_i(x) = mean ‖x − e_i‖² (here divided by d: the engine's squared error
averages over coordinates). Every local step on client i contracts x − e_i by (1 − 2 lr/d)
whatever the batch, so a round has a closed form and so has each method's fixed point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler
from fedlightning.federated.params import flat_parameters
from fedlightning.methods.fedshuffle import (
    EpochDistribution,
    FedShuffle,
    LocalStepSums,
    fixed_step_count,
    local_step_count,
    objective_weights,
    total_variation,
)
from fedlightning.run import run
from tests.conftest import round_trainer

SIZES = (1, 2, 4)


class _Copies:
    """Client i holds ``sizes[i]`` copies of the basis vector e_i (a regression task, no held-out data)."""

    task = "regression"

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.client_sizes = list(sizes)
        self.num_clients = len(sizes)

    def client_tensors(self, cid: int) -> tuple[Tensor, Tensor]:
        n, d = self.client_sizes[cid], self.num_clients
        return torch.zeros(n, 1), torch.eye(d)[cid].repeat(n, 1)

    def augment(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return x

    def val_dataloader(self) -> list[Any]:
        return []

    def test_dataloader(self) -> list[Any]:
        return []


class _Point(nn.Module):
    """The model is the point x itself: every input predicts x."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(d))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.x.expand(len(inputs), -1)


PRESETS: dict[str, dict[str, Any]] = {
    "fedshuffle": {"aggregation": "unbiased"},
    "fedavg_epochs": {"step_size": "fedavg"},
    "fednova": {"step_size": "fedavg", "update_scaling": "fednova"},
    "fedavg_min": {"step_size": "fedavg", "fixed_steps": "min"},
    "fedavg_mean": {"step_size": "fedavg", "fixed_steps": "mean"},
}


def _quadratic(
    preset: str, *, lr: float, sizes: tuple[int, ...] = SIZES, batch_size: int = 1, **kwargs: Any
) -> FedShuffle:
    options: dict[str, Any] = {"local_epochs": 1, "aggregation": "normalised", **PRESETS[preset], **kwargs}
    return FedShuffle(
        model=_Point(len(sizes)),
        datamodule=_Copies(sizes),
        client_optimizer=lambda p: torch.optim.SGD(p, lr=lr),
        batch_size=batch_size,
        **options,
    )


def _fit(module: FedShuffle, rounds: int) -> dict[str, float]:
    trainer = round_trainer(rounds, [], limit_val_batches=0)
    trainer.fit(module)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def _fixed_point(module: FedShuffle) -> Tensor:
    """The limit of the rounds: x = Σ_i g_i c_i e_i / Σ_i g_i c_i, c_i = 1 − (1 − 2 lr_i / d)^{K_i}.

    One round maps x to x + Σ_i g_i c_i (e_i − x) (times τ_eff / K_i under FedNova), with g_i
    the aggregation weights (w_i here: full participation, Σ w = 1).
    """
    d = module.num_clients
    plan = module.work_plan(round_idx=0, client_ids=range(d))
    lr = module.client_optimizer([nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"]
    sizes = torch.tensor(module.datamodule.client_sizes, dtype=torch.float64)
    g = sizes / sizes.sum()
    steps = torch.tensor([plan[i].steps for i in range(d)], dtype=torch.float64)
    rate = torch.tensor([2 * lr * plan[i].lr_scale / d for i in range(d)], dtype=torch.float64)
    c = 1 - (1 - rate) ** steps
    if module.update_scaling == "fednova":
        c = c / steps
    return g * c / (g * c).sum()


def _limit_bound(module: FedShuffle) -> float:
    """Relative distance of the fixed point from its lr → 0 limit.

    1 − (1 − a)^K lies in [Ka (1 − Ka/2), Ka], so each c_i is its first-order value times a factor
    in [1 − δ, 1] with δ = max_i K_i a_i / 2, and each coordinate of the normalised fixed point
    is within a factor [1 − δ, 1/(1 − δ)] of the limit's.
    """
    d = module.num_clients
    plan = module.work_plan(round_idx=0, client_ids=range(d))
    lr = module.client_optimizer([nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"]
    delta = max(p.steps * 2 * lr * p.lr_scale / d for p in plan.values()) / 2
    return delta / (1 - delta)


SIZES_T = torch.tensor(SIZES, dtype=torch.float64)
FEDAVG_LIMIT = SIZES_T**2 / (SIZES_T**2).sum()  # Σ |D_i|² e_i / Σ |D_i|²
TRUE_OPTIMUM = SIZES_T / SIZES_T.sum()  # Σ |D_i| e_i / |D|


@pytest.mark.parametrize(
    ("preset", "limit", "lr", "rounds"),
    [
        # FedNova's round and FedAvgMin/Mean's step counts are checked exactly below; their
        # convergence runs are slow (the suite's time budget).
        ("fedavg_epochs", FEDAVG_LIMIT, 0.05, 150),
        ("fedshuffle", TRUE_OPTIMUM, 0.05, 110),
        pytest.param("fednova", TRUE_OPTIMUM, 0.05, 140, marks=pytest.mark.slow),
        pytest.param("fedavg_min", TRUE_OPTIMUM, 0.15, 140, marks=pytest.mark.slow),
        pytest.param("fedavg_mean", TRUE_OPTIMUM, 0.1, 120, marks=pytest.mark.slow),
    ],
)
def test_quadratic_federation_converges_to_each_methods_closed_form_limit(
    preset: str, limit: Tensor, lr: float, rounds: int
) -> None:
    # A round maps x to x + sum_i g_i c_i (e_i - x): the distance to the fixed point shrinks by
    # 1 - sum_i g_i c_i <= 0.905 here, so these rounds take it from at most 0.8 below 1e-6.
    module = _quadratic(preset, lr=lr)
    _fit(module, rounds)
    x = flat_parameters(module.model).double()
    exact = _fixed_point(module)
    assert torch.allclose(x, exact, atol=1e-5), (x, exact)
    bound = _limit_bound(module)
    assert bound < 0.1
    assert torch.all((exact - limit).abs() <= bound * limit), (exact, limit, bound)
    other = TRUE_OPTIMUM if limit is FEDAVG_LIMIT else FEDAVG_LIMIT
    assert not torch.all((exact - other).abs() <= bound * other)  # the check tells the two limits apart


def test_fedavg_limit_is_the_squared_size_weighting_and_fedshuffle_the_true_optimum_for_small_steps() -> None:
    # The limits themselves, at a step where the bound is tiny: 1e-4 relative.
    fedavg, fedshuffle = _quadratic("fedavg_epochs", lr=1e-4), _quadratic("fedshuffle", lr=1e-4)
    assert _limit_bound(fedavg) < 2e-4 and _limit_bound(fedshuffle) < 2e-4
    assert torch.allclose(_fixed_point(fedavg), FEDAVG_LIMIT, rtol=2e-4)
    assert torch.allclose(_fixed_point(fedshuffle), TRUE_OPTIMUM, rtol=2e-4)
    assert torch.allclose(FEDAVG_LIMIT, torch.tensor([1, 4, 16], dtype=torch.float64) / 21)


def test_logged_objective_weights_show_fedavgs_inconsistency_and_none_for_fedshuffle() -> None:
    # Batch 1, equal epochs, full participation: FedAvg weights client i by w_i K_i ∝ |D_i|².
    fedavg = _fit(_quadratic("fedavg_epochs", lr=0.01, local_epochs=2), 2)
    fedshuffle = _fit(_quadratic("fedshuffle", lr=0.01, local_epochs=[2, 5]), 2)
    # (Lightning logs float32: 1e-7.)
    assert fedavg["diag/objective_weight_tv"] == pytest.approx(total_variation(FEDAVG_LIMIT, TRUE_OPTIMUM), abs=1e-7)
    assert fedshuffle["diag/objective_weight_tv"] == pytest.approx(0.0, abs=1e-7)
    assert fedavg["diag/local_steps_mean"] == pytest.approx(2 * 7 / 3)


def test_objective_weight_formula_gives_fedavgs_squared_sizes_and_fedshuffles_true_weights() -> None:
    sizes = torch.tensor([3.0, 10.0, 33.0, 4.0])
    w = sizes / sizes.sum()
    one = torch.ones(4)
    epochs = torch.full((4,), 3.0)
    fedavg = objective_weights(shares=w, sizes=sizes, epochs=epochs, inverse_q=one, b=(epochs * sizes).max() * one)
    assert torch.allclose(fedavg, (sizes**2 / (sizes**2).sum()).double())
    uneven = torch.tensor([2.0, 5.0, 3.0, 4.0])
    fedshuffle = objective_weights(shares=w, sizes=sizes, epochs=uneven, inverse_q=one, b=uneven * sizes)
    assert torch.allclose(fedshuffle, w.double())


def test_per_client_learning_rates_are_eta_times_kmax_over_k() -> None:
    # Sizes 3, 10, 33 with B = 4: ceil(|D_i|/B) = 1, 3, 9; E = 2, so K = 2, 6, 18 and K_max = 18.
    module = _quadratic("fedshuffle", lr=0.1, sizes=(3, 10, 33), batch_size=4, local_epochs=2)
    assert module.max_steps == 18
    plan = module.work_plan(round_idx=0, client_ids=[0, 1, 2])
    assert [plan[c].steps for c in range(3)] == [2, 6, 18]
    assert [plan[c].lr_scale for c in range(3)] == [9.0, 3.0, 1.0]
    # With E_i in {2..5} K_max uses the largest epoch count: 9 * 5.
    hetero = _quadratic("fedshuffle", lr=0.1, sizes=(3, 10, 33), batch_size=4, local_epochs=[2, 5])
    assert hetero.max_steps == 45
    for cid, work in hetero.work_plan(round_idx=3, client_ids=[0, 1, 2]).items():
        assert work.steps == work.epochs * (1, 3, 9)[cid] and work.lr_scale == pytest.approx(45 / work.steps)
    fedavg = _quadratic("fedavg_epochs", lr=0.1, sizes=(3, 10, 33), batch_size=4, local_epochs=2)
    assert {w.lr_scale for w in fedavg.work_plan(round_idx=0, client_ids=[0, 1, 2]).values()} == {1.0}


class _Recording(FedShuffle):
    """Records each client's learning rate and batches per round."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lrs: dict[tuple[int, int], float] = {}
        self.batches: dict[tuple[int, int], list[Tensor]] = {}

    def make_client_optimizer(self, params: Any, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        optimizer = super().make_client_optimizer(params, client_id=client_id, round_idx=round_idx)
        self.lrs[(round_idx, client_id)] = optimizer.param_groups[0]["lr"]
        return optimizer

    def client_batches(self, *, client_id: int, round_idx: int, num_samples: int) -> Any:
        batches = list(super().client_batches(client_id=client_id, round_idx=round_idx, num_samples=num_samples))
        self.batches[(round_idx, client_id)] = batches
        return batches


def _recording(preset: str, sizes: tuple[int, ...] = (3, 10, 33), **kwargs: Any) -> _Recording:
    options: dict[str, Any] = {"local_epochs": [2, 5], "aggregation": "normalised", **PRESETS[preset], **kwargs}
    return _Recording(
        model=_Point(len(sizes)),
        datamodule=_Copies(sizes),
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        batch_size=4,
        **options,
    )


def test_clients_train_with_their_learning_rate_and_reshuffle_every_epoch() -> None:
    module = _recording("fedshuffle")
    _fit(module, 2)
    for (rnd, cid), batches in module.batches.items():
        epochs = module.client_epochs(client_id=cid, round_idx=rnd)
        per_epoch = math.ceil(module.datamodule.client_sizes[cid] / 4)
        assert len(batches) == epochs * per_epoch
        assert module.lrs[(rnd, cid)] == pytest.approx(0.01 * 45 / (epochs * per_epoch))
        passes = [torch.cat(batches[e * per_epoch : (e + 1) * per_epoch]) for e in range(epochs)]
        n = module.datamodule.client_sizes[cid]
        assert all(torch.equal(p.sort().values, torch.arange(n)) for p in passes)  # each pass: every sample once
    big = [torch.cat(module.batches[(0, 2)][e * 9 : (e + 1) * 9]) for e in range(2)]
    assert not torch.equal(big[0], big[1])  # a fresh permutation per pass


def test_epoch_draws_depend_only_on_seed_round_and_client() -> None:
    a = _quadratic("fedshuffle", lr=0.1, local_epochs=[2, 5])
    b = _quadratic("fedshuffle", lr=0.1, local_epochs=[2, 5])
    other_seed = _quadratic("fedshuffle", lr=0.1, local_epochs=[2, 5], seed=1)

    def draws(m: FedShuffle) -> list[int]:
        return [m.client_epochs(client_id=c, round_idx=r) for r in range(100) for c in range(3)]

    assert draws(a) == draws(b)
    assert draws(a) != draws(other_seed)
    # Uniform on {2..5}: 300 draws, each value expected 75 times, sd sqrt(300 * 1/4 * 3/4) = 7.5.
    counts = [draws(a).count(e) for e in (2, 3, 4, 5)]
    assert all(abs(c - 75) < 4 * 7.5 for c in counts), counts
    # The same draws in every cohort: the plan of a client does not depend on who else is drawn.
    alone = a.work_plan(round_idx=7, client_ids=[1])[1]
    assert alone == a.work_plan(round_idx=7, client_ids=[0, 1, 2])[1]
    assert EpochDistribution.parse(3).draw(torch.Generator()) == 3


def test_fedavg_min_and_mean_give_every_cohort_client_the_cohorts_step_count() -> None:
    # E = 2, sizes 3, 10, 33, B = 4: K = 2, 6, 18; min 2; mean 26/3 = 8.67 -> 9; cohort {0, 1}: mean 4.
    assert fixed_step_count([2, 6, 18], "min") == 2 and fixed_step_count([2, 6, 18], "mean") == 9
    for preset, full, pair in (("fedavg_min", 2, 2), ("fedavg_mean", 9, 4)):
        module = _recording(preset, local_epochs=2)
        assert {w.steps for w in module.work_plan(round_idx=0, client_ids=[0, 1, 2]).values()} == {full}
        assert {w.steps for w in module.work_plan(round_idx=0, client_ids=[0, 1]).values()} == {pair}
        _fit(module, 1)
        assert {len(b) for b in module.batches.values()} == {full}
        assert set(module.lrs.values()) == {0.01}
    hetero = _recording("fedavg_mean")
    _fit(hetero, 1)
    would = [
        local_step_count(num_samples=n, batch_size=4, epochs=hetero.client_epochs(client_id=c, round_idx=0))
        for c, n in enumerate((3, 10, 33))
    ]
    assert {len(b) for b in hetero.batches.values()} == {math.floor(sum(would) / 3 + 0.5)}


def test_fednova_round_is_tau_eff_times_the_mean_of_deltas_over_steps() -> None:
    # One round from x = 0: Δ_i = c_i e_i with c_i = 1 − (1 − 2 lr/d)^{K_i}, K_i = |D_i| (batch 1, E = 1).
    module = _quadratic("fednova", lr=0.05)
    _fit(module, 1)
    sizes = SIZES_T
    a = sizes / sizes.sum()
    c = 1 - (1 - 2 * 0.05 / 3) ** sizes
    tau_eff = float((a * sizes).sum())
    expected = tau_eff * a * c / sizes
    assert torch.allclose(flat_parameters(module.model).double(), expected, atol=1e-6)


def test_local_step_sums_refuse_an_upload_without_its_step_count() -> None:
    agg = LocalStepSums(dim=2)
    with pytest.raises(RuntimeError, match="local step count"):
        agg.accumulate(torch.zeros(2), weight=1.0)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["method=fedshuffle", "method.local_steps=5"], r"set method\.local_steps=null"),
        (["method=fednova", "method.aggregation=unbiased"], r"set method\.aggregation=normalised"),
        (["method=fedshuffle", "method.update_scaling=fednova", "method.aggregation=normalised"], r"step_size=fedavg"),
        (["method=fedavg_min", "method.step_size=fedshuffle"], r"FedAvgMin .*step_size=fedavg"),
        (["method=fednova", "method.client_optimizer.momentum=0.9"], r"client_optimizer\.momentum=0"),
        (["method=fedshuffle", "method.local_epochs=[5,2]"], r"1 <= lo <= hi"),
        (["method=fedshuffle", "method.local_epochs=[1,2,3]"], r"integer E or a pair"),
        (["method=fedshuffle", "method.step_size=fedprox"], r"method\.step_size must be"),
    ],
)
def test_combinations_that_cannot_be_right_are_refused_in_one_sentence(
    overrides: list[str], match: str, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(["rounds=1", "data.num_clients=3", "model=digits_logreg", "save_partition=false", *overrides])
    with pytest.raises(ConfigError, match=match) as caught:
        run(cfg, tmp_path)
    sentence = str(caught.value)
    assert "\n" not in sentence and sentence.endswith("."), sentence
    assert not (tmp_path / "summary.json").exists()


def test_fedshuffle_trains_on_skewed_digits_with_uniform_sampling(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(
        [
            "method=fedshuffle",
            "rounds=3",
            "eval_every=3",
            "data.num_clients=6",
            "sampler=uniform",
            "clients_per_round=3",
            "model=digits_logreg",
            "partition.alpha=0.1",
            "save_partition=false",
        ]
    )
    summary = run(cfg, tmp_path)
    assert summary["test/acc"] > 0.3
    assert summary["aggregation"] == "unbiased"


class _EveryPairInTurn(ClientSampler):
    """Cohort: the pairs of three clients in turn, so three rounds are the exact expectation over
    uniform sampling of two clients (each client's inclusion probability is 2/3)."""

    PAIRS = ((0, 1), (0, 2), (1, 2))

    def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
        pair = self.PAIRS[round_idx % 3]
        return Cohort(round_idx=round_idx, client_ids=pair, inclusion_probabilities=torch.full((2,), 2 / 3))


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("normalised", torch.tensor([7 / 36, 16 / 45, 9 / 20], dtype=torch.float64)),  # the sum-one bias
        ("unbiased", torch.tensor([1 / 6, 1 / 3, 1 / 2], dtype=torch.float64)),
    ],
)
def test_logged_objective_weights_show_the_sum_one_bias_of_partial_participation(
    aggregation: str, expected: Tensor
) -> None:
    # Sizes 1, 2, 3 and B = 4: every client takes one step, so only the aggregation weights differ.
    module = _quadratic("fedavg_epochs", lr=0.01, sizes=(1, 2, 3), batch_size=4, aggregation=aggregation)
    trainer = round_trainer(3, [_EveryPairInTurn()], limit_val_batches=0)
    trainer.fit(module)
    sums = cast(Tensor, module.objective_weight_sums)
    assert torch.allclose(sums / sums.sum(), expected, atol=1e-12)
    w = torch.tensor([1 / 6, 1 / 3, 1 / 2], dtype=torch.float64)
    logged = float(trainer.callback_metrics["diag/objective_weight_tv"])
    assert logged == pytest.approx(total_variation(expected, w), abs=1e-7)


@pytest.mark.parametrize("preset", ["fedshuffle", "fednova", "fedavg_min", "fedavg_mean"])
def test_a_client_without_data_takes_no_step_and_does_not_stop_the_others(preset: str) -> None:
    # Sizes 0, 3, 10 with B = 4 and E = 2: the others would take 2 and 6 steps.
    module = _recording(preset, sizes=(0, 3, 10), local_epochs=2)
    plan = module.work_plan(round_idx=0, client_ids=[0, 1, 2])
    expected = {"fedshuffle": [0, 2, 6], "fednova": [0, 2, 6], "fedavg_min": [2, 2, 2], "fedavg_mean": [4, 4, 4]}
    assert [plan[c].steps for c in range(3)] == expected[preset]
    _fit(module, 1)
    assert len(module.batches[(0, 0)]) == 0 and len(module.batches[(0, 1)]) == expected[preset][1]
    assert torch.isfinite(flat_parameters(module.model)).all()
