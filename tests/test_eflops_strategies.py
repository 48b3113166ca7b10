"""E-FLoPS's variants as strategies: one table per config key, the ``_target_`` form, hand-checked values.

Every variant key (``method.constraint``, ``method.off_support_gates``, ...) takes the name of
a strategy in one table or the strategy itself, built by Hydra from a ``_target_``; an unknown
name is refused in one sentence listing the choices.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from fedlightning.errors import ConfigError
from fedlightning.methods import eflops_aggregation, eflops_lagrangian, eflops_off_support, eflops_support
from fedlightning.methods.eflops import EFLoPS
from fedlightning.methods.eflops_lagrangian import (
    CosineDecay,
    Equality,
    Inequality,
    LinearDecay,
    TemperatureSchedule,
)
from fedlightning.methods.eflops_off_support import ClosedGateGradients, ClosedGates, RegrowGates, ResumeGates
from fedlightning.methods.eflops_support import ExpectedMagnitude, GlobalTopM, PerTensorTopM, TopMSupport
from fedlightning.models.hard_concrete import HardConcrete
from fedlightning.schema import validate_config
from tests.conftest import compose_config

# key -> (table, names as a Literal, the attribute of the module that holds the strategy)
VARIANTS: dict[str, tuple[dict[str, Any], Any, str]] = {
    "temperature_schedule": (
        eflops_lagrangian.TEMPERATURE_SCHEDULES,
        eflops_lagrangian.TemperatureScheduleName,
        "temperature_schedule",
    ),
    "prior": (eflops_lagrangian.PRIORS, eflops_lagrangian.PriorName, "prior"),
    "density_estimator": (
        eflops_lagrangian.DENSITY_ESTIMATORS,
        eflops_lagrangian.DensityEstimatorName,
        "density_estimator",
    ),
    "constraint": (eflops_lagrangian.CONSTRAINTS, eflops_lagrangian.ConstraintName, "constraint"),
    "constraint_scale": (
        eflops_lagrangian.CONSTRAINT_SCALES,
        eflops_lagrangian.ConstraintScaleName,
        "constraint_scale",
    ),
    "selection": (eflops_support.SELECTIONS, eflops_support.SelectionName, "selection"),
    "final_support": (eflops_support.FINAL_SUPPORTS, eflops_support.FinalSupportName, "final_support"),
    "support_allocation": (
        eflops_support.SUPPORT_ALLOCATIONS,
        eflops_support.SupportAllocationName,
        "support.allocation",
    ),
    "off_support": (eflops_off_support.OFF_SUPPORT_WEIGHTS, eflops_off_support.OffSupportWeightsName, "off_support"),
    "off_support_gates": (
        eflops_off_support.OFF_SUPPORT_GATES,
        eflops_off_support.OffSupportGatesName,
        "off_support_gates",
    ),
    "gate_aggregation": (
        eflops_aggregation.GATE_AGGREGATIONS,
        eflops_aggregation.GateAggregationName,
        "gate_aggregation",
    ),
}


def _module(**kwargs: Any) -> EFLoPS:
    """nn.Linear(3, 1) at ρ = 0.5: |θ| = 4, m = 2 (per tensor: weight 1, bias 1), no data."""
    return EFLoPS(density=0.5, model=nn.Linear(3, 1), datamodule=types.SimpleNamespace(task="regression"), **kwargs)


def _attribute(module: EFLoPS, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), module)


@pytest.mark.parametrize("key", list(VARIANTS))
def test_each_key_maps_its_names_to_strategies_in_one_table(key: str) -> None:
    table, names, attribute = VARIANTS[key]
    assert typing.get_args(names) == tuple(table)  # the constructor's annotation lists exactly the table's names
    for name, strategy in table.items():
        assert strategy.name == name
        chosen = _attribute(_module(**{key: name}), attribute)
        assert chosen is strategy
        assert _attribute(_module(**{key: type(strategy)()}), attribute) == strategy  # an instance: the same variant


@pytest.mark.parametrize("key", list(VARIANTS))
def test_an_unknown_name_is_refused_in_one_sentence_listing_the_choices(key: str) -> None:
    choices = ", ".join(VARIANTS[key][0])
    with pytest.raises(ConfigError, match=rf"^method\.{key}='nope' is unknown; choose one of {choices}\.$"):
        _module(**{key: "nope"})


def test_a_strategy_of_another_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^method\.constraint=CosineDecay\(\) is unknown; choose one of inequality"):
        _module(constraint=CosineDecay())


def _regression_data() -> types.SimpleNamespace:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 10, generator=gen)
    y = x[:, :2] @ torch.tensor([1.0, -1.0])
    return types.SimpleNamespace(
        task="regression", num_clients=1, client_sizes=[12], client_tensors=lambda k: (x, y), augment=lambda v, g: v
    )


def _from_config(*overrides: str) -> EFLoPS:
    cfg = compose_config(["method=eflops", "method.density=0.1", "method.lambda_lr=10", *overrides])
    validate_config(compose_config(["method=eflops", *overrides]))  # the schema takes the _target_ form
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 1))
    module = instantiate(cfg.method, _partial_=True)(model=model, datamodule=_regression_data(), batch_size=4)
    assert isinstance(module, EFLoPS)
    return module


def test_the_target_form_builds_the_method_the_names_build() -> None:
    """``method.constraint={_target_: ...Inequality}`` (and two more) train a client bit for bit as the names do."""
    by_name = _from_config("method.constraint=inequality", "method.off_support_gates=resume", "method.penalty=5")
    by_target = _from_config(
        "method.constraint={_target_:fedlightning.methods.eflops_lagrangian.Inequality}",
        "method.off_support_gates={_target_:fedlightning.methods.eflops_off_support.ResumeGates}",
        "method.penalty=5",
    )
    assert isinstance(by_target.constraint, Inequality) and isinstance(by_target.off_support_gates, ResumeGates)
    assert by_target.num_groups == by_name.num_groups == 4  # resume: one statistic per parameter tensor
    uploads = []
    for module in (by_name, by_target):
        received = module.downlink_channel.codec.encode(module.broadcast_state(1)).decode()
        uploads.append(module.client_update(client_id=0, round_idx=1, received=received).upload)
    assert torch.equal(uploads[0], uploads[1])


def test_lagrangian_hand_values_for_both_constraints() -> None:
    """log α = 0 everywhere: D = 1 / (1 + (1/11)^(2/3)) = 1 / 1.202180 = 0.831822.

    ρ = 0.5: c = 0.331822 > 0, so both constraints penalise it: with data loss 1, λ = 0.5, μ = 2, T = 0,
    L = 1 + 0.5 · 0.331822 + (2/2) · 0.331822² = 1 + 0.165911 + 0.110106 = 1.276017.
    ρ = 0.9: c = −0.068178 < 0: the inequality is met (no penalty), L = 1 − 0.034089 = 0.965911;
    the equality still penalises it, L = 0.965911 + 0.004648 = 0.970559.
    """
    data_loss, log_alpha = torch.tensor(1.0), torch.zeros(4)
    for constraint in ("equality", "inequality"):
        loss, density, c = _module(constraint=constraint, penalty=2.0).lagrangian(data_loss, log_alpha, 0.5, 0.0)
        assert float(density) == pytest.approx(0.831822, abs=1e-6) and float(c) == pytest.approx(0.331822, abs=1e-6)
        assert float(loss) == pytest.approx(1.276017, abs=1e-6)
    inequality = EFLoPS(
        density=0.9,
        model=nn.Linear(3, 1),
        datamodule=types.SimpleNamespace(task="regression"),
        constraint="inequality",
        penalty=2.0,
    )
    equality = EFLoPS(
        density=0.9, model=nn.Linear(3, 1), datamodule=types.SimpleNamespace(task="regression"), penalty=2.0
    )
    assert float(inequality.lagrangian(data_loss, log_alpha, 0.5, 0.0)[0]) == pytest.approx(0.965911, abs=1e-6)
    assert float(equality.lagrangian(data_loss, log_alpha, 0.5, 0.0)[0]) == pytest.approx(0.970559, abs=1e-6)


def test_dual_steps_and_violations_by_hand() -> None:
    # λ = 2, c = −0.75, η = 4: λ + η c = −1; the inequality projects it on λ ≥ 0
    assert Equality().dual_step(2.0, -0.75, 4.0) == -1.0 and Inequality().dual_step(2.0, -0.75, 4.0) == 0.0
    c = torch.tensor([-0.5, 0.0, 0.25])
    assert Equality().violation(c).tolist() == [-0.5, 0.0, 0.25]
    assert Inequality().violation(c).tolist() == [0.0, 0.0, 0.25]
    assert Inequality() == eflops_lagrangian.CONSTRAINTS["inequality"] != Equality()  # stateless: equal by class


def test_temperature_schedules_by_hand_and_a_user_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # R = 5: s = (t − 1)/4; round 2: s = 1/4, (1 + cos(π/4))/2 = (1 + 0.707107)/2 = 0.853553; round 4: 1 − 3/4
    assert CosineDecay().at(1.0, round_idx=2, rounds=5) == pytest.approx(0.853553, abs=1e-6)
    assert LinearDecay().at(1.0, round_idx=4, rounds=5) == 0.25
    assert LinearDecay().at(1.0, round_idx=4, rounds=1) == 1.0  # a one-round run keeps T

    class Quadratic(TemperatureSchedule):
        """T (1 − s)²: a schedule a user adds without touching the method."""

        name = "quadratic"

        def anneal(self, temperature: float, s: float) -> float:
            return temperature * (1.0 - s) ** 2

    module = _module(temperature=0.4, temperature_schedule=Quadratic())
    monkeypatch.setattr(EFLoPS, "attached_trainer", property(lambda self: types.SimpleNamespace(max_steps=3)))
    # engine rounds 0, 1, 2 are rounds 1, 2, 3 of 3: s = 0, 1/2, 1 -> 0.4, 0.4 / 4, 0
    assert [module.temperature_at(i) for i in range(3)] == pytest.approx([0.4, 0.1, 0.0])


def test_closed_gate_gradients_sum_the_steps_and_predict_one_sgd_step() -> None:
    closed = torch.tensor([True, False])
    sums = ClosedGateGradients(closed, "cpu")
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):  # two steps, each with ∂ℓ/∂(w · 1) = [3, 4]
        gated = w * 1.0
        sums.watch([gated])
        (gated * torch.tensor([3.0, 4.0])).sum().backward()
        sums.add_step()
    assert sums.grad_sum.tolist() == [6.0, 8.0]
    # mean gradient [3, 4]; the closed coordinate 0 moves to 0.5 − 0.1 · 3 = 0.2 at the open gate log α = 0
    theta, log_alpha = sums.candidates(
        torch.tensor([0.5, 0.5]), torch.tensor([-10.0, -10.0]), steps=2, lr=0.1, log_alpha_open=0.0
    )
    assert theta.tolist() == pytest.approx([0.2, 0.5]) and log_alpha.tolist() == [0.0, -10.0]
    assert ClosedGates().regrowth(closed, 5, "cpu") is None  # only regrow keeps the sums


def test_the_regrow_rebuild_closes_every_gate_outside_the_server_top_m() -> None:
    # every gate at log α = 0: the scores |θ̃| P(z ≠ 0) rank as |θ̃| = [3, 0.1, 2, 0.5]; the top 2 is {0, 2}
    hc = HardConcrete(log_alpha_min=-10.0, log_alpha_max=10.0)
    theta, support = torch.tensor([3.0, 0.1, 2.0, 0.5]), TopMSupport(GlobalTopM(), [4], [2])
    log_alpha = torch.zeros(4)
    ClosedGates().after_rebuild_(log_alpha, theta, hc=hc, selection=ExpectedMagnitude(), support=support)
    assert log_alpha.tolist() == [0.0, 0.0, 0.0, 0.0]  # closed: the rebuild is kept as it is
    RegrowGates().after_rebuild_(log_alpha, theta, hc=hc, selection=ExpectedMagnitude(), support=support)
    assert log_alpha.tolist() == [0.0, -10.0, 0.0, -10.0]


def test_support_allocations_bind_their_budgets() -> None:
    # sizes [100, 100, 5], ρ = 0.1, m = 20: floors [10, 10, 0] -> at least 1 -> 21 > 20: the first 10 gives one back
    assert TopMSupport.of(PerTensorTopM(), sizes=[100, 100, 5], rho=0.1, m=20).budgets == [9, 10, 1]
    assert TopMSupport.of(GlobalTopM(), sizes=[100, 100, 5], rho=0.1, m=20).budgets == [20]
    # the evaluated network per tensor: weight [2, −1, 0] keeps 1 of |θ ⊙ g| = [1, 0.5, 0]; the bias keeps its 1
    support = TopMSupport(PerTensorTopM(), [3, 1], [1, 1])
    gate = torch.full((4,), 0.5)
    assert support.keep_largest(torch.tensor([2.0, -1.0, 0.0, 4.0]), gate).tolist() == [1.0, 0.0, 0.0, 2.0]


def test_gate_aggregation_chooses_over_whom_pi_is_averaged() -> None:
    assert _module(gate_aggregation="senders").make_aggregator(0).senders_only
    assert not _module(gate_aggregation="all").make_aggregator(0).senders_only


def test_resume_gates_restart_from_the_carried_statistics() -> None:
    """π_off = [0.5, 0.9] for tensors of 2 and 1 coordinates: P(z ≠ 0) of the restarted gates is [0.5, 0.5, 0.9]."""
    hc = HardConcrete()
    log_alpha = ResumeGates().log_alpha(
        torch.zeros(3),
        round_idx=1,
        pi_off=torch.tensor([0.5, 0.9]),
        hc=hc,
        log_alpha_init=0.0,
        pi_min=0.01,
        sizes=[2, 1],
    )
    assert hc.prob_nonzero(log_alpha).tolist() == pytest.approx([0.5, 0.5, 0.9], abs=1e-6)
    assert not math.isnan(float(log_alpha.sum()))
