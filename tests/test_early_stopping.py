"""Early stopping on a validation metric (``early_stopping.*``): when it stops, and which round is tested.

The runs are on scikit-learn's digits (a few seconds each). To know the best round in advance
the tests monitor ``val/loss`` with ``mode=max``: the loss falls from round to round, so the
"best" round is round 1 and the run must stop after 1 + patience evaluations (patience 1:
after round 2), then test the state of round 1, i.e. report exactly what a run of
``rounds=1`` reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlightning.callbacks.early_stopping import early_stopping_callback, improves
from fedlightning.errors import ConfigError
from fedlightning.run import run

FEDAVG = ["data=digits", "partition=iid", "data.num_clients=3", "method.local_steps=5", "save_partition=false"]
LOCAL_ZAMPLING = [
    "method=local_zampling",
    "data=digits",
    "model=digits_mlp",
    "partition=iid",
    "data.num_clients=1",
    "method.compression=4",
    "method.local_steps=5",
    "reports.zampling_evaluation.val_samples=4",
    "reports.zampling_evaluation.test_samples=6",
    "save_partition=false",
]
WORST_LOSS = ["early_stopping.monitor=val/loss", "early_stopping.mode=max", "early_stopping.patience=1"]


def test_improves_needs_more_than_min_delta_in_the_monitored_direction() -> None:
    assert improves(0.5, None, mode="max", min_delta=0.0)
    assert improves(0.51, 0.5, mode="max", min_delta=0.0)
    assert not improves(0.5, 0.5, mode="max", min_delta=0.0)  # equal is no improvement
    assert not improves(0.505, 0.5, mode="max", min_delta=0.01)
    assert improves(0.49, 0.5, mode="min", min_delta=0.0)
    assert not improves(0.51, 0.5, mode="min", min_delta=0.0)
    assert not improves(float("nan"), 0.5, mode="max", min_delta=0.0)


def test_stops_after_patience_evaluations_without_improvement_and_tests_the_best_round(
    make_config, tmp_path: Path
) -> None:
    args = [*FEDAVG, "rounds=10", *WORST_LOSS, "checkpoint_every=1"]
    stopped = run(make_config(args), tmp_path / "stopped")
    first = run(make_config([*FEDAVG, "rounds=1"]), tmp_path / "first")
    assert stopped["rounds"] == 2  # round 1 is the best; round 2 does not improve on it
    assert stopped["val/loss"] < first["val/loss"]  # it did train on after round 1
    assert stopped["test/scored_round"] == 1
    assert stopped["test/acc"] == first["test/acc"]
    assert stopped["test/loss"] == first["test/loss"]
    # Resumed from its round-1 checkpoint, the run keeps the best state and stops in the same round.
    checkpoint = tmp_path / "stopped" / "checkpoints" / "round-0001.ckpt"
    resumed = run(make_config([*args, f"ckpt_path={checkpoint}"]), tmp_path / "resumed")
    assert resumed["rounds"] == 2
    assert resumed["test/scored_round"] == 1
    assert resumed["test/acc"] == first["test/acc"]


def test_without_restore_best_the_last_round_is_tested_and_named(make_config, tmp_path: Path) -> None:
    stopped = run(make_config([*FEDAVG, "rounds=10", *WORST_LOSS, "early_stopping.restore_best=false"]), tmp_path / "a")
    second = run(make_config([*FEDAVG, "rounds=2"]), tmp_path / "b")
    assert stopped["rounds"] == 2
    assert stopped["test/scored_round"] == 2
    assert stopped["test/acc"] == second["test/acc"]
    assert stopped["test/loss"] == second["test/loss"]


def test_improving_metric_runs_every_round(make_config, tmp_path: Path) -> None:
    summary = run(
        make_config([*FEDAVG, "rounds=3", "early_stopping.monitor=val/loss", "early_stopping.mode=min"]), tmp_path
    )
    assert summary["rounds"] == 3
    assert summary["test/scored_round"] == 3


def test_zampling_tests_the_best_rounds_p_with_that_rounds_masks(make_config, tmp_path: Path) -> None:
    # The sampled networks of a test come from the stream of the round whose p is scored, and
    # the best validation mask of that round is the one scored on test: the early-stopped run
    # reports exactly the sampled-network metrics of a run that ended at its best round.
    stopped = run(make_config([*LOCAL_ZAMPLING, "rounds=8", *WORST_LOSS]), tmp_path / "stopped")
    first = run(make_config([*LOCAL_ZAMPLING, "rounds=1"]), tmp_path / "first")
    assert stopped["rounds"] == 2
    assert stopped["test/scored_round"] == 1
    for key in (
        "test/acc",
        "test/acc_sampled_mean",
        "test/acc_sampled_std",
        "test/acc_best_mask",
        "test/acc_discretised",
    ):
        assert stopped[key] == first[key], key


def test_a_monitor_the_run_does_not_log_stops_at_the_first_evaluation_naming_the_logged_ones(
    make_config, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"early_stopping.monitor=val/acc_sampled_mean is not logged.*val/acc"):
        run(make_config([*FEDAVG, "rounds=3", "early_stopping.monitor=val/acc_sampled_mean"]), tmp_path)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"monitor": "val/acc", "patiense": 3}, "did you mean patience"),
        ({"monitor": "test/acc"}, "not a validation metric"),
        ({"monitor": "val/acc", "mode": "maximum"}, "max or min"),
        ({"monitor": "val/acc", "patience": 0}, "at least 1"),
        ({"monitor": "val/acc", "min_delta": -0.1}, "at least 0"),
    ],
)
def test_bad_settings_stop_before_the_run(node: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        early_stopping_callback(node)


def test_monitor_null_is_off() -> None:
    assert early_stopping_callback({"monitor": None, "patience": 10, "mode": "max"}) is None
