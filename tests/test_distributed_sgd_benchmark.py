"""benchmarks/distributed_sgd.py's workers (error feedback around an unbiased operator) and its seed summary."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fedlightning.compression import TernGrad


def load_benchmark(name: str = "distributed_sgd") -> ModuleType:
    """The script ``benchmarks/<name>.py`` as a module (benchmarks are not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_terngrad_schemes_differ_only_in_error_feedback() -> None:
    table = load_benchmark().schemes(0.1)
    assert isinstance(table["terngrad"].build(0.1), TernGrad) and not table["terngrad"].error_feedback
    assert isinstance(table["terngrad_ef"].build(0.1), TernGrad) and table["terngrad_ef"].error_feedback


def test_terngrad_with_error_feedback_delivers_exactly_the_sum_of_two_steps_whatever_the_coin() -> None:
    # s = (1/2, −1, 0), ‖s‖∞ = 1: TernGrad sends (b, −1, 0) with b ~ Bernoulli(1/2), the memory keeps
    # (1/2 − b, 0, 0); the second message compresses (1 − b, −1, 0), whose entries are 0 or ±‖·‖∞, so it
    # is sent exactly and the memory is empty again: two messages decode to 2s for either coin
    bench = load_benchmark()
    step = torch.tensor([0.5, -1.0, 0.0])
    seen_coins = set()
    for seed in range(8):
        workers = bench.Workers(TernGrad(), [3], 1, True, seed)
        first = workers.send(0, step)
        assert first[1] == -1.0 and first[2] == 0.0 and float(first[0]) in (0.0, 1.0)
        seen_coins.add(float(first[0]))
        assert torch.equal(workers.memory[0], step - first)
        second = workers.send(0, step)
        assert torch.equal(first + second, 2 * step)
        assert torch.equal(workers.memory[0], torch.zeros(3))
    assert seen_coins == {0.0, 1.0}  # both branches of the coin were exercised


def test_without_error_feedback_the_memory_stays_empty() -> None:
    workers = load_benchmark().Workers(TernGrad(), [3], 1, False, 0)
    workers.send(0, torch.tensor([0.5, -1.0, 0.0]))
    assert torch.equal(workers.memory[0], torch.zeros(3))
    assert workers.bits > 0


def load_seed_summary() -> ModuleType:
    return load_benchmark("distributed_sgd_seeds")


def test_paired_difference_has_the_student_t_half_width_of_its_sample_sd() -> None:
    summary = load_seed_summary()
    p = summary.paired({0: 0.9, 1: 0.8, 2: 0.7}, {0: 0.8, 1: 0.8, 2: 0.6})
    # differences 0.1, 0, 0.1: mean 1/15, sd √(1/300), half-width t_{0.975,2}·sd/√3 with t_{0.975,2} = 4.302653
    assert p.mean == pytest.approx(1 / 15, abs=1e-12)
    assert p.sd == pytest.approx((1 / 300) ** 0.5, rel=1e-9)
    assert p.half_width_95 == pytest.approx(4.302652729911275 * (1 / 300) ** 0.5 / 3**0.5, rel=1e-9)
    assert not p.same_sign and not p.survives
    constant = summary.paired({0: 0.9, 1: 0.8}, {0: 0.8, 1: 0.7, 5: 0.1})
    assert constant.seeds == (0, 1) and constant.same_sign and constant.survives


def test_runs_that_stopped_before_the_epoch_are_left_out(tmp_path: Path) -> None:
    summary = load_seed_summary()
    base = {"workload": "mnist", "op": "none", "lr": 0.1, "density": 0.01, "validation": 0, "master": "none"}
    lines = [
        {**base, "seed": 0, "step": 10, "epoch": 0.5, "test_acc": 0.5, "up_bits": 1},
        {**base, "seed": 0, "step": 20, "epoch": 1.0, "test_acc": 0.7, "up_bits": 2},
        {**base, "seed": 1, "step": 10, "epoch": 0.5, "test_acc": 0.6, "up_bits": 1},
    ]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    runs = summary.final_records([path], 1.0)
    (key,) = runs
    assert list(runs[key]) == [0] and runs[key][0]["test_acc"] == 0.7


def test_a_non_finite_vector_to_compress_stops_the_run_instead_of_reaching_the_operator() -> None:
    bench = load_benchmark()
    workers = bench.Workers(TernGrad(), [3], 1, True, 0)
    with pytest.raises(bench.DivergedError, match="worker 0"):
        workers.send(0, torch.tensor([1.0, float("inf"), 0.0]))
    assert workers.bits == 0
