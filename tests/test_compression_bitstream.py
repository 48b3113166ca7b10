"""Bitstream codes, index coding and the sparse codec: exact round trips and exact lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlightning.compression.bitstream import (
    BitReader,
    BitWriter,
    _bit_length,
    elias_delta_length,
    elias_gamma_length,
    rice_length,
)
from fedlightning.compression.index_coding import (
    SparseCodec,
    decode_positions,
    encode_positions,
    log2_binomial,
    position_header_bits,
)
from fedlightning.errors import MessageDecodeError


def test_scalar_and_array_codes_round_trip_with_exact_lengths() -> None:
    values = np.concatenate([np.arange(1, 2000), [2**31 - 1, 2**40 + 3, 2**62 + 5]]).astype(np.uint64)
    w = BitWriter()
    w.write_elias_gamma_array(values)
    w.write_elias_delta_array(values)
    w.write_rice_array(values[:500], 4)
    for v in values[:50].tolist():
        w.write_elias_gamma(v)
        w.write_elias_delta(v)
        w.write_rice(v, 3)
        w.write_bits(v, 64)
    w.write_array(values[:100], 63)
    payload, n = w.getvalue()
    expected = (
        sum(elias_gamma_length(int(v)) + elias_delta_length(int(v)) for v in values)
        + sum(rice_length(int(v), 4) for v in values[:500])
        + sum(elias_gamma_length(v) + elias_delta_length(v) + rice_length(v, 3) + 64 for v in values[:50].tolist())
        + 63 * 100
    )
    assert n == expected
    assert len(payload) == (n + 7) // 8
    r = BitReader(payload, n)
    assert np.array_equal(r.read_elias_gamma_array(values.size), values)
    assert np.array_equal(r.read_elias_delta_array(values.size), values)
    assert np.array_equal(r.read_rice_array(500, 4), values[:500])
    for v in values[:50].tolist():
        assert (r.read_elias_gamma(), r.read_elias_delta(), r.read_rice(3), r.read_bits(64)) == (v, v, v, v)
    assert np.array_equal(r.read_array(100, 63), values[:100])
    assert r.remaining == 0
    with pytest.raises(ValueError):
        r.read_bits(1)


def test_known_code_words() -> None:
    w = BitWriter()
    w.write_elias_gamma(4)  # 00100
    w.write_elias_delta(10)  # gamma(4)=00100, then 010
    w.write_rice(9, 2)  # q=2 -> 110, r=01
    payload, n = w.getvalue()
    bits = "".join(str(b) for b in np.unpackbits(np.frombuffer(payload, dtype=np.uint8))[:n])
    assert bits == "00100" + "00100010" + "11001"


def test_writer_rejects_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError):
        BitWriter().write_bits(8, 3)
    with pytest.raises(ValueError):
        BitWriter().write_elias_gamma(0)


@pytest.mark.parametrize(
    ("dim", "k"),
    [
        (1, 0),
        (1, 1),
        (10, 10),
        (1000, 1),
        (100_000, 100),
        (100_000, 1000),
        (266_610, 2666),
        (100_000, 25_000),
        (100_000, 60_000),
    ],
)
def test_positions_round_trip_and_stay_near_the_bound(dim: int, k: int) -> None:
    gen = torch.Generator().manual_seed(dim + k)
    positions = torch.randperm(dim, generator=gen)[:k].sort().values
    payload, n = encode_positions(positions, dim)
    assert torch.equal(decode_positions(payload, n, dim), positions)
    bound = log2_binomial(dim, k)
    if k >= 100 and k <= dim // 4:
        # Rice on near-geometric gaps: within 3 % of log2 C(d, k) plus the declared header
        assert n <= 1.03 * bound + position_header_bits(k)
    assert n <= dim + position_header_bits(k, mode_is_bitmap=True)  # never worse than a bitmap


def test_log2_binomial_values() -> None:
    assert log2_binomial(10, 0) == pytest.approx(0.0, abs=1e-9)
    assert log2_binomial(10, 3) == pytest.approx(np.log2(120))
    assert log2_binomial(4, 2) == pytest.approx(np.log2(6))


def test_positions_must_be_sorted_and_in_range() -> None:
    with pytest.raises(ValueError):
        encode_positions(torch.tensor([3, 2]), 10)
    with pytest.raises(ValueError):
        encode_positions(torch.tensor([10]), 10)


@pytest.mark.parametrize("values", ["float32", "float16", "bfloat16", "int8", "natural"])
def test_sparse_codec_round_trip_and_bits(values: str) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.zeros(5000)
    idx = torch.randperm(5000, generator=gen)[:50]
    x[idx] = torch.randn(50, generator=gen)
    codec = SparseCodec(value_codec=values)
    message = codec.encode(x)
    y = message.decode()
    assert y.shape == x.shape
    assert torch.all(y[x == 0] == 0)
    expected = codec.values.roundtrip(x[x != 0].numpy())
    assert np.array_equal(y[x != 0].numpy(), expected)
    _, pos_bits = encode_positions(torch.nonzero(x).reshape(-1), 5000)
    assert message.num_bits == pos_bits + codec.values.bits(50)
    if values == "float32":
        assert torch.equal(y, x)
    # the message is decodable from its bytes alone: re-encode of the decoded tensor is identical
    if values != "int8":  # int8 may round a small value to zero
        assert codec.encode(y).payload == message.payload


def test_sparse_codec_of_all_zero_tensor_is_one_bit() -> None:
    message = SparseCodec().encode(torch.zeros(3, 4))
    assert message.num_bits == 1
    assert torch.equal(message.decode(), torch.zeros(3, 4))


@pytest.mark.parametrize("values", [[2**32], [2**33, 5], [1, 2**63, 2**64 - 1], [2**40, 2**40 + 1, 7]])
def test_elias_gamma_codes_wider_than_64_bits_round_trip(values: list[int]) -> None:
    w = BitWriter()
    w.write_elias_gamma_array(np.array(values, dtype=np.uint64))
    payload, n = w.getvalue()
    assert n == sum(2 * v.bit_length() - 1 for v in values)
    r = BitReader(payload, n)
    assert r.read_elias_gamma_array(len(values)).tolist() == values and r.remaining == 0


def _gamma_reads(reader: BitReader, count: int, *, array: bool) -> tuple[list[int], int] | str:
    """The values and the reader's position after reading ``count`` gamma codes, or ``"refused"``."""
    try:
        if array:
            values = reader.read_elias_gamma_array(count).tolist()
        else:
            values = [reader.read_elias_gamma() for _ in range(count)]
    except MessageDecodeError:
        return "refused"
    return values, reader.position


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.integers(1, 40), st.integers(1, 2**64 - 1)), max_size=30),
    skip=st.integers(0, 9),
    cut=st.integers(0, 40),
    extra=st.integers(0, 3),
    noise=st.binary(max_size=24),
)
def test_the_gamma_array_reader_reads_every_stream_as_the_scalar_reader(
    values: list[int], skip: int, cut: int, extra: int, noise: bytes
) -> None:
    w = BitWriter()
    w.write_bits(0b101101101 & ((1 << skip) - 1), skip)
    w.write_elias_gamma_array(np.array(values, dtype=np.uint64))
    w.write_bitarray(np.unpackbits(np.frombuffer(noise, dtype=np.uint8)))
    payload, n = w.getvalue()
    n = max(skip, n - cut)  # a stream cut short, or codes followed by arbitrary bits
    count = len(values) + extra
    outcomes = []
    for array in (True, False):
        reader = BitReader(payload, n, codec="test")
        reader.read_bits(skip)
        outcomes.append(_gamma_reads(reader, count, array=array))
    assert outcomes[0] == outcomes[1]


def _rice_reads(reader: BitReader, count: int, b: int, *, array: bool) -> tuple[list[int], int] | str:
    """The values and the reader's position after reading ``count`` Golomb–Rice codes, or ``"refused"``."""
    try:
        values = reader.read_rice_array(count, b).tolist() if array else [reader.read_rice(b) for _ in range(count)]
    except MessageDecodeError:
        return "refused"
    return values, reader.position


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(0, 300), max_size=30),
    b=st.integers(0, 6),
    skip=st.integers(0, 9),
    cut=st.integers(0, 40),
    extra=st.integers(0, 3),
    noise=st.binary(max_size=24),
)
def test_the_rice_array_reader_reads_every_stream_as_the_scalar_reader(
    values: list[int], b: int, skip: int, cut: int, extra: int, noise: bytes
) -> None:
    w = BitWriter()
    w.write_bits(0b101101101 & ((1 << skip) - 1), skip)
    w.write_rice_array(np.array(values, dtype=np.uint64), b)
    w.write_bitarray(np.unpackbits(np.frombuffer(noise, dtype=np.uint8)))
    payload, n = w.getvalue()
    n = max(skip, n - cut)
    count = len(values) + extra
    outcomes = []
    for array in (True, False):
        reader = BitReader(payload, n, codec="test")
        reader.read_bits(skip)
        outcomes.append(_rice_reads(reader, count, b, array=array))
    assert outcomes[0] == outcomes[1]


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1, 64), data=st.data())
def test_fixed_width_fields_are_written_most_significant_bit_first_in_exactly_their_width_and_read_back(
    width: int, data: st.DataObject
) -> None:
    values = data.draw(st.lists(st.integers(0, 2**width - 1), min_size=1, max_size=20))
    w = BitWriter()
    w.write_array(np.array(values, dtype=np.uint64), width)
    payload, n = w.getvalue()
    expected = "".join(format(v, f"0{width}b") for v in values)
    assert n == len(expected)
    assert "".join(map(str, np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=n))) == expected
    assert BitReader(payload, n).read_array(len(values), width).tolist() == values


@settings(max_examples=200, deadline=None)
@given(b=st.integers(0, 8), values=st.lists(st.integers(0, 2000), min_size=1, max_size=20))
def test_rice_codes_are_the_quotient_in_unary_a_zero_then_b_remainder_bits(b: int, values: list[int]) -> None:
    w = BitWriter()
    w.write_rice_array(np.array(values, dtype=np.uint64), b)
    payload, n = w.getvalue()
    expected = "".join("1" * (v >> b) + "0" + (format(v & ((1 << b) - 1), f"0{b}b") if b else "") for v in values)
    assert n == len(expected) == sum(rice_length(v, b) for v in values)
    assert "".join(map(str, np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=n))) == expected


_EDGES = [0, 1, 2, 3, 2**52, 2**53 - 1, 2**53, 2**53 + 1, 2**54 - 1, 2**63 - 1, 2**63, 2**64 - 1]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.sampled_from(_EDGES), st.integers(0, 2**64 - 1)), min_size=1, max_size=40))
def test_bit_lengths_of_64_bit_values_are_python_int_bit_lengths(values: list[int]) -> None:
    assert _bit_length(np.array(values, dtype=np.uint64)).tolist() == [v.bit_length() for v in values]


@pytest.mark.parametrize("width", [0, 1, 7, 53, 63, 64])
def test_a_value_one_bit_too_wide_for_its_field_is_refused_and_the_widest_that_fits_is_written(width: int) -> None:
    widest = (1 << width) - 1
    w = BitWriter()
    w.write_array(np.array([widest], dtype=np.uint64), width)
    assert w.num_bits == width
    if width < 64:
        with pytest.raises(ValueError, match="does not fit"):
            BitWriter().write_array(np.array([widest + 1], dtype=np.uint64), width)
