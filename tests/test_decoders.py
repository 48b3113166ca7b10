"""Every decoder either raises MessageDecodeError or returns a tensor it could have been sent.

Property-based (hypothesis) per codec: random bytes (of any length and of the valid length),
every bit-truncation of a valid payload, and bit flips of valid payloads must end in
:class:`~fedlightning.errors.MessageDecodeError` or in a float32 tensor of the declared
shape that the codec can produce (finite where the encoder refuses inf/NaN, binary for
masks, on the lattice for :class:`LatticeCodec`); ``decode(encode(x))`` returns ``x`` for the
lossless codecs and the documented rounding for the lossy ones. The default run is small;
``-m slow`` runs every codec on 10,000 random inputs, all truncations of 200 messages and 1,000 bit-flipped ones.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from fedlightning.compression import (
    QSGD,
    AdaptiveRandomSparsification,
    BiasedRandomSparsification,
    Blockwise,
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
from fedlightning.compression.arithmetic import BernoulliRangeCodec, LatticeCodec
from fedlightning.compression.bitstream import BitWriter
from fedlightning.compression.codecs import BFloat16Codec, BitPackCodec, Float16Codec, Float32Codec
from fedlightning.compression.dithering import Dithering
from fedlightning.compression.gated_sparse import GateMessageCodec, pack_gate_state
from fedlightning.compression.index_coding import SparseCodec, decode_positions, encode_positions
from fedlightning.compression.operators import Compressor
from fedlightning.compression.values import Int8Values, NaturalValues
from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Message

MAX_NUMEL = 48


# ---------------------------------------------------------------------------- codec cases
@dataclass(frozen=True)
class Case:
    """A codec, how to build a valid input for it, and what its decoded tensors must satisfy."""

    name: str
    build: Callable[[np.random.Generator, int], tuple[Any, Tensor]]
    """``(rng, numel) -> (codec, x)``: a codec and an input it must encode."""
    check_roundtrip: Callable[[Any, Tensor, Tensor], None]
    """``(codec, x, decoded)``: asserts that decoded is what the codec promises for x."""
    check_output: Callable[[Any, Tensor], None] = lambda codec, out: None
    """``(codec, decoded)``: what any successfully decoded tensor must satisfy."""
    finite: bool = False

    def encode(self, codec: Any, x: Tensor, seed: int) -> Message:
        if isinstance(codec, Compressor):
            return codec.compress(x, torch.Generator().manual_seed(seed))
        return codec.encode(x)


def _gaussian(rng: np.random.Generator, numel: int) -> Tensor:
    return torch.from_numpy(rng.standard_normal(numel).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 1e3])))


def _sparse(rng: np.random.Generator, numel: int) -> Tensor:
    x = _gaussian(rng, numel)
    return torch.where(torch.from_numpy(rng.random(numel) < rng.random()), x, torch.zeros(()))


def _equal(codec: Any, x: Tensor, out: Tensor) -> None:
    assert torch.equal(out, x.reshape(out.shape))


def _cast(dtype: torch.dtype) -> Callable[[Any, Tensor, Tensor], None]:
    def check(codec: Any, x: Tensor, out: Tensor) -> None:
        assert torch.equal(out, x.to(dtype).float())

    return check


def _binary(codec: Any, out: Tensor) -> None:
    assert bool(((out == 0) | (out == 1)).all())


def _on_lattice(codec: Any, out: Tensor) -> None:
    k = out.double() * codec.levels
    assert bool((out >= 0).all() and (out <= 1).all()) and torch.allclose(k, k.round(), atol=1e-4)


def _mask_case(name: str, make: Callable[[Tensor], Any]) -> Case:
    def build(rng: np.random.Generator, numel: int) -> tuple[Any, Tensor]:
        p = torch.from_numpy(rng.choice([0.0, 0.02, 0.5, 0.97, 1.0], numel) * rng.random(numel) ** 0.1)
        z = (torch.from_numpy(rng.random(numel)) < p).float()
        return make(p), z

    return Case(name, build, _equal, _binary)


def _lattice(levels: int) -> Case:
    def build(rng: np.random.Generator, numel: int) -> tuple[Any, Tensor]:
        return LatticeCodec(levels=levels), torch.from_numpy(rng.integers(0, levels + 1, numel) / levels)

    def check(codec: Any, x: Tensor, out: Tensor) -> None:
        assert torch.equal(out, x.float())

    return Case(f"lattice(K={levels})", build, check, _on_lattice, finite=True)


def _sparse_case(values: str, check: Callable[[Any, Tensor, Tensor], None]) -> Case:
    return Case(f"sparse[{values}]", lambda rng, n: (SparseCodec(value_codec=values), _sparse(rng, n)), check)


def _int8_values(codec: Any, x: Tensor, out: Tensor) -> None:
    nz = x != 0
    q = Int8Values().roundtrip(x[nz].numpy())
    assert torch.equal(out[nz], torch.from_numpy(q)) and bool((out[~nz] == 0).all())
    assert float((out - x).abs().max()) <= float(x.abs().max()) / 254 * (1 + 1e-5)


def _natural_values(codec: Any, x: Tensor, out: Tensor) -> None:
    assert torch.equal(out, torch.from_numpy(NaturalValues().roundtrip(x.numpy())))


class _Positions:
    """:func:`encode_positions` / :func:`decode_positions` as a codec of 0/1 support vectors."""

    name = "position stream"

    def encode(self, x: Tensor) -> Message:
        payload, n = encode_positions(torch.nonzero(x, as_tuple=True)[0], x.numel())
        return Message(payload=payload, num_bits=n, codec=self, shape=tuple(x.shape))

    def decode(self, message: Message) -> Tensor:
        numel = math.prod(message.shape)
        p = decode_positions(message.payload, message.num_bits, dim=numel)
        assert bool((p[1:] > p[:-1]).all()) and (p.numel() == 0 or 0 <= int(p[0]) <= int(p[-1]) < numel)
        out = torch.zeros(numel)
        out[p] = 1.0
        return out


def _positions(rng: np.random.Generator, numel: int) -> tuple[Any, Tensor]:
    return _Positions(), (torch.from_numpy(rng.random(numel)) < rng.random()).float()


def _op(make: Callable[[int], Compressor], check: Callable[[Any, Tensor, Tensor], None], name: str) -> Case:
    return Case(name, lambda rng, n: (make(n), _gaussian(rng, n)), check, finite=make(8).finite_output)


def _sign(codec: Any, x: Tensor, out: Tensor) -> None:
    assert torch.equal(out, torch.where(x < 0, -1.0, 1.0))


def _scaled_sign(codec: Any, x: Tensor, out: Tensor) -> None:
    scale = np.float32(x.abs().sum(dtype=torch.float64).item() / x.numel())
    assert torch.equal(out, torch.where(x < 0, -1.0, 1.0) * float(scale))


def _brackets(base: float) -> Callable[[Any, Tensor, Tensor], None]:
    """|out| is a power of ``base`` next to |x| (or 0 for 0), with the sign of x."""

    def check(codec: Any, x: Tensor, out: Tensor) -> None:
        a, o = x.double().abs(), out.double().abs()
        assert bool(((out == 0) == (x == 0)).all()) and bool((torch.sign(out) == torch.sign(x)).all())
        nz = a > 0
        ratio = o[nz] / a[nz]
        assert bool((ratio > 1 / base - 1e-9).all() and (ratio < base + 1e-9).all())
        e = torch.log(o[nz]) / math.log(base)
        assert torch.allclose(e, e.round(), atol=1e-6)

    return check


def _dithered(codec: Any, x: Tensor, out: Tensor) -> None:
    """|out| / ‖x‖_p is one of the two levels around |x_i| / ‖x‖_p, sign preserved."""
    assert isinstance(codec, Dithering)
    xd = x.double()
    norm = float(xd.abs().max()) if math.isinf(codec.p) else float(torch.linalg.vector_norm(xd, ord=codec.p))
    norm = float(np.float32(norm))
    levels = torch.from_numpy(codec.level_values())
    y = (xd.abs() / norm).clamp(max=1.0)
    hi = torch.searchsorted(levels, y).clamp(max=codec.s)
    lo = (hi - 1).clamp(min=0)
    got = out.double().abs() / norm
    near = torch.isclose(got, levels[lo], rtol=1e-5, atol=0) | torch.isclose(got, levels[hi], rtol=1e-5, atol=0)
    assert bool(near.all()) and bool((out * x >= 0).all())


def _top_k(k: int) -> Callable[[Any, Tensor, Tensor], None]:
    def check(codec: Any, x: Tensor, out: Tensor) -> None:
        keep = torch.topk(x.abs(), min(k, x.numel())).indices
        expected = torch.zeros_like(x)
        expected[keep] = x[keep]
        assert torch.equal(out, expected)

    return check


def _rand_k(k: int) -> Callable[[Any, Tensor, Tensor], None]:
    def check(codec: Any, x: Tensor, out: Tensor) -> None:
        kept = out != 0
        d = x.numel()
        assert int(kept.sum()) == min(k, d)
        assert torch.allclose(out[kept], x[kept] * (d / min(k, d)), rtol=1e-6)

    return check


def _subset(codec: Any, x: Tensor, out: Tensor) -> None:
    assert bool(((out == 0) | (out == x)).all())


def _one_coordinate(codec: Any, x: Tensor, out: Tensor) -> None:
    kept = torch.nonzero(out, as_tuple=True)[0]
    assert kept.numel() == 1 and float(out[kept]) == float(x[kept])


def _nu_rand(codec: Any, x: Tensor, out: Tensor) -> None:
    kept = torch.nonzero(out, as_tuple=True)[0]
    l1 = np.float32(x.abs().double().sum().item())
    assert kept.numel() == 1 and float(out[kept]) == float(np.sign(float(x[kept]))) * float(l1)


def _rescaled_subset(codec: Any, x: Tensor, out: Tensor) -> None:
    assert bool((out * x >= 0).all()) and bool((out.abs() >= x.abs() * (1 - 1e-6) - 1e-30)[out != 0].all())


def _top_k_then(codec: Any, x: Tensor, out: Tensor) -> None:
    keep = torch.topk(x.abs(), min(3, x.numel())).indices
    outside = torch.ones_like(x, dtype=torch.bool)
    outside[keep] = False
    assert bool((out[outside] == 0).all()) and bool((out * x >= 0).all())


def _induced(codec: Any, x: Tensor, out: Tensor) -> None:
    keep = torch.topk(x.abs(), min(3, x.numel())).indices  # the residual is 0 there: C2 adds nothing
    assert torch.equal(out[keep], x[keep])


def _blockwise_top_k(codec: Any, x: Tensor, out: Tensor) -> None:
    for xb, ob in zip(torch.split(x, codec.sizes), torch.split(out, codec.sizes), strict=True):
        _top_k(2)(codec, xb, ob)


def _blocks(n: int) -> list[int]:
    return [n // 2, n - n // 2] if n > 1 else [n]


def _gate_state(rng: np.random.Generator, numel: int) -> tuple[Any, Tensor]:
    dim = max(1, numel // 2)
    theta = _gaussian(rng, dim)
    pi = torch.from_numpy(rng.random(dim).astype(np.float32))
    support = torch.from_numpy(rng.random(dim) < rng.random())
    return GateMessageCodec(num_groups=2), pack_gate_state(theta, pi, support, 0.25, torch.tensor([0.1, 0.2]))


CASES: list[Case] = [
    Case("float32", lambda rng, n: (Float32Codec(), _gaussian(rng, n)), _equal),
    Case("float16", lambda rng, n: (Float16Codec(), _gaussian(rng, n)), _cast(torch.float16)),
    Case("bfloat16", lambda rng, n: (BFloat16Codec(), _gaussian(rng, n)), _cast(torch.bfloat16)),
    _mask_case("bitpack", lambda p: BitPackCodec()),
    _mask_case("bernoulli_range", lambda p: BernoulliRangeCodec(model_p=p)),
    _lattice(1),
    _lattice(5),
    Case("positions", _positions, _equal, _binary),
    _sparse_case("float32", _equal),
    _sparse_case("float16", _cast(torch.float16)),
    _sparse_case("bfloat16", _cast(torch.bfloat16)),
    _sparse_case("int8", _int8_values),
    _sparse_case("natural", _natural_values),
    _op(lambda n: Identity(), _equal, "identity"),
    _op(lambda n: Sign(), _sign, "sign"),
    _op(lambda n: ScaledSign(), _scaled_sign, "scaled_sign"),
    _op(lambda n: NaturalCompression(), _brackets(2.0), "natural"),
    _op(lambda n: DeterministicNatural(), _brackets(2.0), "natural_deterministic"),
    _op(lambda n: ExponentialRounding(base=3.0), _brackets(3.0), "exp_rounding"),
    _op(lambda n: StandardDithering(p=2.0, s=4), _dithered, "standard_dithering"),
    _op(lambda n: QSGD(s=16), _dithered, "qsgd"),
    _op(lambda n: TernGrad(), _dithered, "terngrad"),
    _op(lambda n: NaturalDithering(s=3), _dithered, "natural_dithering"),
    _op(lambda n: TopK(k=3), _top_k(3), "top_k"),
    _op(lambda n: TopK(k=3, values="natural"), _top_k_then, "top_k_natural_values"),
    _op(lambda n: RandK(k=3), _rand_k(3), "rand_k"),
    _op(lambda n: BiasedRandomSparsification(q=0.3), _subset, "biased_rand"),
    _op(lambda n: AdaptiveRandomSparsification(), _one_coordinate, "adaptive_rand"),
    _op(lambda n: NURand1(), _nu_rand, "nu_rand_1"),
    _op(lambda n: GradientSparsification(k=3), _rescaled_subset, "grad_spars"),
    _op(lambda n: TopKThen(NaturalDithering(s=2), k=3), _top_k_then, "top_k+natural_dithering"),
    _op(lambda n: InducedCompressor(TopK(k=3), RandK(k=3)), _induced, "induced"),
    _op(lambda n: Blockwise(TopK(k=2), _blocks(n)), _blockwise_top_k, "top_k/layerwise"),
    Case("eflops_gates", _gate_state, _equal),
]
CASE_IDS = [c.name for c in CASES]


# ---------------------------------------------------------------------------- properties
def _valid_message(case: Case, seed: int, numel: int) -> tuple[Any, Tensor, Message]:
    rng = np.random.default_rng(seed)
    codec, x = case.build(rng, numel)
    return codec, x, case.encode(codec, x, seed)


@functools.lru_cache(maxsize=4096)
def _template(case_index: int, seed: int, numel: int) -> tuple[Any, Message]:
    """A codec and one of its valid messages (cached: random-bytes inputs only need its shape and length)."""
    codec, _, msg = _valid_message(CASES[case_index], seed, numel)
    return codec, msg


def _rebuilt(msg: Message, bits: np.ndarray) -> Message:
    """``msg`` with its stream replaced by ``bits`` (MSB-first bits; payload padded with zeros)."""
    payload = np.packbits(bits).tobytes() if bits.size else b""
    return Message(payload=payload, num_bits=int(bits.size), codec=msg.codec, shape=msg.shape)


def _stream(msg: Message) -> np.ndarray:
    return np.unpackbits(np.frombuffer(msg.payload, dtype=np.uint8), count=msg.num_bits)


def assert_decodes_or_refuses(case: Case, codec: Any, msg: Message) -> None:
    """``msg`` decodes to a tensor the codec can produce, or raises MessageDecodeError (nothing else)."""
    try:
        out = msg.decode()
    except MessageDecodeError as err:
        text = str(err)
        assert text.startswith(f"{codec.name}: ") and text.endswith(".") and "\n" not in text, text
        return
    assert out.shape == torch.Size(msg.shape) and out.dtype == torch.float32
    if case.finite:
        assert bool(torch.isfinite(out).all()), f"{case.name} decoded a non-finite value"
    case.check_output(codec, out)


def random_bytes_property(case: Case, seed: int, numel: int, payload: bytes, drop: int, valid_length: bool) -> None:
    codec, msg = _template(CASES.index(case), seed % 17, numel)
    if valid_length:  # random bits of exactly the valid length: past the length checks
        rng = np.random.default_rng(seed + 1)
        bits = rng.integers(0, 2, msg.num_bits, dtype=np.uint8)
        assert_decodes_or_refuses(case, codec, _rebuilt(msg, bits))
        return
    num_bits = max(0, 8 * len(payload) - drop)
    bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=num_bits)
    assert_decodes_or_refuses(case, codec, _rebuilt(msg, bits))


def truncation_property(case: Case, seed: int, numel: int) -> None:
    codec, _, msg = _valid_message(case, seed, numel)
    bits = _stream(msg)
    for cut in range(msg.num_bits):
        assert_decodes_or_refuses(case, codec, _rebuilt(msg, bits[:cut]))


def bit_flip_property(case: Case, seed: int, numel: int, flips: list[int]) -> None:
    codec, _, msg = _valid_message(case, seed, numel)
    bits = _stream(msg)
    if bits.size == 0:
        return
    for f in flips:
        bits[f % bits.size] ^= 1
    assert_decodes_or_refuses(case, codec, _rebuilt(msg, bits))


def roundtrip_property(case: Case, seed: int, numel: int) -> None:
    codec, x, msg = _valid_message(case, seed, numel)
    out = msg.decode()
    assert out.shape == x.shape and out.dtype == torch.float32
    case.check_roundtrip(codec, x, out)


seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, MAX_NUMEL)
fast = settings(
    max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@fast
@given(seed=seeds, numel=sizes, payload=st.binary(max_size=64), drop=st.integers(0, 7), valid_length=st.booleans())
def test_random_bytes_decode_or_raise_message_decode_error(
    case: Case, seed: int, numel: int, payload: bytes, drop: int, valid_length: bool
) -> None:
    random_bytes_property(case, seed, numel, payload, drop, valid_length)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@settings(fast, max_examples=2)
@given(seed=seeds, numel=st.integers(1, 12))
def test_every_truncation_decodes_or_raises_message_decode_error(case: Case, seed: int, numel: int) -> None:
    truncation_property(case, seed, numel)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@settings(fast, max_examples=20)
@given(seed=seeds, numel=sizes, flips=st.lists(st.integers(0, 2**20), min_size=1, max_size=3))
def test_bit_flips_decode_or_raise_message_decode_error(case: Case, seed: int, numel: int, flips: list[int]) -> None:
    bit_flip_property(case, seed, numel, flips)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@settings(fast, max_examples=10)
@given(seed=seeds, numel=sizes)
def test_decode_of_encode_is_what_the_codec_promises(case: Case, seed: int, numel: int) -> None:
    roundtrip_property(case, seed, numel)


# The 10,000-input runs drive the same properties from a seeded NumPy stream: hypothesis's
# per-example overhead would make them take hours on a CI CPU. Reproduce a failure from the
# codec name and the seed in the assertion message.
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_ten_thousand_random_inputs_raise_only_message_decode_error(case: Case) -> None:
    rng = np.random.default_rng(20_261_201)
    for _ in range(10_000):
        seed, numel = int(rng.integers(2**32)), int(rng.integers(1, MAX_NUMEL + 1))
        payload, drop = rng.bytes(int(rng.integers(0, 65))), int(rng.integers(0, 8))
        valid_length = bool(rng.integers(2))
        try:
            random_bytes_property(case, seed, numel, payload, drop, valid_length)
        except Exception as err:  # name the input of any failure, not only a failed assertion
            raise AssertionError(f"{case.name}, seed={seed}, numel={numel}, payload={payload!r}: {err}") from err


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_all_truncations_of_two_hundred_messages_raise_only_message_decode_error(case: Case) -> None:
    rng = np.random.default_rng(20_261_202)
    for _ in range(200):
        seed, numel = int(rng.integers(2**32)), int(rng.integers(1, MAX_NUMEL + 1))
        try:
            truncation_property(case, seed, numel)
        except Exception as err:  # name the input of any failure, not only a failed assertion
            raise AssertionError(f"{case.name}, seed={seed}, numel={numel}: {err}") from err


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_thousand_bit_flipped_messages_raise_only_message_decode_error(case: Case) -> None:
    rng = np.random.default_rng(20_261_203)
    for _ in range(1_000):
        seed, numel = int(rng.integers(2**32)), int(rng.integers(1, MAX_NUMEL + 1))
        flips = rng.integers(0, 2**20, int(rng.integers(1, 4))).tolist()
        try:
            bit_flip_property(case, seed, numel, flips)
        except Exception as err:  # name the input of any failure, not only a failed assertion
            raise AssertionError(f"{case.name}, seed={seed}, numel={numel}, flips={flips}: {err}") from err


# ---------------------------------------------------------------------------- the measured failures
def test_rice_gaps_that_wrap_int64_are_refused() -> None:
    w = BitWriter()
    w.write_elias_gamma(3)  # k = 2
    w.write_bits(0, 1)  # Rice mode
    w.write_bits(63, 6)
    w.write_rice_array(np.array([5, 2**64 - 7], dtype=np.uint64), 63)  # p2 = 5 + gap + 1 wraps to -1
    payload, n = w.getvalue()
    with pytest.raises(MessageDecodeError, match=r"^position stream: a position gap of 18446744073709551609 reaches"):
        decode_positions(payload, n, dim=10)


def test_rice_quotient_that_overflows_64_bits_is_refused() -> None:
    w = BitWriter()
    w.write_elias_gamma(2)  # k = 1
    w.write_bits(0, 1)
    w.write_bits(62, 6)
    w.write_unary(4)  # quotient 4 << 62 does not fit in 64 bits
    w.write_bits(0, 62)
    payload, n = w.getvalue()
    with pytest.raises(MessageDecodeError, match="quotient of 4 overflows 64 bits with parameter 62"):
        decode_positions(payload, n, dim=10)


def test_bitpack_refuses_an_empty_payload_instead_of_reading_uninitialised_memory() -> None:
    codec = BitPackCodec()
    message = r"^bitpack: a mask of 20 coordinates takes 20 bits, this message has 0\.$"
    with pytest.raises(MessageDecodeError, match=message):
        codec.decode(Message(payload=b"", num_bits=0, codec=codec, shape=(20,)))


def test_lattice_refuses_a_header_k_of_zero() -> None:
    codec = LatticeCodec(levels=3)
    msg = codec.encode(torch.tensor([0.0, 1 / 3, 1.0]))
    payload = bytes(4) + msg.payload[4:]
    with pytest.raises(MessageDecodeError, match=r"^lattice: the header says K=0 but this codec has K=3\.$"):
        codec.decode(Message(payload=payload, num_bits=msg.num_bits, codec=codec, shape=(3,)))


def test_range_coder_refuses_a_truncated_stream_that_would_decode_to_a_wrong_mask() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.full((1000,), 0.3)
    codec = BernoulliRangeCodec(model_p=p)
    msg = codec.encode((torch.rand(1000, generator=g) < p).float())
    for words in range(msg.num_bits // 32):
        cut = Message(payload=msg.payload[: 4 * words], num_bits=32 * words, codec=codec, shape=(1000,))
        with pytest.raises(MessageDecodeError, match=r"^bernoulli_range: "):
            cut.decode()


def test_range_coder_refuses_a_nan_model_with_a_sentence_not_a_panic() -> None:
    with pytest.raises(ValueError, match="model p with 1 NaN entries; the probabilities diverged"):
        BernoulliRangeCodec(model_p=torch.tensor([float("nan"), 0.5]))


def test_message_with_a_payload_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(MessageDecodeError, match=r"^float32: a 64-bit stream takes 8 bytes but the payload holds 7"):
        Message(payload=bytes(7), num_bits=64, codec=Float32Codec(), shape=(2,))
    with pytest.raises(MessageDecodeError, match="non-negative integer"):
        Message(payload=b"", num_bits=-8, codec=Float32Codec(), shape=(0,))


def test_decoded_inf_from_a_finite_only_operator_is_refused() -> None:
    op = ExponentialRounding(base=2.0)
    msg = op.compress(torch.tensor([1.0, 2.0]))
    bits = np.zeros(26, dtype=np.uint8)
    bits[:16] = 1  # smallest exponent 2^15 - 1: the level 2^32767 is +inf in float32, which is never sent
    bits[16:22] = [0, 0, 0, 0, 0, 1]  # width 1
    bits[22:] = [0, 1, 0, 1]  # both coordinates at level k_min
    with pytest.raises(MessageDecodeError, match=r"the stream decodes to inf or NaN"):
        _rebuilt(msg, bits).decode()


def test_natural_escape_without_or_beyond_its_subnormal_power_is_refused() -> None:
    op = NaturalCompression()
    msg = op.compress(torch.tensor([1.0, 2.0]))
    escape = np.zeros(18, dtype=np.uint8)
    escape[1:9] = 1  # sign 0, exponent 0xFF: the subnormal escape, whose 5-bit power is missing
    with pytest.raises(MessageDecodeError, match=r"^natural: a read of 5 bits at bit 18 runs past the end"):
        _rebuilt(msg, escape).decode()
    beyond = np.concatenate([escape, np.ones(5, dtype=np.uint8)])  # power 31: 2^-118 is not subnormal
    with pytest.raises(MessageDecodeError, match=r"above 2\^-127"):
        _rebuilt(msg, beyond).decode()


@pytest.mark.parametrize(
    "encode",
    [
        lambda: TopK(k=1).compress(torch.tensor([1.0, float("nan")])),
        lambda: QSGD().compress(torch.tensor([float("inf"), 1.0])),
        lambda: NaturalCompression().compress(torch.tensor([float("nan")])),
        lambda: Sign().compress(torch.tensor([float("nan"), 1.0])),
        lambda: ScaledSign().compress(torch.tensor([float("inf")])),
        lambda: BitPackCodec().encode(torch.tensor([0.5])),
        lambda: LatticeCodec(levels=4).encode(torch.tensor([0.3])),
        lambda: BernoulliRangeCodec(model_p=torch.tensor([0.5])).encode(torch.tensor([2.0])),
    ],
    ids=[
        "top_k_nan",
        "qsgd_inf",
        "natural_nan",
        "sign_nan",
        "scaled_sign_inf",
        "bitpack_half",
        "lattice_off_grid",
        "range_non_binary",
    ],
)
def test_encoders_refuse_inputs_they_cannot_represent(encode: Callable[[], Message]) -> None:
    with pytest.raises(ValueError, match=r"\.$"):
        encode()


def _qsgd_stream_with_levels(levels: list[int], numel: int) -> Message:
    """A QSGD message of a unit norm whose first ``len(levels)`` coordinates carry the given Elias-coded levels."""
    from fedlightning.compression.index_coding import write_positions

    codec = QSGD(s=16)
    w = BitWriter()
    w.write_bits(int(np.array([1.0], dtype=np.float32).view(np.uint32)[0]), 31)  # the norm, float32 code
    write_positions(w, np.arange(len(levels), dtype=np.int64), numel)
    w.write_bitarray(np.zeros(len(levels), dtype=np.uint8))  # signs
    w.write_elias_gamma_array(np.array(levels, dtype=np.uint64))
    payload, n = w.getvalue()
    return Message(payload=payload, num_bits=n, codec=codec, shape=(numel,))


@pytest.mark.parametrize("level", [2**63, 2**63 + 1, 2**64 - 18, 2**64 - 17, 2**64 - 2, 2**64 - 1, 17, 2**40])
def test_qsgd_levels_too_large_for_the_table_are_refused_not_wrapped(level: int) -> None:
    message = _qsgd_stream_with_levels([3, level], numel=4)
    with pytest.raises(MessageDecodeError, match=rf"^qsgd\(p=2,s=16\): a level decodes to {level}, above s=16\.$"):
        message.decode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(st.integers(1, 16), st.integers(17, 2**64 - 1), st.integers(2**63, 2**64 - 1)),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 4),
)
def test_qsgd_decodes_elias_levels_in_range_and_refuses_every_other(levels: list[int], extra: int) -> None:
    message = _qsgd_stream_with_levels(levels, numel=len(levels) + extra)
    if max(levels) > 16:
        with pytest.raises(MessageDecodeError, match=rf"a level decodes to {max(levels)}, above s=16"):
            message.decode()
    else:
        out = message.decode().numpy()
        expected = np.array(levels, dtype=np.float64) / 16  # standard levels j/s of a unit norm
        np.testing.assert_allclose(out[: len(levels)], expected, rtol=1e-6)
        assert not out[len(levels) :].any()
