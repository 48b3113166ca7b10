"""E-FLoPS: wire format, server rebuild, end-to-end Golub run with exact bits both ways."""

from __future__ import annotations

import csv
import json
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlightning.compression.index_coding import encode_positions
from fedlightning.errors import ConfigError
from fedlightning.methods.eflops import (
    EFLoPS,
    GateMessageCodec,
    aggregate_gated_uploads,
    expand_groups,
    gated_top_m,
    off_support_means,
    pack_gate_state,
    unpack_gate_state,
)
from fedlightning.models.hard_concrete import (
    expected_gate,
    expected_gate_tail,
    gate_survival,
    prob_nonzero,
    test_gate,
)
from fedlightning.run import run


def test_codec_roundtrip_and_exact_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    dim = 1000
    support = torch.zeros(dim, dtype=torch.bool)
    support[torch.randperm(dim, generator=gen)[:20]] = True
    theta = torch.randn(dim, generator=gen)
    pi = torch.rand(dim, generator=gen) * 0.9 + 0.05
    x = pack_gate_state(theta, pi, support, 0.7)
    msg = GateMessageCodec().encode(x)
    assert torch.equal(msg.decode(), x)
    _, pos_bits = encode_positions(torch.nonzero(support).reshape(-1), dim)
    assert msg.num_bits == pos_bits + 20 * 64 + 32  # positions + (theta, pi) float32 + lambda
    _, _, s, _, lam = unpack_gate_state(msg.decode())
    assert torch.equal(s, support) and float(lam) == pytest.approx(0.7)


def test_codec_with_off_support_statistics_counts_32_bits_each() -> None:
    gen = torch.Generator().manual_seed(1)
    dim, sizes = 100, [60, 30, 10]
    support = torch.zeros(dim, dtype=torch.bool)
    support[torch.randperm(dim, generator=gen)[:5]] = True
    theta, pi = torch.randn(dim, generator=gen), torch.rand(dim, generator=gen) * 0.9 + 0.05
    pi_off = off_support_means(pi, support, sizes, fallback=0.0)
    x = pack_gate_state(theta, pi, support, -0.3, pi_off)
    msg = GateMessageCodec(num_groups=3).encode(x)
    assert torch.equal(msg.decode(), x)
    _, pos_bits = encode_positions(torch.nonzero(support).reshape(-1), dim)
    assert msg.num_bits == pos_bits + 5 * 64 + 3 * 32 + 32  # + one float32 per parameter tensor
    _, _, s, off, lam = unpack_gate_state(msg.decode(), 3)
    assert torch.equal(s, support) and torch.allclose(off, pi_off) and float(lam) == pytest.approx(-0.3)


def test_off_support_statistics_hand_example() -> None:
    pi = torch.tensor([0.9, 0.1, 0.3, 0.8, 0.2])
    support = torch.tensor([True, False, False, True, True])
    assert off_support_means(pi, support, [3, 2], 0.5).tolist() == pytest.approx([0.2, 0.5])
    assert expand_groups(torch.tensor([0.2, 0.5]), [3, 2]).tolist() == pytest.approx([0.2, 0.2, 0.2, 0.5, 0.5])


def test_server_rebuild_hand_example() -> None:
    thetas = torch.tensor([[1.0, 0.0, 3.0], [3.0, 5.0, 0.0]])
    pis = torch.tensor([[0.5, 0.0, 0.9], [0.7, 0.8, 0.0]])
    theta, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.5, 0.5]), pi_unsent=0.1)
    assert theta.tolist() == [2.0, 5.0, 3.0]  # mean over the senders only
    assert pi.tolist() == pytest.approx([0.6, 0.45, 0.5])  # non-senders count as pi_unsent
    fill = torch.tensor([[0.1], [0.3]])  # each client's own off-support statistic
    _, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.5, 0.5]), fill)
    assert pi.tolist() == pytest.approx([0.6, 0.45, 0.6])
    _, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.25, 0.75]), fill, senders_only=True)
    assert pi.tolist() == pytest.approx([0.65, 0.8, 0.9])  # like theta: mean over the senders


def test_expected_gate_tail_is_positive_and_accurate() -> None:
    log_alpha = torch.tensor([-10.0, -5.0, -2.4, 0.0, 2.0, 5.0, 10.0], dtype=torch.float64)
    assert torch.allclose(gate_survival(0.0, log_alpha), prob_nonzero(log_alpha))  # P(z > 0) = P(z != 0)
    assert float(expected_gate_tail(torch.tensor(0.0), nodes=4)) == 0.5  # symmetric at log alpha = 0
    tail = expected_gate_tail(log_alpha, nodes=32)
    reference = expected_gate(log_alpha, nodes=200_000)  # fine midpoint rule over u
    assert torch.allclose(tail, reference, rtol=0.03, atol=1e-6)
    # where the test-time gate (and the coarse u rule) is exactly 0, E[z] is still positive
    assert float(test_gate(log_alpha[2])) == 0.0 and float(expected_gate(log_alpha[0], nodes=32)) == 0.0
    assert bool((tail > 0).all()) and bool((tail <= prob_nonzero(log_alpha)).all())  # E[z] <= P(z != 0)


def test_gated_top_m_hand_example() -> None:
    # |theta * g| = [1.8, 0.3, 0.4, 0.5]: the two largest are coordinates 0 and 3
    out = gated_top_m(torch.tensor([2.0, -3.0, 0.5, 1.0]), torch.tensor([0.9, 0.1, 0.8, 0.5]), 2)
    assert out.tolist() == pytest.approx([1.8, 0.0, 0.0, 0.5])


@pytest.mark.parametrize(("final_support", "nonzero"), [("top_m", 2), ("test_gate", 1)])
def test_final_support_hand_example(final_support: str, nonzero: int) -> None:
    """|theta| = 4, rho = 0.5: m = 2; coordinate 0 has a huge theta but P(z != 0) = 2.2e-4 < 0.31.

    Scores |theta| P(z != 0) = [22.4, 0.83, 1.66, 0.42] and |theta E[z]| = [6.1, 0.5, 1.0, 0.25]
    both pick S = {0, 2}; the test-time gate is z_hat = [0, 0.5, 0.5, 0.5], so the old rule
    zeroes coordinate 0 of its own support, while top_m keeps theta_0 E[z_0] > 0.
    """
    module = EFLoPS(
        density=0.5,
        model=nn.Linear(3, 1),
        datamodule=types.SimpleNamespace(task="regression"),
        selection="expected_magnitude",
        final_support=final_support,  # type: ignore[arg-type]
    )
    assert module.m == 2
    theta, log_alpha = torch.tensor([1e5, -1.0, 2.0, 0.5]), torch.tensor([-10.0, 0.0, 0.0, 0.0])
    out = module.final_parameters(theta, log_alpha)
    assert int(torch.count_nonzero(out)) == nonzero
    assert float(out[2]) == 1.0 and float(out[1]) == 0.0 and float(out[3]) == 0.0  # 2 * E[z] = 2 * 0.5
    if final_support == "top_m":
        assert 0 < float(out[0]) / 1e5 < float(prob_nonzero(log_alpha[0]))
    else:
        assert float(out[0]) == 0.0


def test_rejects_unknown_final_support() -> None:
    with pytest.raises(ConfigError, match=r"method\.final_support"):
        EFLoPS(
            density=0.5,
            model=nn.Linear(3, 1),
            datamodule=types.SimpleNamespace(task="regression"),
            final_support="median",  # type: ignore[arg-type]
        )


@pytest.fixture
def golub_cfg(make_config: Callable[..., object], shared_data_root: Path) -> Callable[..., object]:
    def build(*overrides: str) -> object:
        return make_config(["+experiment=golub_eflops_quick", f"data.root={shared_data_root}", *overrides])

    return build


def test_golub_quick_run(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    summary = run(golub_cfg("rounds=3"), tmp_path)  # type: ignore[arg-type]
    dim, m = 2 * 3571 + 2, int(0.02 * (2 * 3571 + 2))
    # final_support=top_m: the evaluated model keeps exactly the m communicated coordinates
    assert summary["model/nonzero"] == m and summary["model/density"] == pytest.approx(m / dim)
    assert summary["model/macs"] <= summary["model/nonzero"] and summary["model/macs_dense"] == 2 * 3571
    assert summary["test/acc"] is not None
    # every message is sparse: far below dense float32, both directions
    assert summary["comm/uplink_compression"] > 10 and summary["comm/downlink_compression"] > 10
    rows = list(csv.DictReader((tmp_path / "comm_records.csv").open()))
    assert {r["direction"] for r in rows} == {"up", "down"}
    assert all(int(r["bits"]) <= m * 64 + 32 + 20 * m + 64 for r in rows)
    selected = json.loads((tmp_path / "selected_features.json").read_text())
    assert selected["num_selected"] >= 1 and "probe_id" in selected["features"][0]


def test_rejects_bad_config(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"method\.density"):
        run(golub_cfg("method.density=0"), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="server_optimizer"):
        run(golub_cfg("rounds=1", "method.server_optimizer.lr=0.5"), tmp_path / "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"method\.prior"):
        run(golub_cfg("method.prior=laplace"), tmp_path / "c")  # type: ignore[arg-type]


def test_density_estimators_and_priors_run(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    summary = run(
        golub_cfg(
            "rounds=1",
            "method.density_estimator=expected_gate",
            "method.prior=uniform",
            "method.quadrature_nodes=8",
            "method.off_support=zero",
        ),
        tmp_path,
    )  # type: ignore[arg-type]
    assert summary["model/density"] <= 0.02


def test_golub_density_reaches_target(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    """After the full 30 rounds the evaluated model is within the issue's 10% band of rho.

    With ``final_support=top_m`` it keeps exactly m = 142 non-zeros (m/|theta| = 0.01988);
    the old ``test_gate`` rule kept 0.0172 on average over 30 seeds (129 of 142 on seed 0).
    """
    rho, dim = 0.02, 2 * 3571 + 2
    m = int(rho * dim)
    for seed in (0, 1):
        summary = run(golub_cfg("rounds=30", f"seed={seed}", "eval_every=1000"), tmp_path / str(seed))  # type: ignore[arg-type]
        assert 0.9 * rho <= summary["model/density"] <= rho, summary["model/density"]
        assert summary["model/nonzero"] == m and summary["model/macs"] <= m


@pytest.mark.slow
def test_mnist_cnn_quick_smoke(make_config: Callable[..., object], shared_data_root: Path, tmp_path: Path) -> None:
    cfg = make_config(["+experiment=eflops_mnist_cnn_quick", f"data.root={shared_data_root}", "rounds=1"])
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    assert 0 < summary["model/density"] <= 0.025 and summary["model/macs"] < summary["model/macs_dense"]
    assert summary["comm/uplink_compression"] > 10


@pytest.mark.slow
def test_golub_eflops_accuracy_over_seeds(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    accs = [run(golub_cfg("rounds=30", f"seed={s}"), tmp_path / str(s))["test/acc"] for s in range(5)]  # type: ignore[arg-type]
    assert sum(accs) / len(accs) >= 0.85
