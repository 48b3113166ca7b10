"""Master compression of the broadcast: Algorithm 1 as written (the compressed aggregate step, no
memory, one shared x) and the replica scheme (x̂ from the initial model), with their bits."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from fedlightning.callbacks.compression import DownlinkCompression, UplinkCompression
from fedlightning.compression import NaturalCompression, TopK
from fedlightning.compression.codecs import Float32Codec
from fedlightning.datamodules import DirichletPartition
from fedlightning.datamodules.synthetic_logistic import SyntheticLogisticDataModule
from fedlightning.errors import ConfigError
from fedlightning.federated.channel import DownlinkChannel
from fedlightning.federated.downlink import PENDING_KEY, SHARED_KEY, AggregateDownlinkChannel
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.params import flat_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.federated.rng import SERVER
from fedlightning.federated.state import ClientStateStore
from fedlightning.methods.dcsgd import DCSGD
from fedlightning.models import build_model
from fedlightning.run import run
from tests.conftest import round_trainer

D = 11 * 2  # logistic regression on 10 features, 2 classes


class Recorder(FederatedCallback):
    """What each client decodes from its downlink message, and the server model after each round."""

    def __init__(self) -> None:
        self.received: dict[int, list[torch.Tensor]] = {}
        self.bits: dict[int, list[int]] = {}
        self.codecs: dict[int, set[str]] = {}
        self.server: list[torch.Tensor] = []

    def on_client_downlink(self, trainer: L.Trainer, module: Any, round_idx: int, client_id: int, message: Any) -> None:
        self.received.setdefault(round_idx, []).append(message.decode().clone())
        self.bits.setdefault(round_idx, []).append(message.num_bits)
        self.codecs.setdefault(round_idx, set()).add(type(message.codec).__name__)

    def on_round_end(self, trainer: L.Trainer, module: Any, round_idx: int, metrics: dict[str, float]) -> None:
        self.server.append(flat_parameters(module.model).clone())


def dcsgd_run(scheme: str, rounds: int = 3) -> tuple[DCSGD, Recorder, torch.Tensor]:
    dm = SyntheticLogisticDataModule(
        num_clients=3, num_samples=120, dim=10, partition=DirichletPartition(alpha=1.0), seed=0, val_fraction=0.0
    )
    dm.setup("fit")
    torch.manual_seed(0)
    module = DCSGD(
        model=build_model("logreg", input_shape=dm.input_shape, num_classes=2), datamodule=dm, seed=0, lr=0.5
    )
    initial = flat_parameters(module.model).clone()
    recorder = Recorder()
    callbacks = [
        UplinkCompression(NaturalCompression(), granularity="model"),
        DownlinkCompression(NaturalCompression(), scheme=scheme, granularity="model"),  # type: ignore[arg-type]
        recorder,
    ]
    round_trainer(rounds, callbacks, limit_val_batches=0, accelerator="cpu").fit(module)
    return module, recorder, initial


def test_algorithm_1_broadcasts_the_compressed_step_and_every_node_shares_one_x() -> None:
    _, rec, initial = dcsgd_run("aggregate")
    # round 1: the initial model itself, once, dense; later rounds: C_nat of the last step, 9 bits a coordinate
    assert rec.bits[0] == [32 * D] * 3 and all(torch.equal(r, initial) for r in rec.received[0])
    assert rec.bits[1] == [9 * D] * 3 and rec.bits[2] == [9 * D] * 3
    assert rec.codecs[1] == {"ReplicaCodec"}
    for r in (1, 2):  # every client decodes exactly the server's model after the previous round
        assert all(torch.equal(x, rec.server[r - 1]) for x in rec.received[r])
    # the server's own model moved by the compressed step: its change is C_nat-valued (powers of two or 0)
    step = (rec.server[1].double() - rec.server[0].double()).abs()
    step = step[step > 0]
    assert torch.allclose(torch.exp2(torch.log2(step).round()), step, rtol=1e-5)


def test_replica_scheme_starts_from_the_initial_model_sent_once() -> None:
    module, rec, initial = dcsgd_run("replica")
    assert rec.bits[0] == [32 * D] * 3 and all(torch.equal(r, initial) for r in rec.received[0])
    assert rec.bits[1] == [9 * D] * 3
    # x̂ ← x̂ + C(x − x̂): the clients' copy differs from the (uncompressed) server model by the dropped error
    error = rec.received[1][0] - rec.server[0]
    assert 0 < float(error.norm()) < float((rec.server[0] - initial).norm())
    assert isinstance(module.downlink_channel.operator(D), NaturalCompression)


def test_algorithm_1_refuses_a_biased_master_compressor() -> None:
    with pytest.raises(ConfigError, match=r"^downlink.scheme=aggregate \(Algorithm 1\) needs an unbiased"):
        DownlinkCompression(TopK(k=2), scheme="aggregate")
    DownlinkCompression(TopK(k=2), scheme="replica")  # the replica re-sends what Top-k drops


def test_the_plain_downlink_channel_refuses_an_operator_so_no_zero_start_replica_exists() -> None:
    channel = DownlinkChannel(payload=Payload.MODEL, codec=Float32Codec(), method="dcsgd")
    with pytest.raises(ConfigError, match=r"^The plain downlink channel of dcsgd has no master-compression scheme"):
        channel.attach(NaturalCompression())
    assert channel.compressor is None
    message, decoded = channel.send(torch.arange(4.0), generator=None, state=ClientStateStore())
    assert message.num_bits == 4 * 32 and torch.equal(decoded, torch.arange(4.0))  # the method's codec only


def test_algorithm_1_keeps_its_pending_step_in_the_checkpointed_state() -> None:
    module, rec, _ = dcsgd_run("aggregate", rounds=2)
    # after round 2's server step: the clients hold round 1's model, the step C_M(Δ) waits as a bitstream
    held = module.client_state.get(SERVER, SHARED_KEY)
    pending = module.client_state.get(SERVER, PENDING_KEY)
    assert torch.equal(held, rec.server[0]) and int(pending["bits"][0]) == 9 * D
    # a fresh channel (a resumed run) reads it back and sends exactly that step: the clients reach the server model
    fresh = AggregateDownlinkChannel(payload=Payload.MODEL, codec=Float32Codec(), method="dcsgd")
    fresh.attach(NaturalCompression(), granularity="model")
    message, decoded = fresh.send(flat_parameters(module.model), generator=None, state=module.client_state)
    assert message.num_bits == 9 * D and torch.equal(decoded, rec.server[1])


@pytest.mark.slow
def test_bidirectional_fedavg_run_counts_the_dense_initial_model_once(make_config: Any, tmp_path: Path) -> None:
    cfg = make_config(["rounds=2", "compressor=natural", "downlink=natural", "save_partition=false"])
    summary = run(cfg, tmp_path)
    with (tmp_path / "comm_records.csv").open() as handle:
        down = [r for r in csv.DictReader(handle) if r["direction"] == "down"]
    first, second = (sorted({int(r["bits"]) for r in down if r["round"] == str(k)}) for k in (1, 2))
    assert len(first) == 1 and len(second) == 1
    assert first[0] == 32 * second[0] // 9  # float32 initial model, then C_nat: 9 bits per coordinate
    assert summary["comm/uplink_compression"] == pytest.approx(32 / 9)
    assert summary["test/acc"] > 0.15
