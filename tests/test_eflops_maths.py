"""E-FLoPS maths with hand-computed values: the L0 constraint, the dual step, the KL term, the
temperature schedule, the selection that never sends a zero score, the per-tensor support
budgets, the one-output logistic model and centralised IHT."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from torch import nn

from fedlightning.compression.gated_sparse import unpack_gate_state
from fedlightning.errors import ConfigError
from fedlightning.methods.eflops import EFLoPS
from fedlightning.methods.eflops_lagrangian import (
    CONSTRAINT_SCALES,
    annealed_temperature,
    dual_ascent_step,
    kl_to_constraint_pull,
)
from fedlightning.methods.eflops_off_support import regrow_candidates
from fedlightning.methods.eflops_support import allocated_top_m_mask, nonzero_top_m_mask, per_tensor_budgets
from fedlightning.methods.fediht import iterative_hard_thresholding
from fedlightning.models.hard_concrete import bernoulli_kl, prob_nonzero
from fedlightning.models.linear import BinaryLogisticRegression
from fedlightning.models.presets import build_model


def _module(**kwargs: object) -> EFLoPS:
    return EFLoPS(model=nn.Linear(3, 1), datamodule=types.SimpleNamespace(task="regression"), **kwargs)  # type: ignore[arg-type]


def test_l0_density_constraint_is_the_default_and_equals_d_minus_rho() -> None:
    module = _module(density=0.5)
    assert module.constraint_scale.name == "absolute" and module.constraint.name == "equality" and module.penalty == 0.0
    # log alpha = 0 everywhere: D = P(z != 0) = sigmoid(-beta log(-gamma/zeta)) = 0.8320
    log_alpha = torch.zeros(4)
    d = module.density_estimate(log_alpha)
    assert float(d) == pytest.approx(1.0 / (1.0 + (0.1 / 1.1) ** (2.0 / 3.0)), abs=1e-6)
    assert float(module.constraint_value(d)) == pytest.approx(float(d) - 0.5, abs=1e-7)
    assert float(CONSTRAINT_SCALES["absolute"](torch.tensor(0.03), 0.02)) == pytest.approx(0.01)
    assert float(CONSTRAINT_SCALES["relative"](torch.tensor(0.03), 0.02)) == pytest.approx(0.5)
    assert float(CONSTRAINT_SCALES["log"](torch.tensor(0.04), 0.02)) == pytest.approx(math.log(2.0))


def test_dual_ascent_step_exact_values() -> None:
    assert dual_ascent_step(2.0, 0.25, 4.0, nonnegative=False) == 3.0
    assert dual_ascent_step(2.0, -0.75, 4.0, nonnegative=False) == -1.0  # equality: lambda may change sign
    assert dual_ascent_step(2.0, -0.75, 4.0, nonnegative=True) == 0.0  # inequality: projected on lambda >= 0


def test_kl_term_hand_value() -> None:
    # KL(Bern(1/2) || Bern(0.02)) = 0.5 ln(0.5/0.02) + 0.5 ln(0.5/0.98) = 1.272966
    assert float(bernoulli_kl(torch.tensor(0.5), 0.02)) == pytest.approx(1.272966, abs=1e-6)
    module = _module(density=0.5, prior="uniform")
    # uniform prior: KL = ln 2 - H(q) with q = P(z != 0 | log alpha = 0) = 0.83202
    q = float(prob_nonzero(torch.tensor(0.0)))
    expected = math.log(2) + q * math.log(q) + (1 - q) * math.log(1 - q)
    assert float(module.kl_term(torch.zeros(4))) == pytest.approx(expected, abs=1e-6)


def test_temperature_schedules_exact_values() -> None:
    linear = [annealed_temperature(0.5, round_idx=t, rounds=5, schedule="linear") for t in range(1, 6)]
    assert linear == pytest.approx([0.5, 0.375, 0.25, 0.125, 0.0])
    cosine = [annealed_temperature(1.0, round_idx=t, rounds=3, schedule="cosine") for t in (1, 2, 3)]
    assert cosine == pytest.approx([1.0, 0.5, 0.0], abs=1e-12)
    assert annealed_temperature(0.3, round_idx=7, rounds=10, schedule="constant") == 0.3
    with pytest.raises(ValueError, match="temperature schedule"):
        annealed_temperature(0.3, round_idx=1, rounds=10, schedule="step")


def test_zero_scores_are_never_selected() -> None:
    scores = torch.tensor([0.0, 0.0, 0.0, 0.7, 0.0, -0.2])
    assert nonzero_top_m_mask(scores, 2).tolist() == [False, False, False, True, False, True]
    assert nonzero_top_m_mask(scores, 4).tolist() == [False, False, False, True, False, True]


def test_test_gate_selection_sends_no_closed_gate() -> None:
    """ẑ = 0 on coordinates 0-2 (log alpha = -5): the support is {3} although m = 2, not {0, 3}."""
    module = _module(density=0.5, selection="test_gate")
    assert module.m == 2
    with torch.no_grad():
        module.log_alpha.copy_(torch.tensor([-5.0, -5.0, -5.0, 3.0]))
    _, _, support, _, _ = unpack_gate_state(module.broadcast_state(1), module.num_groups)
    assert support.tolist() == [False, False, False, True]


def test_binary_logistic_model_is_the_logistic_loss() -> None:
    model = BinaryLogisticRegression(in_features=3)
    assert sum(p.numel() for p in model.parameters()) == 4  # |theta| = features + 1
    x, y = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 1, 0, 1])
    logits = model(x)
    s = model.linear(x).squeeze(1)
    ce = nn.functional.cross_entropy(logits, y)
    bce = nn.functional.binary_cross_entropy_with_logits(s, y.float())
    assert float(ce.detach()) == pytest.approx(float(bce.detach()), abs=1e-6)
    assert torch.equal(logits.argmax(1), (s > 0).long())
    assert sum(p.numel() for p in build_model("logistic", input_shape=(3571,), num_classes=2).parameters()) == 3572
    with pytest.raises(ValueError, match="one-output binary"):
        build_model("logistic", input_shape=(8,), num_classes=10)


def test_centralised_iht_orthogonal_design_and_logistic_support() -> None:
    # orthogonal design, n = 4: the least-squares solution is [3, 1, 0]; H_1 keeps coordinate 0
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    theta = iterative_hard_thresholding(x, np.array([3.0, 1.0, -3.0, -1.0]), m=1, loss="squared")
    assert theta.tolist() == pytest.approx([3.0, 0.0, 0.0])
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(200, 20))
    ys = (xs[:, 7] - 0.8 * xs[:, 3] > 0).astype(float)
    coef = iterative_hard_thresholding(xs, ys, m=2, loss="logistic", steps=300)
    assert set(np.flatnonzero(coef).tolist()) == {3, 7} and coef[7] > 0 > coef[3]


def test_kl_to_constraint_pull_hand_value() -> None:
    # T |logit(0.99) - logit(0.02)| / |lambda| = 0.001 * (4.59512 + 3.89182) / 161 = 5.2714e-5
    ratio = kl_to_constraint_pull(torch.tensor([0.99, 0.02]), -161.0, 0.001, 0.02)
    assert ratio.tolist() == pytest.approx([0.001 * (math.log(99) + math.log(49)) / 161, 0.0], rel=1e-5)
    assert math.isinf(float(kl_to_constraint_pull(torch.tensor([0.5]), 0.0, 1.0, 0.02)))  # lambda = 0


def test_regrow_candidates_take_one_sgd_prediction_at_the_open_gate() -> None:
    theta, log_alpha = torch.tensor([0.5, 0.1, -0.2]), torch.tensor([4.0, -10.0, -10.0])
    closed = torch.tensor([False, True, True])
    t, a = regrow_candidates(theta, log_alpha, closed, torch.tensor([9.0, -3.0, 0.5]), 0.1, 0.0)
    assert t.tolist() == pytest.approx([0.5, 0.4, -0.25])  # theta - lr * mean gradient, closed only
    assert a.tolist() == [4.0, 0.0, 0.0]


def test_annealed_temperature_reaches_zero_in_the_last_engine_round(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(density=0.5, temperature=0.4, temperature_schedule="linear")
    monkeypatch.setattr(EFLoPS, "attached_trainer", property(lambda self: types.SimpleNamespace(max_steps=3)))
    # the engine numbers rounds from 0: rounds 1, 2, 3 of 3 are round_idx 0, 1, 2
    assert [module.temperature_at(i) for i in range(3)] == pytest.approx([0.4, 0.2, 0.0])


def test_regrow_refuses_a_non_sgd_optimiser() -> None:
    import functools

    with pytest.raises(ConfigError, match="regrow"):
        _module(density=0.5, off_support_gates="regrow", client_optimizer=functools.partial(torch.optim.Adam, lr=0.1))


def test_per_tensor_budgets_floor_each_tensor_and_give_back_from_the_largest() -> None:
    # sizes [100, 100, 5], rho = 0.1: m = floor(20.5) = 20; floors [10, 10, 0] -> at least 1: [10, 10, 1] = 21 > m,
    # so the largest budget (tie 10 = 10: the lower index) gives one back
    assert per_tensor_budgets([100, 100, 5], 0.1, 20) == [9, 10, 1]
    # no give-back needed: floors [2, 3] sum to 5 <= m = floor(0.1 * 55) = 5
    assert per_tensor_budgets([25, 30], 0.1, 5) == [2, 3]
    with pytest.raises(ValueError, match="3 parameter tensors"):  # three tensors, m = 1
        per_tensor_budgets([1, 1, 1], 0.5, 1)


def test_per_tensor_budgets_of_the_mnist_cnn_give_fc1_its_share() -> None:
    """FedAvg CNN at rho = 0.025: m = floor(41,584.25) = 41,584; each tensor keeps floor(rho n_t), at least 1.

    conv1 800 -> 20, bias 32 -> 1; conv2 51,200 -> 1,280, bias 64 -> 1; fc1 1,605,632 -> 40,140,
    bias 512 -> 12; fc2 5,120 -> 128, bias 10 -> 1: 41,583 <= m.
    """
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    sizes = [p.numel() for p in model.parameters()]
    assert sizes == [800, 32, 51_200, 64, 1_605_632, 512, 5_120, 10]
    budgets = per_tensor_budgets(sizes, 0.025, 41_584)
    assert budgets == [20, 1, 1_280, 1, 40_140, 12, 128, 1] and sum(budgets) == 41_583


def test_allocated_top_m_mask_ranks_inside_each_tensor_and_skips_zero_scores() -> None:
    scores = torch.tensor([0.9, 0.8, 0.7, 0.05, 0.0, 0.01, 0.0, 0.0])
    # group 0 keeps 2 of [0.9, 0.8, 0.7]; group 1 keeps 2 of [0.05, 0.0, 0.01]; group 2 (all zero) keeps none
    mask = allocated_top_m_mask(scores, [2, 2, 1], [3, 3, 2])
    assert mask.tolist() == [True, True, False, True, False, True, False, False]
    # the global top 4 of the same scores takes all of group 0 and nothing of group 1's 0.01
    assert nonzero_top_m_mask(scores, 4).tolist() == [True, True, True, True, False, False, False, False]
