"""Hard-concrete gates: Louizos et al. constants, closed forms against sampling."""

from __future__ import annotations

import math

import pytest
import torch

from fedlightning.models.hard_concrete import (
    BETA,
    GAMMA,
    LOG_ALPHA_RANGE,
    ZETA,
    HardConcrete,
    bernoulli_kl,
    expected_gate,
    log_alpha_from_prob_nonzero,
    prob_nonzero,
    sample_gate,
    uniform_noise,
)
from fedlightning.models.hard_concrete import (
    test_gate as hc_test_gate,
)


def test_constants_match_louizos_code() -> None:
    assert (BETA, GAMMA, ZETA) == (2.0 / 3.0, -0.1, 1.1)
    assert pytest.approx((-4.60517, 4.60517), abs=1e-5) == LOG_ALPHA_RANGE


@pytest.mark.parametrize(
    ("log_alpha", "expected"),
    [(0.0, 0.832), (math.log(4), 0.952), (-math.log(100), 0.047), (math.log(100), 0.998)],
)
def test_prob_nonzero_hand_values(log_alpha: float, expected: float) -> None:
    # sigmoid(log α − (2/3) log(0.1/1.1)) = sigmoid(log α + 1.5986)
    assert float(prob_nonzero(torch.tensor(log_alpha))) == pytest.approx(expected, abs=1e-3)


def test_prob_nonzero_matches_sampling() -> None:
    gen = torch.Generator().manual_seed(0)
    log_alpha = torch.tensor([-3.0, -1.0, 0.0, 2.0])
    u = uniform_noise((200_000, 4), gen)
    z = sample_gate(log_alpha, u)
    freq = (z > 0).float().mean(0)
    # binomial sd <= sqrt(0.25 / 2e5) ≈ 1.1e-3; 5 sd
    torch.testing.assert_close(freq, prob_nonzero(log_alpha), atol=6e-3, rtol=0)
    torch.testing.assert_close(z.mean(0), expected_gate(log_alpha, nodes=4000), atol=6e-3, rtol=0)


def test_test_gate_hand_values() -> None:
    assert float(hc_test_gate(torch.tensor(0.0))) == 0.5  # 0.5 * 1.2 - 0.1
    # exactly zero iff sigmoid(log α) <= 1/12, i.e. log α <= -log 11
    assert float(hc_test_gate(torch.tensor(-math.log(11) - 1e-3))) == 0.0
    assert float(hc_test_gate(torch.tensor(-math.log(11) + 1e-2))) > 0.0
    assert float(hc_test_gate(torch.tensor(5.0))) == 1.0


def test_sample_gate_is_differentiable_and_clipped() -> None:
    log_alpha = torch.zeros(3, requires_grad=True)
    z = sample_gate(log_alpha, torch.tensor([1e-6, 0.5, 1 - 1e-6]))
    assert z.tolist() == [0.0, 0.5, 1.0]
    z.sum().backward()
    assert log_alpha.grad is not None and log_alpha.grad.tolist()[0] == 0.0 and log_alpha.grad.tolist()[1] > 0


def test_inverse_and_clamp() -> None:
    p = torch.tensor([0.01, 0.3, 0.9])
    torch.testing.assert_close(prob_nonzero(log_alpha_from_prob_nonzero(p)), p)
    hc = HardConcrete()
    assert hc.min_prob_nonzero == pytest.approx(0.0474, abs=1e-3)  # Louizos' clamp cannot reach rho < 0.047
    assert HardConcrete(log_alpha_min=-10.0).min_prob_nonzero < 1e-3
    x = torch.tensor([-20.0, 0.0, 20.0])
    hc.clamp_(x)
    assert x.tolist() == pytest.approx([LOG_ALPHA_RANGE[0], 0.0, LOG_ALPHA_RANGE[1]])
    with pytest.raises(ValueError, match="log_alpha_min"):
        HardConcrete(log_alpha_min=1.0, log_alpha_max=0.0)


def test_bernoulli_kl_hand_values() -> None:
    assert float(bernoulli_kl(torch.tensor(0.5), 0.5)) == pytest.approx(0.0, abs=1e-7)
    expected = 0.2 * math.log(0.2 / 0.1) + 0.8 * math.log(0.8 / 0.9)
    assert float(bernoulli_kl(torch.tensor(0.2), 0.1)) == pytest.approx(expected, rel=1e-5)
    # uniform prior: KL = log 2 − H(q)
    q = torch.tensor(0.3)
    h = -(0.3 * math.log(0.3) + 0.7 * math.log(0.7))
    assert float(bernoulli_kl(q, 0.5)) == pytest.approx(math.log(2) - h, rel=1e-5)
