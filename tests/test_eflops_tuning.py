"""The E-FLoPS tuning protocol's density rule (benchmarks/eflops_common.py): exact, pure selection."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from eflops_common import density_eligible, select_grid_point


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
