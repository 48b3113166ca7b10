"""Range coding of Bernoulli masks and the lossless lattice codec."""

from __future__ import annotations

import pytest
import torch

from fedlightning.compression.arithmetic import (
    BernoulliRangeCodec,
    LatticeCodec,
    bernoulli_cross_entropy_bits,
    lattice_bits_per_coordinate,
)


def _polarised(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A p like Federated Zampling's after a few rounds: many 0/1, the rest on the 1/10 lattice."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randint(0, 11, (n,), generator=gen).float() / 10
    p = torch.where(torch.rand(n, generator=gen) < 0.6, torch.round(p), p)
    return p, torch.bernoulli(p, generator=gen)


@pytest.mark.parametrize("seed", [0, 1])
def test_range_coding_is_lossless_and_near_the_cross_entropy(seed: int) -> None:
    p, z = _polarised(50_000, seed)
    message = BernoulliRangeCodec(model_p=p).encode(z)
    assert torch.equal(message.decode(), z)
    bound = bernoulli_cross_entropy_bits(z, p)
    assert bound < 0.5 * z.numel()  # the model does help
    assert message.num_bits <= 1.05 * bound + 64  # within 5% of the bound, plus a fixed header


def test_range_coding_of_uniform_masks_costs_about_one_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.full((20_000,), 0.5)
    z = torch.bernoulli(p, generator=gen)
    message = BernoulliRangeCodec(model_p=p).encode(z)
    assert torch.equal(message.decode(), z)
    assert 20_000 <= message.num_bits <= 20_000 + 64


def test_impossible_bits_are_still_coded() -> None:
    p = torch.tensor([0.0, 1.0, 0.5])
    z = torch.tensor([1.0, 0.0, 1.0])  # both "impossible" under p
    assert torch.equal(BernoulliRangeCodec(model_p=p).encode(z).decode(), z)


def test_range_codec_rejects_non_binary() -> None:
    with pytest.raises(ValueError, match="binary"):
        BernoulliRangeCodec(model_p=torch.full((2,), 0.5)).encode(torch.tensor([0.5, 1.0]))


def test_cross_entropy_by_hand() -> None:
    # -log2(0.5) - log2(1 - 0.75) = 1 + 2
    assert bernoulli_cross_entropy_bits(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.75])) == 3.0


@pytest.mark.parametrize("levels", [1, 3, 10, 16, 100])
def test_lattice_codec_is_exact_and_counts_bits(levels: int) -> None:
    gen = torch.Generator().manual_seed(levels)
    k = torch.randint(0, levels + 1, (1001,), generator=gen)
    p = (k.float() / levels).reshape(7, 143)
    message = LatticeCodec(levels=levels).encode(p)
    assert message.num_bits == 32 + 1001 * lattice_bits_per_coordinate(levels)
    assert message.header_bits == 32
    assert torch.equal(message.decode(), p)


def test_lattice_codec_refuses_values_off_the_lattice() -> None:
    with pytest.raises(ValueError, match="multiples of 1/10"):
        LatticeCodec(levels=10).encode(torch.tensor([0.25]))
    with pytest.raises(ValueError, match="multiples"):
        LatticeCodec(levels=10).encode(torch.tensor([1.1]))


def test_lattice_bits_by_hand() -> None:
    assert [lattice_bits_per_coordinate(k) for k in (1, 2, 3, 4, 7, 8, 10, 100)] == [1, 2, 2, 3, 3, 4, 4, 7]
