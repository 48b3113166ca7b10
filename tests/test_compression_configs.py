"""Every compressor/downlink config builds its callback, and a short run counts the compressed bits."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import instantiate

from fedlightning.callbacks.compression import DownlinkCompression, UplinkCompression
from fedlightning.federated.channel import MEMORY_KEY
from fedlightning.run import run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
UPLINK = sorted(p.stem for p in (CONFIGS / "compressor").glob("*.yaml") if p.stem != "none")
DOWNLINK = sorted(p.stem for p in (CONFIGS / "downlink").glob("*.yaml") if p.stem != "none")


@pytest.mark.parametrize("name", UPLINK)
def test_uplink_configs_build_an_operator_within_its_declared_variance(make_config: Any, name: str) -> None:
    """ω for an unbiased operator (δ = ω + 1), δ ≥ 1 for a biased one, and the mean error of 20 draws within it.

    The bounds hold in expectation: E‖C(x) − x‖² ≤ ω‖x‖² (unbiased), ≤ (1 − 1/δ)‖x‖² (biased);
    the mean of 20 draws gets 20% slack.
    """
    cfg = make_config([f"compressor={name}"])
    cb = instantiate(cfg.compressor)
    assert isinstance(cb, UplinkCompression)
    op, d = cb.compressor, 1000
    if op.unbiased:
        omega = op.omega(d)
        assert omega is not None and 0.0 <= omega < math.inf and op.delta(d) == pytest.approx(omega + 1.0)
        bound = omega
    else:
        assert op.omega(d) is None and op.delta(d) >= 1.0
        bound = 1.0 - 1.0 / op.delta(d)
    x = torch.randn(d, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    errors = [float((op(x, gen) - x).square().sum()) for _ in range(20)]
    assert sum(errors) / len(errors) <= 1.2 * bound * float(x.square().sum()) + 1e-6


@pytest.mark.parametrize("name", DOWNLINK)
def test_downlink_configs_build(make_config: Any, name: str) -> None:
    cfg = make_config([f"downlink={name}"])
    assert isinstance(instantiate(cfg.downlink), DownlinkCompression)


def test_bidirectional_natural_run_counts_9_bits(make_config: Any, tmp_path: Path) -> None:
    cfg = make_config(["rounds=2", "compressor=natural", "downlink=natural", "save_partition=false"])
    summary = run(cfg, tmp_path)
    assert summary["comm/uplink_compression"] == pytest.approx(32 / 9)
    # every client: 2 uploads of 9 bits a coordinate; broadcasts of the float32 initial model, then 9 bits
    assert summary["comm/downlink_bits_total"] == pytest.approx(summary["comm/uplink_bits_total"] * (32 + 9) / 18)
    assert summary["test/acc"] > 0.15  # 2 rounds on digits; chance is 0.1


def test_top_k_error_feedback_run_keeps_memory(make_config: Any, tmp_path: Path) -> None:
    """Each client that trained holds e = (e + v) − C(e + v) in the checkpoint: non-zero, as long as the model."""
    cfg = make_config(
        ["rounds=2", "compressor=top_k_ef", "save_partition=false", "sampler=uniform", "clients_per_round=5"]
    )
    summary = run(cfg, tmp_path)
    assert summary["comm/uplink_compression"] > 50
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    state = checkpoint["client_state"]
    memories = {cid: entries[MEMORY_KEY] for cid, entries in state.items() if MEMORY_KEY in entries}
    dim = sum(p.numel() for name, p in checkpoint["state_dict"].items() if name.startswith("model."))
    assert 5 <= len(memories) <= 10  # 5 clients a round, 2 rounds
    for memory in memories.values():
        assert memory.numel() == dim and int(torch.count_nonzero(memory)) > dim // 2  # top-k keeps a few coordinates


def test_natural_and_standard_dithering_configs_send_different_bitstreams(make_config: Any, tmp_path: Path) -> None:
    """The two configs are Fig. 2.9's D_nat^{2,8} and D_sta^{2,128}: distinct levels, distinct messages."""
    bits = {}
    for name in ("natural_dithering", "standard_dithering"):
        cfg = make_config(["rounds=1", f"compressor={name}", "save_partition=false", "data.num_clients=2"])
        op = instantiate(cfg.compressor).compressor
        summary = run(cfg, tmp_path / name)
        bits[name] = (op.levels, op.s, op.p, summary["comm/uplink_bits_total"])
    assert bits["natural_dithering"][:3] == ("exponential", 8, 2.0)
    assert bits["standard_dithering"][:3] == ("standard", 128, 2.0)
    # log2(8) = 3 level bits per non-zero against log2(128) = 7: the standard stream is the longer one
    assert bits["standard_dithering"][3] > bits["natural_dithering"][3]
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    nat = instantiate(make_config(["compressor=natural_dithering"]).compressor).compressor
    sta = instantiate(make_config(["compressor=standard_dithering"]).compressor).compressor
    m_nat, m_sta = nat.compress(x, torch.Generator().manual_seed(1)), sta.compress(x, torch.Generator().manual_seed(1))
    assert m_nat.payload != m_sta.payload
    assert not torch.equal(m_nat.decode(), m_sta.decode())
