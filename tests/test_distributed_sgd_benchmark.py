"""The worker side of benchmarks/distributed_sgd.py: error feedback (Algorithm 6) around an unbiased operator."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from fedlightning.compression import TernGrad


def load_benchmark() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "distributed_sgd.py"
    spec = importlib.util.spec_from_file_location("distributed_sgd_benchmark", path)
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
