"""A share trained at once is sent, counted and folded in as one share, with the per-client path's results.

The vectorised backend hands the engine its share's uploads as the rows of one tensor
(:class:`~fedlightning.federated.local.ResultRows`); the engine then checks them with one host
read, sends them through the channel as one share (one bulk encode where the codec has one),
counts them with one accounting call and folds them into the aggregator in one call. Each test
runs the same configuration twice, once with the backend's rows and once with the same results
handed over client by client, and asserts the same bits, the same ``comm_records.csv`` rows and
the same float64 sums, bit for bit.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

from fedlightning.compression.codecs import BFloat16Codec, Float16Codec
from fedlightning.federated import local
from fedlightning.federated.aggregators import WeightedMean, fold_
from fedlightning.federated.codecs import Float32Codec
from fedlightning.federated.local import ResultRows, VectorisedRunner
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.wire import WirePhases
from fedlightning.run import run
from tests.conftest import record_calls
from tests.test_distributed import records, run_two_processes


class _ClientByClient(VectorisedRunner):
    """The vectorised backend's results, handed to the engine one client at a time."""

    def train_share(self, module: Any, **kwargs: Any) -> Any:
        results = super().train_share(module, **kwargs)
        assert isinstance(results, ResultRows)
        return list(results)


def _run_both(make_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> list[Any]:
    """Summary, comm records and each round's aggregator sums of the bulk and the per-client paths."""
    outcomes = []
    for path in ("bulk", "per_client"):
        with monkeypatch.context() as patch:
            if path == "per_client":
                patch.setitem(local.RUNNERS, "vectorised", _ClientByClient)
            rows_seen = record_calls(patch, ResultRows, "__post_init__")
            bulk_shares = record_calls(patch, WirePhases, "_take_rows")
            single_uploads = record_calls(patch, WirePhases, "_upload")
            steps = record_calls(patch, FederatedModule, "_server_step")
            folder = tmp_path / path
            cfg = make_config(["rounds=3", "local_execution=vectorised", "save_partition=false", *overrides])
            summary = run(cfg, folder)
        assert rows_seen  # the backend trained each share at once
        if path == "bulk":  # one bulk share a round, no upload client by client
            assert len(bulk_shares) == 3 and not single_uploads
        else:
            assert not bulk_shares and single_uploads
        with (folder / "comm_records.csv").open() as handle:
            records = list(csv.reader(handle))
        sums = [args[1].aggregator.sums.clone() for args, _ in steps]
        outcomes.append((summary, records, sums))
    return outcomes


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["compressor=top_k_ef"],
        ["compressor=qsgd"],
        ["sampler=ocs", "clients_per_round=4"],
        ["method=fedadam"],
        ["failures=dropout"],
    ],
    ids=["fedavg", "top_k_error_feedback", "qsgd", "ocs", "fedadam", "dropout"],
)
def test_bulk_share_gives_the_per_client_paths_bits_records_and_sums(
    overrides: list[str], make_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (bulk, bulk_rows, bulk_sums), (single, single_rows, single_sums) = _run_both(
        make_config, tmp_path, monkeypatch, overrides
    )
    assert bulk_rows == single_rows
    assert len(bulk_rows) > 1 + 3 * 10  # a header, then every downlink and upload of 3 rounds
    assert len(bulk_sums) == len(single_sums) == 3
    for a, b in zip(bulk_sums, single_sums, strict=True):
        assert a.dtype == torch.float64 and torch.equal(a, b)
    bits = {k: v for k, v in bulk.items() if k.startswith("comm/")}
    assert bits == {k: v for k, v in single.items() if k.startswith("comm/")}
    assert bulk["test/acc"] == single["test/acc"]


def test_two_processes_send_the_bulk_paths_messages_of_one_process(make_config: Any, tmp_path: Path) -> None:
    overrides = ["rounds=2", "local_execution=vectorised", "compressor=top_k_ef", "sampler=uniform"]
    one = run(make_config([*overrides, "save_partition=false"]), tmp_path / "one")
    two = run_two_processes(overrides, tmp_path / "two")
    assert two["processes"] == 2 and one["processes"] == 1
    assert {k: v for k, v in two.items() if k.startswith("comm/")} == {
        k: v for k, v in one.items() if k.startswith("comm/")
    }
    assert records(tmp_path / "two") == records(tmp_path / "one")
    assert two["test/acc"] == pytest.approx(one["test/acc"], abs=1e-6)


@pytest.mark.parametrize("codec", [Float32Codec(), Float16Codec(), BFloat16Codec()], ids=lambda c: c.name)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1_000,)], ids=str)
def test_encode_rows_writes_each_rows_own_message_and_length(codec: Any, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(4, *shape, generator=gen) * 1e3
    if x.numel():  # finite values at the wires' edges (a non-finite upload is quarantined before it is sent)
        x.view(-1)[:3] = torch.tensor([7e4, 3e-8, -1e-40])[: x.numel()]
    sent, decoded = codec.encode_rows(x, client_ids=[3, 1, 4, 1])
    assert sent.client_ids == [3, 1, 4, 1] and sent.codec_names == [codec.name] * 4
    for k in range(4):
        own = codec.encode(x[k])
        assert sent.num_bits[k] == own.num_bits  # the length from the shape is the bitstream's
        assert bytes(sent.message(k).payload) == bytes(own.payload)
        assert sent.message(k).shape == own.shape == tuple(shape)
        assert torch.equal(decoded[k].view(torch.int32), own.decode().view(torch.int32))


def test_accumulate_rows_folds_each_entry_in_the_per_client_order() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 70_001, generator=gen) * torch.logspace(-8, 8, 5).reshape(5, 1)
    weights = [0.1, 1 / 3, 7.0, 1e-9, 2.5]
    masses: list[float | None] = [None, 0.0, None, 0.25, None]
    one, bulk = WeightedMean(dim=70_001, normalise=True), WeightedMean(dim=70_001, normalise=True)
    for row, w, m in zip(rows, weights, masses, strict=True):
        one.accumulate(row, weight=w) if m is None else one.accumulate(row, weight=w, mass=m)
    bulk.accumulate_rows(rows, weights=weights, masses=masses)
    assert torch.equal(one.sums, bulk.sums) and one.count == bulk.count == 5
    expected = torch.zeros(70_001, dtype=torch.float64)
    for row, w in zip(rows, weights, strict=True):
        fold_(expected, row, weight=w)
    assert torch.equal(bulk.weighted_sum(), expected)
    assert bulk.total_weight == 0.1 + 7.0 + 0.25 + 2.5


def test_vectorised_clients_read_in_place_from_resident_data_train_as_from_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan points into every client's data where the module keeps it (on a CPU, the datamodule's own tensors)."""
    from fedlightning.datamodules import DigitsDataModule, DirichletPartition
    from fedlightning.federated.params import flat_parameters
    from fedlightning.methods import FedAvg
    from fedlightning.sampling import UniformSampler
    from tests.conftest import round_trainer

    def trained(resident: bool) -> tuple[torch.Tensor, list[Any]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
        )
        dm = DigitsDataModule(num_clients=8, seed=0, partition=DirichletPartition(alpha=0.3))
        module = FedAvg(model=model, datamodule=dm, batch_size=16, local_execution="vectorised")
        with monkeypatch.context() as patch:
            if not resident:  # each client's tensors fetched apart, as for a datamodule that does not store slices
                patch.setattr(FedAvg, "resident_train_data", lambda self: None)
            calls = record_calls(patch, local.vectorised, "train_stacked")
            round_trainer(2, [UniformSampler(clients_per_round=5)]).fit(module)
        return flat_parameters(module.model), [kwargs["x"] for _, kwargs in calls]

    copied, copied_x = trained(resident=False)
    in_place, resident_x = trained(resident=True)
    assert torch.equal(copied, in_place)
    assert all(len(x) < 1_000 for x in copied_x)  # the cohort's samples, concatenated
    assert all(len(x) > 1_000 for x in resident_x)  # every client's data, indexed in place


def test_a_datamodule_serving_its_own_client_tensors_is_asked_for_them_on_every_backend() -> None:
    """Its clients' data are not read in place from its stored tensors, which its override may not serve."""
    from fedlightning.datamodules import DigitsDataModule, IIDPartition
    from fedlightning.federated.params import flat_parameters
    from fedlightning.methods import FedAvg
    from fedlightning.sampling import UniformSampler
    from tests.conftest import round_trainer

    class Doubled(DigitsDataModule):
        def client_tensors(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = super().client_tensors(cid)
            return 2 * x, y

    def trained(cls: type[DigitsDataModule], execution: str) -> tuple[FedAvg, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        dm = cls(num_clients=6, seed=0, partition=IIDPartition())
        module = FedAvg(model=model, datamodule=dm, batch_size=16, local_execution=execution)
        round_trainer(2, [UniformSampler(clients_per_round=4)]).fit(module)
        return module, flat_parameters(module.model)

    own, own_loop = trained(Doubled, "loop")
    _, own_vectorised = trained(Doubled, "vectorised")
    plain, plain_vectorised = trained(DigitsDataModule, "vectorised")
    assert own.resident_train_data() is None and plain.resident_train_data() is not None
    torch.testing.assert_close(own_vectorised, own_loop)  # both trained on the doubled features
    assert not torch.allclose(own_vectorised, plain_vectorised)
