"""Compression operators: exact codecs, analytic bits, unbiasedness and variance bounds (d = 10^5)."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.compression import (
    QSGD,
    AdaptiveRandomSparsification,
    BiasedRandomSparsification,
    Blockwise,
    Compressor,
    DeterministicNatural,
    Dithering,
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
    log2_binomial,
)
from fedlightning.compression.index_coding import position_header_bits
from fedlightning.compression.natural import natural_round

D = 100_000  # the thesis's variance experiments use d = 10^5 Gaussian vectors


def gaussian(d: int = D, seed: int = 0) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


UNBIASED = [
    NaturalCompression(),
    ExponentialRounding(base=3.0),
    NaturalDithering(p=2, s=8),
    NaturalDithering(p=math.inf, s=2),
    NaturalDithering(p=1, s=4),
    StandardDithering(p=2, s=64),
    StandardDithering(p=1, s=8),
    QSGD(s=16),
    TernGrad(),
    RandK(fraction=0.01),
    RandK(fraction=0.05, values="natural"),
    GradientSparsification(fraction=0.05),
    InducedCompressor(TopK(fraction=0.01), RandK(fraction=0.01)),
]
BIASED = [
    TopK(fraction=0.01),
    TopK(fraction=0.01, values="natural"),
    DeterministicNatural(),
    ExponentialRounding(base=3.0, unbiased=False),
    BiasedRandomSparsification(q=0.1),
    ScaledSign(),
    TopKThen(NaturalDithering(p=math.inf, s=2), fraction=0.01),
]
ALL = [Identity(), Sign(), AdaptiveRandomSparsification(), NURand1(), *UNBIASED, *BIASED]


@pytest.mark.parametrize("op", ALL, ids=lambda c: c.name)
def test_round_trip_is_exact_and_seeded(op: Compressor) -> None:
    x = gaussian(20_000, seed=3)
    m1 = op.compress(x, torch.Generator().manual_seed(5))
    m2 = op.compress(x, torch.Generator().manual_seed(5))
    assert m1.payload == m2.payload and m1.num_bits == m2.num_bits
    assert len(m1.payload) == (m1.num_bits + 7) // 8
    y = m1.decode()
    assert y.shape == x.shape and y.dtype == torch.float32
    # decoding is a pure function of the bits
    assert torch.equal(op.decode(m1), y)
    # header is declared and inside the message
    assert 0 <= m1.header_bits <= m1.num_bits


def test_identity_is_lossless_and_32_bits() -> None:
    x = gaussian(1000)
    m = Identity().compress(x)
    assert torch.equal(m.decode(), x) and m.num_bits == 32 * 1000


def test_natural_compression_exactly_9_bits_per_coordinate() -> None:
    x = gaussian()
    x[::7] = 0.0  # zeros are coded by the zero exponent
    m = NaturalCompression().compress(x, torch.Generator().manual_seed(0))
    assert m.num_bits == 9 * D and m.header_bits == 0
    y = m.decode()
    assert torch.all(y[::7] == 0)
    nz = y[y != 0].abs()
    assert torch.equal(torch.exp2(torch.log2(nz).round()), nz)  # powers of two only
    assert torch.all(torch.sign(y[x != 0]) == torch.sign(x[x != 0]))
    # each output is one of the two neighbouring powers of two
    ax = x[x != 0].abs()
    lo = torch.exp2(torch.floor(torch.log2(ax)))
    assert torch.all((y[x != 0].abs() == lo) | (y[x != 0].abs() == 2 * lo))


def test_natural_compression_fixes_powers_of_two_and_handles_subnormals() -> None:
    x = torch.tensor([1.0, -0.5, 2.0**-126, 2.0**100, -(2.0**-149), 0.0])
    y = NaturalCompression()(x, torch.Generator().manual_seed(0))
    assert y.tolist() == x.tolist()  # 2^-149 is a (subnormal) power of two: sent exactly
    with pytest.raises(ValueError):
        NaturalCompression().compress(torch.tensor([float("inf")]))


def test_natural_rounding_goes_up_exactly_when_the_draw_is_below_the_mantissa() -> None:
    """C_nat by its definition, value by value: t in [2^e, 2^{e+1}) goes up when u < t/2^e − 1 (u the stream's draw)."""
    gen = torch.Generator().manual_seed(4)
    normal = torch.randn(1500, generator=gen) * torch.exp2(torch.randint(-40, 40, (1500,), generator=gen).float())
    subnormal = torch.randint(-(2**23) + 1, 2**23, (500,), generator=gen).float() * 2.0**-149
    x = torch.cat([normal, subnormal, torch.tensor([0.0, 2.0**-149, 3 * 2.0**-149, 2.0**127, -(2.0**-126)])])
    y = natural_round(x, torch.Generator().manual_seed(9))
    draws = torch.rand(x.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64).tolist()
    expected = []
    for t, u in zip(x.tolist(), draws, strict=True):
        if t == 0:
            expected.append(0.0)
            continue
        low = 2.0 ** (math.frexp(abs(t))[1] - 1)  # the power of two at or below |t|
        expected.append(math.copysign(2 * low if u < abs(t) / low - 1 else low, t))
    assert y.tolist() == expected
    assert bool((x.abs() < 2.0**-126).sum() > 400)  # the subnormal branch was taken


def test_natural_compression_9_over_8_worst_case() -> None:
    """t = (4/3)·2^a attains E[C_nat(t)²] = (9/8)t² (Theorem 2.4.2's bound is tight)."""
    for a in (-3, 0, 5):
        t = (4.0 / 3.0) * 2.0**a
        x = torch.full((D,), t)
        y = NaturalCompression()(x, torch.Generator().manual_seed(a + 10))
        ratio = float((y.double() ** 2).mean() / t**2)
        assert ratio == pytest.approx(9 / 8, rel=0.01)
        assert float(y.double().mean()) == pytest.approx(t, rel=0.01)


@pytest.mark.parametrize("op", UNBIASED, ids=lambda c: c.name)
def test_unbiased_operators_mean_and_variance(op: Compressor) -> None:
    x = gaussian(seed=1)
    n = 8
    gens = [torch.Generator().manual_seed(100 + i) for i in range(n)]
    outs = torch.stack([op(x, g).double() for g in gens])
    xd = x.double()
    sq = xd.pow(2).sum()
    var = float(((outs - xd) ** 2).sum(1).mean() / sq)  # empirical ω(x)
    bias = float(((outs.mean(0) - xd) ** 2).sum() / sq)
    omega = op.omega(D)
    assert omega is not None and op.unbiased
    assert var <= 1.05 * omega + 1e-9, f"empirical ω {var:.4g} above the bound {omega:.4g}"
    # unbiased: the mean of n draws is off by about var/n; a bias would not shrink with n
    assert bias <= 1.5 * var / n + 1e-12, f"{op.name}: ‖mean − x‖²/‖x‖² = {bias:.3g} vs var/n = {var / n:.3g}"


@pytest.mark.parametrize("op", BIASED, ids=lambda c: c.name)
def test_biased_operators_delta_bound(op: Compressor) -> None:
    x = gaussian(seed=2)
    y = op(x, torch.Generator().manual_seed(0)).double()
    err = float(((y - x.double()) ** 2).sum() / x.double().pow(2).sum())
    assert not op.unbiased
    delta = op.delta(D)
    if math.isfinite(delta) and "natural" not in op.name.split("+")[-1]:
        assert err <= 1 - 1 / delta + 1e-9
    else:  # stochastic inner stages: the bound holds in expectation; allow the sample's slack
        assert err <= 1 - 1 / delta + 0.05


def test_top_k_energy_matches_table_4_4() -> None:
    """E s_top^k for N(0,1), k = 3, d = 100 is 18.65 (Table 4.4), by Monte Carlo."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 100, generator=gen)
    kept = torch.stack([TopK(k=3)(row) for row in x[:4000]])
    assert float((kept**2).sum(1).mean()) == pytest.approx(18.65, rel=0.03)


def test_induced_compressor_omega_formula() -> None:
    c = InducedCompressor(TopK(k=100), RandK(k=100))
    assert c.omega(D) == pytest.approx((D / 100 - 1) * (1 - 100 / D))


def test_composition_with_natural_values_omega() -> None:
    assert RandK(k=10, values="natural").omega(1000) == pytest.approx(9 * 99 / 8 + 1 / 8)


@pytest.mark.parametrize(
    "op",
    [
        RandK(fraction=0.01),
        TopK(fraction=0.01),
        RandK(fraction=0.001, values="natural"),
        TopK(fraction=0.01, values="int8"),
    ],
    ids=lambda c: c.name,
)
def test_sparse_bits_within_5_percent_of_the_bound(op: RandK | TopK) -> None:
    x = gaussian(seed=4)
    m = op.compress(x, torch.Generator().manual_seed(0))
    k = op.k_of(D)
    bound = log2_binomial(D, k) + op.values.bits_per_value * k
    assert m.num_bits - m.header_bits <= 1.05 * bound
    assert m.header_bits == position_header_bits(k) + op.values.header_bits
    # thesis convention (value bits + 1 + log2 d per kept coordinate) is always worse
    assert m.num_bits < op.analytic_bits(D)


@pytest.mark.parametrize(
    "op",
    [NaturalDithering(p=2, s=8), NaturalDithering(p=math.inf, s=2), StandardDithering(p=math.inf, s=2)],
    ids=lambda c: c.name,
)
def test_dithering_bits_at_most_the_thesis_count(op: NaturalDithering) -> None:
    x = gaussian(seed=5)
    m = op.compress(x, torch.Generator().manual_seed(0))
    assert m.num_bits <= op.analytic_bits(D)


def _levels_by_definition(op: Dithering, t: torch.Tensor, values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Each t between its neighbouring levels lo <= t < hi, up with probability (t − lo)/(hi − lo) (0 if hi = lo)."""
    u = torch.rand(t.shape, generator=gen, dtype=torch.float64)
    j = (torch.searchsorted(values, t, right=True) - 1).clamp(0, op.s - 1)
    lo, hi = values[j], values[j + 1]
    p_up = torch.where(hi > lo, (t - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(lo)), torch.zeros_like(t))
    return j + (u < p_up).to(torch.int64)


@pytest.mark.parametrize(
    ("op", "scale"),
    [
        (QSGD(), 3.5),
        (NaturalDithering(p=math.inf, s=2), 0.25),
        (NaturalDithering(p=2, s=8), 1e-3),
        (StandardDithering(p=2, s=16), 1e-44),  # subnormal: float32 rounding makes neighbouring levels equal
        (NaturalDithering(p=2, s=40), 1e-36),  # the lowest exponential levels underflow to 0
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_dithering_levels_are_those_of_the_rounding_definition_bit_for_bit(op: Dithering, scale: float) -> None:
    values = op._decoded_values(scale)
    v = torch.from_numpy(values)
    assert bool((v[1:] == v[:-1]).any()) == (scale < 1e-29)  # the last two cases do have equal levels
    gen = torch.Generator().manual_seed(3)
    t = torch.cat([torch.rand(20_000, generator=gen, dtype=torch.float64) * v[-1], v, (v[1:] + v[:-1]) / 2])
    got = op._levels(t, values, torch.Generator().manual_seed(7))
    assert torch.equal(got, _levels_by_definition(op, t, v, torch.Generator().manual_seed(7)))
    assert int(got.min()) >= 0 and int(got.max()) <= op.s


def test_fixed_size_codes() -> None:
    x = gaussian(1000)
    assert Sign().compress(x).num_bits == 1000
    assert ScaledSign().compress(x).num_bits == 1032
    assert DeterministicNatural().compress(x).num_bits == 9000
    m = ExponentialRounding(base=4.0).compress(x)
    width = (m.num_bits - 22) // 1000 - 1
    assert m.num_bits == 22 + 1000 * (1 + width)


def test_blockwise_applies_per_tensor() -> None:
    x = torch.cat([torch.full((10,), 100.0), torch.full((90,), 1.0)])
    op = Blockwise(TopK(k=1), [10, 90])
    y = op(x)
    assert int((y[:10] != 0).sum()) == 1 and int((y[10:] != 0).sum()) == 1
    assert op.delta(100) == 90.0
