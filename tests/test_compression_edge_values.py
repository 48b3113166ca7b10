"""Every compression operator over the edges of float32: subnormal, tiny, near-maximal and
overflowing-norm inputs give an output within the declared ω/δ, or a clear error, never inf or
a silent zero."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.compression import (
    QSGD,
    AdaptiveRandomSparsification,
    BiasedRandomSparsification,
    Compressor,
    DeterministicNatural,
    ExponentialRounding,
    GradientSparsification,
    Identity,
    InducedCompressor,
    NaturalCompression,
    NaturalDithering,
    NURand1,
    RandK,
    ScaledSign,
    Sign,
    StandardDithering,
    TernGrad,
    TopK,
    TopKThen,
)

D = 1000
DRAWS = 8

OPERATORS: list[Compressor] = [
    Identity(),
    Sign(),
    ScaledSign(),
    NaturalCompression(),
    DeterministicNatural(),
    ExponentialRounding(base=4.0),
    ExponentialRounding(base=3.0),
    ExponentialRounding(base=3.0, unbiased=False),
    NaturalDithering(p=2, s=8),
    NaturalDithering(p=math.inf, s=2),
    NaturalDithering(p=2, s=8, norm_code="natural"),
    StandardDithering(p=2, s=128),
    StandardDithering(p=1, s=8),
    QSGD(s=16),
    TernGrad(),
    RandK(fraction=0.05),
    RandK(fraction=0.05, values="natural"),
    RandK(fraction=1.0, values="int8"),
    RandK(fraction=1.0, values="float16"),
    RandK(fraction=0.5, values="bfloat16"),
    TopK(fraction=0.05),
    TopK(fraction=0.05, values="natural"),
    TopK(fraction=0.05, values="int8"),
    TopK(fraction=0.05, values="float16"),
    TopK(fraction=0.05, values="bfloat16"),
    BiasedRandomSparsification(q=0.1),
    AdaptiveRandomSparsification(),
    NURand1(),
    GradientSparsification(fraction=0.05),
    InducedCompressor(TopK(fraction=0.02), RandK(fraction=0.02)),
    TopKThen(NaturalDithering(p=math.inf, s=2), fraction=0.05),
]


def magnitudes(scale: float, seed: int = 0) -> torch.Tensor:
    """``D`` float32 values ``±scale·U[1/2, 1]`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    u = 0.5 + 0.5 * torch.rand(D, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(D, generator=gen) < 0.5, -1.0, 1.0).double()
    return (scale * u * sign).to(torch.float32)


INPUTS = {
    "subnormal_1e-41": 1e-41,
    "tiny_1e-30": 1e-30,
    "near_max_3e38": 3e38,
    "overflowing_norm_2e37": 2e37,  # every |x_i| is ordinary, ‖x‖₁ and ‖x‖₂ overflow float32
}


def check_declared_bound(op: Compressor, x: torch.Tensor) -> None:
    """The output is finite and within ω (unbiased: also mean ≈ x) or δ, over ``DRAWS`` draws."""
    xd = x.double()
    energy = float(xd.pow(2).sum())
    outs = []
    for i in range(DRAWS):
        y = op(x, torch.Generator().manual_seed(100 + i))
        assert bool(torch.isfinite(y).all()), f"{op.name} returned inf/NaN"
        outs.append(y.double())
        if op.deterministic:
            break
    ys = torch.stack(outs)
    err = float(((ys - xd) ** 2).sum(1).mean()) / energy  # E‖C(x) − x‖²/‖x‖², empirically
    if op.unbiased:
        omega = op.omega(D)
        assert omega is not None
        assert err <= 1.1 * omega + 1e-9, f"{op.name}: empirical ω {err:.4g} above the declared {omega:.4g}"
        bias = float(((ys.mean(0) - xd) ** 2).sum()) / energy  # about err/DRAWS when unbiased
        assert bias <= 2.5 * err / len(outs) + 1e-9, f"{op.name}: ‖mean − x‖²/‖x‖² = {bias:.3g}, err {err:.3g}"
    else:
        delta = op.delta(D)
        if math.isfinite(delta):
            slack = 0.0 if op.deterministic else 0.05 * (1 - 1 / delta)
            assert err <= 1 - 1 / delta + slack + 1e-9, (
                f"{op.name}: error {err:.4g} above 1 − 1/δ = {1 - 1 / delta:.4g}"
            )
    if not isinstance(op, Sign | ScaledSign):
        assert float(ys.abs().sum()) > 0, f"{op.name} sent a silent zero"


# The (operator, input) pairs that must refuse, each because no output within its ω/δ is a float32:
_DITHER_L1_L2 = {
    "natural_dithering(p=2,s=8)",
    "natural_dithering(p=2,s=8),norm=natural",
    "qsgd(p=2,s=16)",
    "standard_dithering(p=1,s=8)",
    "standard_dithering(p=2,s=128)",
}  # ‖x‖₁, ‖x‖₂ overflow
_RESCALED = {
    "rand_k(0.05,float32)",
    "rand_k(0.05,natural)",
    "nu_rand_1(float32)",
    "induced(top_k(0.02,float32)+rand_k(0.02,float32))",
}  # (d/k)·x_i or sign·‖x‖₁ overflow
REFUSALS: dict[str, set[str]] = {
    # bfloat16 keeps 8 significant bits only down to 2^-126: at 1e-41 it would send zeros
    "subnormal_1e-41": {"rand_k(0.5,bfloat16)", "top_k(0.05,bfloat16)"},
    "tiny_1e-30": set(),
    # above 2^127 the upper power of two (or level b^k) overflows float32
    "near_max_3e38": _DITHER_L1_L2
    | _RESCALED
    | {
        "natural",
        "natural_deterministic",
        "top_k(0.05,natural)",
        "exp_rounding(b=4,unbiased)",
        "exp_rounding(b=3,unbiased)",
        "exp_rounding(b=3,nearest)",
        "grad_spars(0.05,float32)",
        "rand_k(0.5,bfloat16)",
    },
    "overflowing_norm_2e37": _DITHER_L1_L2 | _RESCALED,
}


@pytest.mark.parametrize("where", list(INPUTS))
@pytest.mark.parametrize("op", OPERATORS, ids=lambda c: c.name)
def test_operator_is_within_its_declared_bound_or_refuses_clearly(op: Compressor, where: str) -> None:
    x = magnitudes(INPUTS[where])
    if op.name not in REFUSALS[where]:
        check_declared_bound(op, x)
        return
    with pytest.raises(ValueError) as refusal:
        op.compress(x, torch.Generator().manual_seed(0))
    sentence = str(refusal.value)
    assert sentence.endswith(".") and sentence.count(". ") == 0, sentence  # one sentence
    assert any(w in sentence for w in ("overflow", "float32", "cannot")), sentence


def test_natural_compression_on_subnormals_keeps_omega_one_eighth() -> None:
    """At 1e-41 the worst case t = (4/3)·2^a still has E[C(t)²] = (9/8)t², and mean t."""
    t = float(torch.tensor((4.0 / 3.0) * 2.0**-137, dtype=torch.float32))  # a subnormal near 1e-41
    x = torch.full((50_000,), t)
    y = NaturalCompression()(x, torch.Generator().manual_seed(0)).double()
    assert set(y.unique().tolist()) == {2.0**-137, 2.0**-136}
    assert float(y.mean()) / t == pytest.approx(1.0, abs=0.01)
    assert float((y**2).mean()) / t**2 == pytest.approx(9 / 8, abs=0.01)


def test_natural_code_spends_five_more_bits_per_subnormal_output() -> None:
    x = torch.tensor([1.0, 2.0**-140, -(2.0**-149), 0.0])
    m = NaturalCompression().compress(x, torch.Generator().manual_seed(0))
    assert m.num_bits == 4 * 9 + 2 * 5 and m.decode().tolist() == x.tolist()


def test_lossy_value_codes_declare_themselves_biased_with_their_delta() -> None:
    exact = RandK(fraction=1.0)
    assert exact.unbiased and exact.omega(100) == 0.0
    int8 = RandK(fraction=1.0, values="int8")  # sends Q(x): never x itself, so not ω = 0
    assert not int8.unbiased and int8.omega(100) is None
    assert int8.delta(100) == pytest.approx(1 / (1 - 100 / 250**2))
    assert RandK(fraction=0.1, values="int8").delta(100) == math.inf  # ω = 9 ≥ 1: no finite δ
    assert TopK(k=10, values="float16").delta(100) == pytest.approx(10 / (1 - 2.0**-20 - 10 * 2.0**-48))
    assert not NURand1(values="bfloat16").unbiased
    with pytest.raises(ValueError, match="unbiased C2"):
        InducedCompressor(TopK(k=1), RandK(k=1, values="int8"))


def test_float16_values_are_scaled_so_large_values_do_not_overflow() -> None:
    x = torch.tensor([1e5, -3e38, 2.0])
    y = RandK(fraction=1.0, values="float16")(x)
    assert bool(torch.isfinite(y).all())
    assert float(((y.double() - x.double()) ** 2).sum() / (x.double() ** 2).sum()) <= 2.0**-20
