"""The E-FLoPS tuning protocol (benchmarks/eflops_common.py): the density rule, diverged runs, and
override merging; exact, pure selection (federated runs are faked where the protocol calls them)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import eflops_common
from eflops_common import (
    NoEligibleSettingError,
    density_eligible,
    describe_point,
    merge_overrides,
    select_grid_point,
    tune,
)


@pytest.mark.parametrize(
    ("densities", "eligible"),
    [
        ([0.018, 0.022], True),  # both ends of rho (1 +- 10%) are inside
        ([0.0186, 0.0192], True),
        ([0.0186, 0.0171], False),  # one tuning seed outside is enough to be ineligible
        ([0.0221], False),
        ([0.0179], False),
        ([0.02, math.nan], False),  # a run that reported no D cannot show it met the rule
        ([], False),
    ],
)
def test_density_eligible_iff_every_tuning_run_is_within_ten_percent_of_rho(
    densities: list[float], eligible: bool
) -> None:
    assert density_eligible(densities, 0.02) is eligible


def test_selection_skips_a_better_scoring_point_whose_density_misses_rho() -> None:
    # The synthetic N/|θ| = 0.1 case: the best validation score belongs to an ineligible point.
    scores = [0.119, 0.033, 0.025]
    losses = [1.0, 2.0, 2.1]
    assert select_grid_point(scores, losses, [True, True, True]) == 0
    assert select_grid_point(scores, losses, [False, True, True]) == 1
    assert select_grid_point(scores, losses, [False, False, True]) == 2


def test_selection_ties_go_to_lower_loss_then_earlier_point_among_eligible_ones() -> None:
    assert select_grid_point([1.0, 1.0, 1.0, 1.0], [0.3, 0.2, 0.1, 0.1], [True, True, False, True]) == 3
    assert select_grid_point([1.0, 1.0], [0.2, 0.2], [True, True]) == 0
    assert select_grid_point([1.0, 1.0], [math.nan, 0.9], [True, True]) == 1  # a NaN loss ranks last


def test_selection_returns_none_when_no_point_is_eligible() -> None:
    assert select_grid_point([0.5, 0.4], [0.1, 0.2], [False, False]) is None


def test_merge_overrides_keeps_the_last_value_of_each_key_in_first_seen_order() -> None:
    merged = merge_overrides(["method=eflops", "method.temperature=0.001", "seed=0"], ["method.temperature=0"])
    assert merged == ["method=eflops", "seed=0", "method.temperature=0"]


def fake_runs(monkeypatch: pytest.MonkeyPatch, outcomes: dict[str, dict]) -> None:
    """``federated_run`` answers from ``outcomes``, keyed by the learning-rate override of the point."""

    def run(overrides: list[str]) -> dict:
        lr = next(o for o in overrides if o.startswith("lr="))
        seed = next(o for o in overrides if o.startswith("seed="))
        return outcomes[lr][seed]

    monkeypatch.setattr(eflops_common, "federated_run", run)


def test_a_point_with_one_diverged_tuning_run_is_ineligible_however_it_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_runs(
        monkeypatch,
        {
            "lr=0.1": {"seed=100": {"diverged": True}, "seed=101": {"val/r2": 0.9, "val/loss": 0.1}},
            "lr=0.01": {"seed=100": {"val/r2": 0.3, "val/loss": 1.0}, "seed=101": {"val/r2": 0.5, "val/loss": 1.0}},
        },
    )
    best, table = tune([["lr=0.1"], ["lr=0.01"]], ["method=fediht"], [100, 101], "val/r2")
    assert best == ["lr=0.01"]
    assert [(p.eligible, p.diverged) for p in table] == [(False, 1), (True, 0)]
    assert table[1].score == pytest.approx(0.4)
    assert "diverged in 1 tuning run(s); ineligible" in describe_point(table[0], skip=0)


def test_tuning_stops_in_one_sentence_when_every_point_diverged(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_runs(monkeypatch, {"lr=0.1": {"seed=100": {"diverged": True}}})
    with pytest.raises(NoEligibleSettingError, match="no grid point trains without diverging on every tuning seed"):
        tune([["lr=0.1"]], ["method=fedavg_prune"], [100], "val/r2")
