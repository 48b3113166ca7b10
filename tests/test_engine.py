"""The round engine: FedAvg maths through Lightning, streams, state, accounting, errors."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra.utils import get_class
from torch import Tensor

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.compression.codecs import BitPackCodec
from fedlightning.datamodules import DigitsDataModule, IIDPartition
from fedlightning.errors import ConfigError, NonFiniteLossError
from fedlightning.federated.batches import gathered_batches, local_batches
from fedlightning.federated.cohort import Cohort, deal_by_load
from fedlightning.federated.message import Message
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.federated.rng import SERVER, stream_seed
from fedlightning.federated.state import ClientStateStore
from fedlightning.methods import DCSGD, FedAvg, FedShuffle
from fedlightning.models import LogisticRegression
from fedlightning.run import run
from fedlightning.sampling import FullParticipation, UniformSampler
from tests.conftest import round_trainer


def _datamodule(num_clients: int = 3, seed: int = 0) -> DigitsDataModule:
    dm = DigitsDataModule(num_clients=num_clients, partition=IIDPartition(), seed=seed)
    dm.setup("fit")
    return dm


def _module(dm: DigitsDataModule, **kwargs: Any) -> FedAvg:
    torch.manual_seed(0)
    options: dict[str, Any] = {
        "client_optimizer": lambda p: torch.optim.SGD(p, lr=0.1),
        "local_steps": 1,
        "batch_size": 10_000,  # one full-batch step: the round has a closed form
    }
    options.update(kwargs)
    return FedAvg(model=LogisticRegression(in_features=64, num_classes=10), datamodule=dm, **options)


def _trainer(rounds: int, callbacks: list[Any] | None = None, **kwargs: Any) -> L.Trainer:
    return round_trainer(rounds, callbacks if callbacks is not None else [FullParticipation()], **kwargs)


def test_one_fedavg_round_equals_the_closed_form() -> None:
    dm = _datamodule()
    module = _module(dm)
    w0 = flat_parameters(module.model)
    # By hand: each client takes one full-batch gradient step from w0; the server averages
    # the deltas weighted by n_k / n.
    reference = copy.deepcopy(module.model)
    n = sum(dm.client_sizes)
    expected_delta = torch.zeros_like(w0)
    for cid in range(dm.num_clients):
        assign_flat_(reference, w0)
        reference.zero_grad()
        x, y = dm.client_tensors(cid)
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        expected_delta += (len(y) / n) * (-0.1 * grad)
    trainer = _trainer(1)
    trainer.fit(module)
    assert trainer.global_step == 1  # one training_step is one round
    assert torch.allclose(flat_parameters(module.model), w0 + expected_delta, atol=1e-6)
    # Local training never wrote into the global weights (no aliasing of the flat vector).
    assert not torch.equal(flat_parameters(module.client_model), flat_parameters(module.model))


def test_global_step_counts_rounds_not_local_steps() -> None:
    module = _module(_datamodule(), local_steps=7, batch_size=16)
    trainer = _trainer(3)
    trainer.fit(module)
    assert trainer.global_step == 3


def test_same_seed_same_weights_and_other_seed_other_weights() -> None:
    def final(seed: int) -> Tensor:
        module = _module(_datamodule(), seed=seed, local_steps=None, batch_size=32)
        _trainer(2).fit(module)
        return flat_parameters(module.model)

    assert torch.equal(final(0), final(0))
    assert not torch.equal(final(0), final(1))


def test_streams_depend_only_on_their_coordinates() -> None:
    seeds = {
        stream_seed(seed=0, round_idx=r, client_id=c, purpose=p) for r in range(3) for c in range(3) for p in ("a", "b")
    }
    assert len(seeds) == 18
    assert stream_seed(seed=1, round_idx=0, client_id=0, purpose="a") != stream_seed(
        seed=0, round_idx=0, client_id=0, purpose="a"
    )


def test_uniform_cohort_is_a_function_of_seed_and_round_only() -> None:
    dm = _datamodule(num_clients=20)
    module = _module(dm)
    sampler = UniformSampler(clients_per_round=5)
    cohorts = [sampler.select_cohort(None, module, r).client_ids for r in range(50)]  # type: ignore[arg-type]
    again = [sampler.select_cohort(None, module, r).client_ids for r in reversed(range(50))][::-1]  # type: ignore[arg-type]
    assert cohorts == again
    assert all(len(c) == 5 and len(set(c)) == 5 and all(0 <= i < 20 for i in c) for c in cohorts)
    assert len(set(cohorts)) > 40  # rounds draw different cohorts
    counts = torch.bincount(torch.tensor([i for c in cohorts for i in c]), minlength=20)
    assert counts.min() > 0  # over 50 rounds every client is picked (expected 12.5 each)
    cohort = sampler.select_cohort(None, module, 0)  # type: ignore[arg-type]
    assert torch.allclose(cohort.inclusion_probabilities, torch.full((5,), 0.25))


def test_local_batches_cover_each_epoch_exactly_once() -> None:
    gen = torch.Generator().manual_seed(3)
    batches = list(local_batches(num_samples=23, batch_size=5, epochs=2, steps=None, generator=gen))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3] * 2
    assert sorted(torch.cat(batches[:5]).tolist()) == list(range(23))
    assert sorted(torch.cat(batches[5:]).tolist()) == list(range(23))
    assert len(list(local_batches(num_samples=23, batch_size=5, epochs=1, steps=12, generator=gen))) == 12


def test_several_processes_without_torch_distributed_stop_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(_datamodule())
    monkeypatch.setattr(FedAvg, "world_size", property(lambda self: 2))
    monkeypatch.setattr(FedAvg, "trainer", property(lambda self: L.Trainer(logger=False)))
    with pytest.raises(ConfigError, match=r"torch\.distributed is not initialised .*use trainer=ddp"):
        module.on_fit_start()


def test_gathered_batches_equal_indexing_each_batch_across_blocks() -> None:
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(23, 3, 2, generator=gen), torch.randint(0, 9, (23,), generator=gen)
    batches = list(local_batches(num_samples=23, batch_size=5, epochs=3, steps=None, generator=gen))
    # 7-row blocks: two batches each (10 rows), the short last batch of a pass inside a block
    gathered = list(gathered_batches(x, y, iter(batches), rows=7))
    assert len(gathered) == len(batches) == 15
    for (xb, yb), idx in zip(gathered, batches, strict=True):
        assert torch.equal(xb, x[idx]) and torch.equal(yb, y[idx]) and xb.is_contiguous()
    assert list(gathered_batches(x, y, [])) == []


class _SignPatternCodec:
    """Uploads only the sign pattern of each delta (1 bit per coordinate), for testing."""

    name = "sign_pattern"

    def encode(self, x: Tensor) -> Message:
        return BitPackCodec().encode((x > 0).float())

    def decode(self, message: Message) -> Tensor:
        return BitPackCodec().decode(message)


def test_accountant_counts_real_bitstreams_and_compression() -> None:
    dm = _datamodule(num_clients=4)
    module = _module(dm)
    params = sum(p.numel() for p in module.model.parameters())  # 650
    module.uplink_channel.codec = _SignPatternCodec()
    accountant = CommunicationAccountant()
    _trainer(3, callbacks=[UniformSampler(clients_per_round=2), accountant]).fit(module)
    summary = accountant.summary()
    assert summary["comm/uplink_bits_total"] == 3 * 2 * params  # bit-packed: one bit per coordinate
    assert summary["comm/downlink_bits_total"] == 3 * 2 * 32 * params
    assert summary["comm/uplink_compression"] == 32.0
    assert summary["comm/downlink_compression"] == 1.0
    assert summary["comm/uplink_bits_per_client_round"] == params
    assert accountant.per_client.dtype == torch.int64
    assert int(accountant.per_client[:, 0].sum()) == summary["comm/uplink_bits_total"]
    restored = CommunicationAccountant()
    restored.load_state_dict(accountant.state_dict())
    assert restored.summary() == summary


def test_client_state_travels_in_checkpoints(tmp_path: Path) -> None:
    dm = _datamodule()
    module = _module(dm)
    trainer = _trainer(1)
    trainer.fit(module)
    module.client_state.set(2, "memory", torch.arange(3.0))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    fresh = _module(dm)
    checkpoint = torch.load(tmp_path / "c.ckpt", weights_only=False)
    fresh.on_load_checkpoint(checkpoint)
    assert torch.equal(fresh.client_state.get(2, "memory"), torch.arange(3.0))


class _PoisonedDigits(DigitsDataModule):
    def client_tensors(self, cid: int) -> tuple[Tensor, Tensor]:
        x, y = super().client_tensors(cid)
        return torch.full_like(x, float("nan")), y


def test_a_loss_non_finite_before_any_step_stops_with_one_sentence_naming_the_data() -> None:
    dm = _PoisonedDigits(num_clients=2, partition=IIDPartition())  # NaN features served after loading
    dm.setup("fit")
    module = _module(dm)
    with pytest.raises(
        NonFiniteLossError, match=r"Client 0 .* round 1; .*the learning rate is not the cause: digits"
    ) as e:
        _trainer(1).fit(module)
    assert "client_optimizer.lr" not in str(e.value)


def test_models_with_buffers_are_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10), torch.nn.BatchNorm1d(10))
    with pytest.raises(ValueError, match="GroupNorm"):
        FederatedModule(model=model, datamodule=_datamodule())


def _on_process(method: type[FederatedModule], rank: int) -> type[FederatedModule]:
    """``method`` as process ``rank`` of 2 sees itself (no trainer needed for share_of)."""
    return type(f"{method.__name__}On{rank}", (method,), {"world_size": 2, "process_rank": rank})


def test_a_stateless_method_deals_the_cohort_by_local_steps_and_a_stateful_one_by_client_id() -> None:
    dm = DigitsDataModule(num_clients=6, seed=0)  # Dirichlet sizes: unequal local steps
    dm.setup("fit")
    cohort = Cohort(round_idx=0, client_ids=(5, 0, 3, 1, 4, 2), inclusion_probabilities=torch.ones(6))
    steps = {c: math.ceil(dm.client_sizes[c] / 32) for c in cohort.client_ids}
    shares = []
    for rank in (0, 1):
        module = _on_process(FedAvg, rank)(
            model=LogisticRegression(in_features=64, num_classes=10), datamodule=dm, batch_size=32
        )
        assert module.deals_cohort and module.cohort_loads(cohort) == [steps[c] for c in cohort.client_ids]
        shares.append(module.share_of(cohort))
    parts = deal_by_load([steps[c] for c in cohort.client_ids], 2)
    assert shares == [[c for c, p in zip(cohort.client_ids, parts, strict=True) if p == r] for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == list(range(6))
    stateful = type("KeepsState", (FedAvg,), {"stateless_clients": False})
    by_id = _on_process(stateful, 1)(model=LogisticRegression(in_features=64, num_classes=10), datamodule=dm)
    assert not by_id.deals_cohort and by_id.share_of(cohort) == [5, 3, 1]  # odd ids, in cohort order


def test_fedshuffle_deals_its_cohort_by_the_local_steps_of_each_clients_drawn_epochs() -> None:
    dm = DigitsDataModule(num_clients=6, seed=0)
    dm.setup("fit")
    cohort = Cohort(round_idx=3, client_ids=(5, 0, 3, 1, 4, 2), inclusion_probabilities=torch.ones(6))
    shares = []
    for rank in (0, 1):
        module = _on_process(FedShuffle, rank)(
            model=LogisticRegression(in_features=64, num_classes=10), datamodule=dm, batch_size=32, local_epochs=[1, 5]
        )
        epochs = [module.client_epochs(client_id=c, round_idx=3) for c in cohort.client_ids]
        steps = [math.ceil(dm.client_sizes[c] / 32) * e for c, e in zip(cohort.client_ids, epochs, strict=True)]
        assert module.cohort_loads(cohort) == steps
        shares.append(module.share_of(cohort))
    assert len(set(epochs)) > 1  # the clients' work differs
    parts = deal_by_load(steps, 2)
    assert shares == [[c for c, p in zip(cohort.client_ids, parts, strict=True) if p == r] for r in (0, 1)]


@pytest.mark.parametrize("full_gradient", [True, False])
def test_dcsgd_balances_the_samples_its_one_gradient_reads(full_gradient: bool) -> None:
    dm = DigitsDataModule(num_clients=6, seed=0)  # Dirichlet sizes
    dm.setup("fit")
    cohort = Cohort(round_idx=0, client_ids=(5, 0, 3), inclusion_probabilities=torch.ones(3))
    module = DCSGD(
        model=LogisticRegression(in_features=64, num_classes=10), datamodule=dm, lr=0.1, full_gradient=full_gradient
    )
    sizes = [dm.client_sizes[c] for c in cohort.client_ids]
    expected = sizes if full_gradient else [min(32, n) for n in sizes]
    assert module.cohort_loads(cohort) == expected


# Every method config whose class declares stateless_clients, with what it needs on the digits default.
STATELESS_METHODS = {
    "fedavg": [],
    "fedadam": [],
    "fedprox": [],
    "fedavg_prune": [],
    "fediht": [],
    "dcsgd": ["model=digits_logreg"],
    "eflops": [],
    "fedshuffle": ["method.local_epochs=[1,3]"],
    "fednova": [],
    "fjord": ["model=digits_mlp"],
    "efd": ["model=digits_mlp", "method.width=0.8"],
}


def test_the_stateless_list_names_every_method_config_that_declares_stateless_clients(make_config: Any) -> None:
    declared = set()
    for path in sorted((Path(__file__).parents[1] / "configs" / "method").glob("*.yaml")):
        target = make_config([f"method={path.stem}"]).method._target_
        if get_class(target).stateless_clients:
            declared.add(get_class(target).__name__)
    listed = {get_class(make_config([f"method={m}"]).method._target_).__name__ for m in STATELESS_METHODS}
    assert listed == declared


@pytest.mark.parametrize("method", sorted(STATELESS_METHODS))
def test_a_method_that_declares_stateless_clients_keeps_no_client_state(
    method: str, make_config: Any, tmp_path: Path
) -> None:
    overrides = ["rounds=2", f"method={method}", *STATELESS_METHODS[method], "logger=none"]
    overrides += ["trainer.enable_progress_bar=false", "sampler=uniform", "clients_per_round=5"]
    run(make_config(overrides), tmp_path)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert set(checkpoint["client_state"]) <= {SERVER}  # the server's entries only: dealing moves no client's


def test_the_client_state_store_refuses_client_entries_while_clients_are_dealt() -> None:
    store = ClientStateStore()
    store.refusal = "the cohort is dealt by load"
    store.set(SERVER, "h", torch.zeros(2))  # the server's state is kept
    with pytest.raises(ConfigError, match="Client 3's state 'memory' cannot be kept: the cohort is dealt by load"):
        store.set(3, "memory", torch.zeros(2))
    with pytest.raises(ConfigError, match="Client 4's state 'shift' cannot be kept"):
        store.get_or_init(4, "shift", lambda: torch.zeros(2))
    assert list(store.clients()) == [SERVER]  # nothing was written for either client
