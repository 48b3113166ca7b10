"""Fed-IHT and FedAvg + pruning: thresholding maths and end-to-end density."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedlightning.methods.fedavg_prune import magnitude_prune
from fedlightning.methods.fediht import hard_threshold
from fedlightning.metrics import count_macs, top_m_mask
from fedlightning.models import build_model
from fedlightning.run import run


def test_hard_threshold_keeps_global_top_m() -> None:
    x = torch.tensor([0.1, -5.0, 3.0, -0.2, 4.0])
    assert hard_threshold(x, 3).tolist() == [0.0, -5.0, 3.0, 0.0, 4.0]
    assert top_m_mask(torch.tensor([1.0, 1.0, 1.0]), 2).tolist() == [True, True, False]  # ties: lower index


def test_magnitude_prune_layer_scope() -> None:
    flat = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    assert magnitude_prune(flat, [4, 2], 0.5, "layer").tolist() == [0.0, 0.0, 3.0, 4.0, 0.0, 20.0]
    assert magnitude_prune(flat, [4, 2], 0.5, "global").tolist() == [0.0, 0.0, 0.0, 4.0, 10.0, 20.0]


def test_macs_of_pruned_cnn_count_dead_channels() -> None:
    torch.manual_seed(0)
    model = build_model("digits_cnn", input_shape=(1, 8, 8), num_classes=10)
    macs, dense, layers = count_macs(model, (1, 8, 8))
    # dense: conv1 16*1*9 at 8x8, conv2 32*16*9 at 4x4, fc 64*(32*2*2), fc 10*64
    assert dense == 16 * 9 * 64 + 32 * 16 * 9 * 16 + 64 * 128 + 640 == macs
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat[: 16 * 9 + 16] = 0.0  # kill conv1 (weights and biases): conv2 then has no live inputs
    macs_pruned, _, layers = count_macs(model, (1, 8, 8), flat)
    assert layers[0].macs == 0 and layers[1].macs == 0
    assert macs_pruned == 64 * 128 + 640


@pytest.mark.parametrize("method", ["fediht", "fedavg_prune"])
@pytest.mark.parametrize("extra", [[], ["method.client_threshold=none"]])
def test_golub_baselines_hit_density(
    method: str, extra: list[str], make_config: Callable[..., object], shared_data_root: Path, tmp_path: Path
) -> None:
    if method == "fedavg_prune" and extra:
        pytest.skip("client_threshold is a Fed-IHT option")
    cfg = make_config(
        ["+experiment=golub_eflops_quick", f"method={method}", f"data.root={shared_data_root}", "rounds=2", *extra]
    )
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    dim = 2 * 3571 + 2
    assert summary["model/density"] == pytest.approx(int(0.02 * dim) / dim, abs=2 / dim)
    dense_up = method == "fedavg_prune" or extra
    assert (summary["comm/uplink_compression"] == pytest.approx(1.0)) == bool(dense_up)
    if method == "fediht":
        assert summary["comm/downlink_compression"] > 10
