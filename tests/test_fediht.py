"""Fed-IHT and FedAvg + pruning: thresholding maths and end-to-end density."""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlightning.callbacks.declared import declared_callbacks
from fedlightning.callbacks.sparse_report import SparseModelReport
from fedlightning.compression.codecs import Float32Codec
from fedlightning.compression.index_coding import SparseCodec
from fedlightning.errors import ConfigError
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.methods.fedavg_prune import FedAvgPrune, magnitude_prune
from fedlightning.methods.fediht import FedIHT, hard_threshold
from fedlightning.metrics import count_macs, top_m_mask
from fedlightning.models import build_model
from fedlightning.run import run


def test_hard_threshold_keeps_global_top_m() -> None:
    x = torch.tensor([0.1, -5.0, 3.0, -0.2, 4.0])
    assert hard_threshold(x, 3).tolist() == [0.0, -5.0, 3.0, 0.0, 4.0]
    assert top_m_mask(torch.tensor([1.0, 1.0, 1.0]), 2).tolist() == [True, True, False]  # ties: lower index


def _fediht(**kwargs: object) -> FedIHT:
    return FedIHT(density=0.5, model=nn.Linear(3, 1), datamodule=types.SimpleNamespace(task="regression"), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("client_threshold", "uplink", "codec"),
    [("none", Payload.MODEL, Float32Codec), ("upload", Payload.SPARSE_MODEL, SparseCodec)],
)
def test_fediht_payloads_and_engine_contract(client_threshold: str, uplink: Payload, codec: type) -> None:
    module = _fediht(client_threshold=client_threshold)
    assert module.uplink_channel.payload is uplink and isinstance(module.uplink_channel.codec, codec)
    assert module.downlink_channel.payload is Payload.SPARSE_MODEL
    assert isinstance(module.downlink_channel.codec, SparseCodec)
    assert module.sets_server_state and module.supported_aggregation == ("normalised",)
    for hook in ("configure_optimizers", "training_step", "on_train_batch_end", "on_test_epoch_end"):
        assert hook not in vars(FedIHT), hook
    assert [type(cb) for cb in declared_callbacks(module)] == [SparseModelReport]
    with pytest.raises(ConfigError, match="server_optimizer"):
        _fediht(server_optimizer=lambda params: torch.optim.SGD(params, lr=1.0))


def test_fediht_server_state_is_thresholded_weighted_mean() -> None:
    """x_{t+1} = H_m(Σ w_k x_k / Σ w_k): (1/4)[4, 0, 2, 0] + (3/4)[0, 2, 2, -1] = [1, 1.5, 2, -0.75], m = 2."""
    module = _fediht()
    assert module.m == 2 and int(torch.count_nonzero(flat_parameters(module.model))) <= 2  # x_0 = H_m(init)
    aggregator = module.make_aggregator(round_idx=0)
    aggregator.accumulate(torch.tensor([4.0, 0.0, 2.0, 0.0]), weight=0.1)  # shares n_k / n need not sum to one
    aggregator.accumulate(torch.tensor([0.0, 2.0, 2.0, -1.0]), weight=0.3)
    module.set_server_state(round_idx=0, aggregator=aggregator)
    assert flat_parameters(module.model).tolist() == [0.0, 1.5, 2.0, 0.0]
    assert module.evaluated_parameters().tolist() == [0.0, 1.5, 2.0, 0.0]


def test_fedavg_prune_is_fedavg_with_a_pruned_evaluation() -> None:
    module = FedAvgPrune(density=0.5, model=nn.Linear(3, 1), datamodule=types.SimpleNamespace(task="regression"))
    assert not module.sets_server_state and module.uplink_channel.payload is Payload.MODEL_DELTA
    assign_flat_(module.model, torch.tensor([3.0, 1.0, -2.0, 0.5]))
    assert module.evaluated_parameters().tolist() == [3.0, 0.0, -2.0, 0.0]
    assert [type(cb) for cb in declared_callbacks(module)] == [SparseModelReport]


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
    dim = 3571 + 1  # the one-output logistic model of golub_eflops
    assert summary["model/density"] == pytest.approx(int(0.02 * dim) / dim, abs=2 / dim)
    dense_up = method == "fedavg_prune" or extra
    assert (summary["comm/uplink_compression"] == pytest.approx(1.0)) == bool(dense_up)
    if method == "fediht":
        assert summary["comm/downlink_compression"] > 10
