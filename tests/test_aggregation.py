"""Aggregation and server-optimiser maths on hand-computed examples."""

from __future__ import annotations

import pytest
import torch

from fedlightning.federated import aggregation as agg
from fedlightning.federated.aggregators import FOLD_BLOCK, WeightedMean, fold_, participation_weights
from fedlightning.federated.server_optim import FedOpt


def test_normalised_participation_weights_are_sample_shares() -> None:
    weights = participation_weights(torch.tensor([100.0, 300.0]), torch.ones(2), "normalised")
    assert weights.tolist() == [0.25, 0.75]
    with pytest.raises(ValueError, match="zero weight"):
        participation_weights(torch.tensor([0.0, 0.0]), torch.ones(2), "normalised")


def test_weighted_mean_on_a_2x3_example() -> None:
    mean = WeightedMean(dim=3, normalise=True)
    # (1*[1,2,3] + 2*[4,5,6]) / 3 = [3, 4, 5]
    mean.accumulate(torch.tensor([1.0, 2.0, 3.0]), weight=1.0)
    mean.accumulate(torch.tensor([4.0, 5.0, 6.0]), weight=2.0)
    assert mean.result().tolist() == [3.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="dimension 3"):
        mean.accumulate(torch.tensor([1.0]), weight=1.0)


def test_fold_by_blocks_gives_the_bits_of_one_add() -> None:
    n = 3 * FOLD_BLOCK + 123  # several blocks and a ragged last one
    gen = torch.Generator().manual_seed(0)
    blocked, whole = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for k, scale in enumerate((1e-7, 1.0, 3e4, 1e-3)):
        for dtype in (torch.float32, torch.float64):
            x = (torch.randn(n, generator=gen) * scale).to(dtype)
            fold_(blocked, x, weight=1.0 / (k + 3))  # weights with no exact binary expansion
            whole.add_(x, alpha=1.0 / (k + 3))
    assert torch.equal(blocked, whole) and bool(blocked.abs().sum() > 0)


def test_weighted_mean_reduces_two_shares_to_the_whole() -> None:
    uploads = [torch.tensor([1.0, -1.0]), torch.tensor([3.0, 0.5]), torch.tensor([-2.0, 4.0])]
    whole, first, second = (WeightedMean(dim=2, normalise=True) for _ in range(3))
    for k, x in enumerate(uploads):
        whole.accumulate(x, weight=k + 1.0)
        (first if k < 2 else second).accumulate(x, weight=k + 1.0)
    first.all_reduce(lambda t: t + second.packed())
    assert first.count == 3 and torch.equal(first.result(), whole.result())


def test_all_reduce_sums_the_round_statistics_in_the_same_collective() -> None:
    first, second = WeightedMean(dim=2, normalise=True), WeightedMean(dim=2, normalise=True)
    first.accumulate(torch.tensor([1.0, 2.0]), weight=1.0)
    second.accumulate(torch.tensor([4.0, -2.0]), weight=3.0)
    collectives: list[torch.Tensor] = []

    def reduce(packed: torch.Tensor) -> torch.Tensor:
        collectives.append(packed)
        return packed + second.packed(torch.tensor([0.5, 7.0], dtype=torch.float64))

    stats = first.all_reduce(reduce, alongside=torch.tensor([0.25, 1.0], dtype=torch.float64))
    assert len(collectives) == 1 and collectives[0].tolist() == [1.0, 2.0, 1.0, 1.0, 0.25, 1.0]
    assert stats.tolist() == [0.75, 8.0]
    # (1·[1, 2] + 3·[4, −2]) / 4 = [3.25, −1]
    assert first.count == 2 and first.result().tolist() == [3.25, -1.0]
    assert first.all_reduce(lambda t: t).numel() == 0  # nothing alongside: nothing back


def test_fedopt_moments_by_hand() -> None:
    delta = torch.tensor([2.0, -1.0])
    m = agg.fedopt_first_moment(torch.tensor([1.0, 1.0]), delta, beta1=0.5)
    assert m.tolist() == [1.5, 0.0]
    assert agg.fedadagrad_second_moment(torch.tensor([1.0, 1.0]), delta).tolist() == [5.0, 2.0]
    assert agg.fedadam_second_moment(torch.tensor([1.0, 1.0]), delta, beta2=0.5).tolist() == [2.5, 1.0]
    # Yogi: v - (1-b2) d^2 sign(v - d^2): [1 - .5*4*sign(-3), 1 - .5*1*sign(0)] = [3, 1]
    assert agg.fedyogi_second_moment(torch.tensor([1.0, 1.0]), delta, beta2=0.5).tolist() == [3.0, 1.0]
    # x + lr m / (sqrt(v) + tau) = 1 + 0.1 * 1.5 / (2 + 1) = 1.05
    step = agg.fedopt_step(torch.tensor([1.0]), torch.tensor([1.5]), torch.tensor([4.0]), lr=0.1, tau=1.0)
    assert step.tolist() == pytest.approx([1.05])


@pytest.mark.parametrize("variant", ["adam", "yogi", "adagrad"])
def test_fedopt_optimizer_first_step_matches_the_formulas(variant: str) -> None:
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    delta = torch.tensor([0.5, 0.25])
    opt = FedOpt([x], variant=variant, lr=0.1, betas=(0.9, 0.99), tau=1e-3)  # type: ignore[arg-type]
    x.grad = -delta
    opt.step()
    v0 = torch.full((2,), 1e-6)
    m = 0.1 * delta
    v = {
        "adam": 0.99 * v0 + 0.01 * delta**2,
        "yogi": v0 - 0.01 * delta**2 * torch.sign(v0 - delta**2),
        "adagrad": v0 + delta**2,
    }[variant]
    expected = torch.tensor([1.0, -2.0]) + 0.1 * m / (v.sqrt() + 1e-3)
    assert torch.allclose(x.detach(), expected)


def test_fedopt_rejects_unknown_variant() -> None:
    with pytest.raises(ValueError, match="variant"):
        FedOpt([torch.nn.Parameter(torch.zeros(1))], variant="adamw")  # type: ignore[arg-type]
