"""DIANA converges linearly to the exact optimum under compression; compressed SGD stalls."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import lightning as L
import pytest
import torch

from fedlightning.callbacks.compression import UplinkCompression
from fedlightning.compression import Compressor, NaturalCompression, NaturalDithering, RandK, Sign, TopK, TopKThen
from fedlightning.datamodules import DirichletPartition, IIDPartition
from fedlightning.datamodules.synthetic_logistic import SyntheticLogisticDataModule
from fedlightning.errors import ConfigError
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.methods.dcsgd import DCSGD
from fedlightning.methods.diana import DIANA, VRDIANA, soft_threshold, vr_diana_step
from fedlightning.models import build_model
from tests.conftest import round_trainer

logging.getLogger("lightning").setLevel(logging.ERROR)
L2 = 0.3


def datamodule() -> SyntheticLogisticDataModule:
    dm = SyntheticLogisticDataModule(
        num_clients=4, num_samples=400, dim=10, partition=DirichletPartition(alpha=0.3), seed=0, val_fraction=0.0
    )
    dm.setup("fit")
    return dm


def fit(cls: type, rounds: int, compressor, **kwargs) -> DCSGD:  # type: ignore[no-untyped-def]
    dm = datamodule()
    torch.manual_seed(0)
    model = build_model("logreg", input_shape=dm.input_shape, num_classes=2)
    module = cls(model=model, datamodule=dm, seed=0, l2=L2, **kwargs)
    trainer = L.Trainer(
        max_steps=rounds,
        callbacks=[UplinkCompression(compressor, granularity="model")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    trainer.fit(module)
    return module


def optimum(module: DCSGD) -> float:
    """f* of (1/n) Σ_i f_i by L-BFGS on a float64 copy of the model."""
    data = [module.datamodule.client_tensors(c) for c in range(module.num_clients)]
    return optimum_of(copy.deepcopy(module.model).double(), data, L2)


def test_diana_reaches_the_exact_optimum_where_compressed_sgd_stalls() -> None:
    rounds = 120
    comp = RandK(fraction=0.25)  # k = 5 of d = 22: ω = 3.4
    omega = comp.omega(22)
    # the larger DIANA step 1/(L(1 + 2ω/n)) of Mishchenko et al. (arXiv 1901.09269); the thesis's
    # default 1/(L(1 + 36(ω+1)/n)) is 15 times smaller and needs far more than 120 rounds
    probe = fit(DIANA, 1, comp, variant="full")
    assert probe.lr == pytest.approx(vr_diana_step(smoothness=probe.smoothness(), omega=omega, num_clients=4))
    diana = fit(DIANA, rounds, comp, variant="full", lr=1 / (probe.smoothness() * (1 + 2 * omega / 4)))
    dcsgd = fit(DCSGD, rounds, comp)
    f_star = optimum(diana)
    gap_diana = [h - f_star for h in diana.objective_history]
    gap_dcsgd = [h - f_star for h in dcsgd.objective_history]
    assert diana.alpha == pytest.approx(1 / (comp.omega(22) + 1))  # α = 1/(ω+1) from the metadata
    # linear convergence: the gap keeps shrinking geometrically down to float32 precision
    assert gap_diana[-1] < 1e-5
    assert gap_diana[-1] < 1e-3 * gap_diana[10]
    # compressed SGD: a noise floor well above DIANA (mean over the last rounds)
    floor = sum(gap_dcsgd[-30:]) / 30
    assert floor > 1e-3
    assert floor > 100 * max(gap_diana[-1], 1e-7)


def test_step_rules_follow_the_compressor_metadata() -> None:
    a = fit(DIANA, 1, NaturalCompression(), variant="full")
    b = fit(DIANA, 1, RandK(fraction=0.25), variant="full")
    assert a.alpha == pytest.approx(1 / (1 + 1 / 8))
    assert b.alpha < a.alpha and b.lr < a.lr
    c = fit(DCSGD, 1, NaturalCompression())
    d = fit(DCSGD, 1, RandK(fraction=0.25))
    assert d.lr < c.lr


@pytest.mark.parametrize("variant", ["lsvrg", "saga"])
def test_vr_diana_variants_decrease_the_objective(variant: str) -> None:
    module = fit(VRDIANA, 30, NaturalCompression(), variant=variant, batch_size=8, lr=0.5)
    h = module.objective_history
    assert h[-1] < h[0] - 0.05


def test_diana_refuses_biased_compressors() -> None:
    with pytest.raises(ConfigError):
        fit(DIANA, 1, TopK(k=2))


@pytest.mark.parametrize(
    "compressor",
    [Sign(), TopKThen(NaturalDithering(p=math.inf, s=2), k=8), RandK(fraction=0.25, values="int8")],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize("error_feedback", [False, True])
def test_dcsgd_auto_step_refuses_a_compressor_without_finite_delta(
    compressor: Compressor, error_feedback: bool
) -> None:
    assert math.isinf(compressor.delta(22))
    dm = datamodule()
    module = DCSGD(model=build_model("logreg", input_shape=dm.input_shape, num_classes=2), datamodule=dm, seed=0)
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[UplinkCompression(compressor, granularity="model", error_feedback=error_feedback)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with pytest.raises(ConfigError, match=r"^method.lr=auto has no step size for the uplink compressor") as err:
        trainer.fit(module)
    assert compressor.name in str(err.value) and str(err.value).count(". ") == 0
    assert module.objective_history == []  # stopped before any round


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [(DCSGD, {}), (DIANA, {}), (VRDIANA, {"variant": "lsvrg"}), (VRDIANA, {"variant": "saga"})],
    ids=["dcsgd", "diana", "vr_diana_lsvrg", "vr_diana_saga"],
)
def test_auto_step_on_a_nonlinear_model_is_refused_naming_the_fix(cls: type, kwargs: dict[str, Any]) -> None:
    dm = datamodule()
    model = build_model("mlp", input_shape=dm.input_shape, num_classes=2, hidden=[4])
    module = cls(model=model, datamodule=dm, seed=0, **kwargs)
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[UplinkCompression(NaturalCompression(), granularity="model")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with pytest.raises(ConfigError) as err:
        trainer.fit(module)
    assert str(err.value) == (
        "method.lr=auto takes its step from the smoothness L of the local losses, which is computed only for a "
        "linear model (model=digits_logreg, logreg or logistic) and not for MLP; set method.smoothness=<L> or a "
        "fixed step method.lr=<value>, or choose a linear model."
    )


def test_a_given_smoothness_sets_the_auto_step_on_a_nonlinear_model() -> None:
    dm = datamodule()
    model = build_model("mlp", input_shape=dm.input_shape, num_classes=2, hidden=[4])
    module = VRDIANA(model=model, datamodule=dm, seed=0, variant="saga", smoothness=2.0)
    assert module.sample_smoothness() == module.smoothness() == 2.0


class IterateRecorder(FederatedCallback):
    def __init__(self) -> None:
        self.iterates: list[torch.Tensor] = []

    def on_round_end(self, trainer: L.Trainer, module: Any, round_idx: int, metrics: dict[str, float]) -> None:
        self.iterates.append(flat_parameters(module.model).double())


def test_vr_diana_converges_linearly_to_1e_minus_8_with_the_thesis_step() -> None:
    """Algorithm 2 (L-SVRG, one coin per round, batch 1, γ and α of Theorem 3.5.4) under C_nat.

    Strongly convex ℓ2-regularised logistic regression; the suboptimality of each iterate is
    evaluated in float64: log10(f − f*) falls on a line (Theorem 3.5.4's linear rate) to 1e-8.
    """
    l2, rounds = 2.0, 180
    dm = SyntheticLogisticDataModule(
        num_clients=4, num_samples=16, dim=5, partition=IIDPartition(), seed=0, val_fraction=0.0
    )
    dm.setup("fit")
    torch.manual_seed(0)
    model = build_model("logreg", input_shape=dm.input_shape, num_classes=2)
    module = VRDIANA(model=model, datamodule=dm, seed=0, l2=l2, variant="lsvrg", batch_size=1, log_objective=False)
    recorder = IterateRecorder()
    callbacks = [UplinkCompression(NaturalCompression(), granularity="model"), recorder]
    round_trainer(rounds, callbacks, limit_val_batches=0, accelerator="cpu").fit(module)
    assert module.lr == pytest.approx(vr_diana_step(smoothness=module.sample_smoothness(), omega=1 / 8, num_clients=4))
    data = [dm.client_tensors(c) for c in range(4)]
    probe = copy.deepcopy(model).double()

    def f(flat: torch.Tensor) -> float:
        assign_flat_(probe, flat)
        with torch.no_grad():
            return float(
                sum(
                    torch.nn.functional.cross_entropy(probe(x.double()), y)
                    + 0.5 * l2 * sum((p * p).sum() for p in probe.parameters())
                    for x, y in data
                )
                / 4
            )

    f_star = optimum_of(probe, data, l2)
    gaps = torch.tensor([f(x) - f_star for x in recorder.iterates], dtype=torch.float64)
    assert float(gaps[-1]) < 1e-8
    # linear: log-suboptimality against rounds is a line (until the float32 iterate's floor)
    reach = int((gaps < 1e-8).nonzero()[0])
    k = torch.arange(reach, dtype=torch.float64)
    logs = gaps[:reach].log10()
    slope, intercept = torch.linalg.lstsq(torch.stack([k, torch.ones_like(k)], 1), logs[:, None]).solution[:, 0]
    residual = logs - (slope * k + intercept)
    assert float(slope) < 0 and float(residual.abs().max()) < 1.0, (float(slope), float(residual.abs().max()))


def optimum_of(model: torch.nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], l2: float) -> float:
    """f* of the mean of the clients' ℓ2-regularised logistic losses (L-BFGS in float64)."""
    model = copy.deepcopy(model)
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16)

    def objective() -> torch.Tensor:
        total = sum(
            torch.nn.functional.cross_entropy(model(x.double()), y)
            + 0.5 * l2 * sum((p * p).sum() for p in model.parameters())
            for x, y in data
        )
        return total / len(data)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    with torch.no_grad():
        return float(objective())


def test_one_reference_coin_per_round_with_probability_one_over_m() -> None:
    dm = datamodule()
    module = VRDIANA(model=build_model("logreg", input_shape=dm.input_shape, num_classes=2), datamodule=dm, seed=0)
    m = max(len(module.client_data(c)[1]) for c in range(4))
    coins = [module.reference_coin(r) for r in range(4000)]
    assert [module.reference_coin(r) for r in range(50)] == coins[:50]  # the same coin for every client
    # Binomial(4000, 1/m): mean 4000/m, within 4 standard deviations
    mean, std = 4000 / m, (4000 / m * (1 - 1 / m)) ** 0.5
    assert abs(sum(coins) - mean) < 4 * std


def test_prox_step_soft_thresholds_and_sparsifies() -> None:
    assert soft_threshold(torch.tensor([0.3, -0.05, -2.0]), 0.1).tolist() == pytest.approx([0.2, 0.0, -1.9])
    dense = fit(DIANA, 40, NaturalCompression(), variant="full", lr=0.3)
    sparse = fit(DIANA, 40, NaturalCompression(), variant="full", lr=0.3, l1=0.05)
    zeros = lambda m: int((flat_parameters(m.model) == 0).sum())  # noqa: E731
    assert zeros(sparse) > zeros(dense)


@pytest.mark.parametrize(("variant", "coin_bits"), [("lsvrg", 1), ("saga", 0)])
def test_vr_diana_counts_its_one_bit_reference_coin_per_client_and_round(variant: str, coin_bits: int) -> None:
    from fedlightning.callbacks.accounting import _DOWN_BITS, _DOWN_CONTROL, CommunicationAccountant

    rounds, dm = 3, datamodule()
    torch.manual_seed(0)
    module = VRDIANA(
        model=build_model("logreg", input_shape=dm.input_shape, num_classes=2), datamodule=dm, seed=0, variant=variant
    )
    accountant = CommunicationAccountant()
    callbacks = [UplinkCompression(NaturalCompression(), granularity="model"), accountant]
    round_trainer(rounds, callbacks, limit_val_batches=0, accelerator="cpu").fit(module)
    # Algorithm 2 sends u^k with x: 1 bit to each of the 4 clients every round (L-SVRG only), next to x in float32
    assert int(accountant.totals[_DOWN_CONTROL]) == rounds * 4 * coin_bits
    assert int(accountant.totals[_DOWN_BITS]) == rounds * 4 * (32 * 22 + coin_bits)
