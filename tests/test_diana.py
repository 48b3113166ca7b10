"""DIANA converges linearly to the exact optimum under compression; compressed SGD stalls."""

from __future__ import annotations

import copy
import logging
import math

import lightning as L
import pytest
import torch

from fedlightning.callbacks.compression import UplinkCompression
from fedlightning.compression import Compressor, NaturalCompression, NaturalDithering, RandK, Sign, TopK, TopKThen
from fedlightning.datamodules import DirichletPartition
from fedlightning.datamodules.synthetic_logistic import SyntheticLogisticDataModule
from fedlightning.errors import ConfigError
from fedlightning.methods.dcsgd import DCSGD
from fedlightning.methods.diana import DIANA, VRDIANA
from fedlightning.models import build_model

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
    """f* of (1/n) Σ_i f_i by L-BFGS on a copy of the model."""
    model = copy.deepcopy(module.model).double()
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15)
    data = [module.datamodule.client_tensors(c) for c in range(module.num_clients)]

    def objective() -> torch.Tensor:
        total = sum(
            torch.nn.functional.cross_entropy(model(x.double()), y)
            + 0.5 * L2 * sum((p * p).sum() for p in model.parameters())
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


def test_diana_reaches_the_exact_optimum_where_compressed_sgd_stalls() -> None:
    rounds = 120
    comp = RandK(fraction=0.25)  # ω = 3
    diana = fit(DIANA, rounds, comp, variant="full")
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
