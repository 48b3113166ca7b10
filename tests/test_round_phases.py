"""The phases of a round: partial-participation estimators, uploader choice, lost uploads, server steps."""

from __future__ import annotations

import copy
import csv
import importlib
import inspect
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor

import fedlightning.methods as methods
from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import DigitsDataModule
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import WeightedMean, participation_weights
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, FederatedCallback, UploadChoice
from fedlightning.federated.module import FederatedModule
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import FedAvg
from fedlightning.models import LogisticRegression
from fedlightning.run import run
from fedlightning.sampling import FullParticipation, UniformSampler
from tests.conftest import digits_federation, round_trainer


def test_expected_weights_of_two_of_three_clients_drawn_uniformly() -> None:
    # Clients hold 1, 2 and 3 samples; each pair is the cohort with probability 1/3, and each
    # client is drawn with probability 2/3.
    samples = torch.tensor([1.0, 2.0, 3.0])
    shares = samples / samples.sum()
    expected = {"normalised": torch.zeros(3, dtype=torch.float64), "unbiased": torch.zeros(3, dtype=torch.float64)}
    for pair in itertools.combinations(range(3), 2):
        idx = torch.tensor(pair)
        for estimator in expected:
            w = participation_weights(shares[idx], torch.full((2,), 2 / 3), estimator)  # type: ignore[arg-type]
            expected[estimator][idx] += w / 3
    assert torch.allclose(expected["normalised"], torch.tensor([7 / 36, 16 / 45, 9 / 20], dtype=torch.float64))
    assert torch.allclose(expected["unbiased"], torch.tensor([1 / 6, 1 / 3, 1 / 2], dtype=torch.float64))


def test_weighted_mean_sums_do_not_grow_with_the_number_of_uploads() -> None:
    agg = WeightedMean(dim=5, normalise=True)
    for k in range(100):
        agg.accumulate(torch.full((5,), float(k)), weight=1.0)
    assert agg.sums.numel() == 6 and agg.count == 100
    assert torch.equal(agg.result(), torch.full((5,), 49.5))


def _fedavg(dm: DigitsDataModule, method: type[FedAvg] = FedAvg, **kwargs: Any) -> FedAvg:
    """One full-batch SGD step per client (lr 0.1) on logistic regression: rounds with a closed form."""
    torch.manual_seed(0)
    return method(
        model=LogisticRegression(in_features=64, num_classes=10),
        datamodule=dm,
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        local_steps=1,
        batch_size=10_000,
        **kwargs,
    )


def _fit(module: FederatedModule, callbacks: list[Any], rounds: int = 1) -> None:
    round_trainer(rounds, callbacks).fit(module)


def test_upload_weight_is_the_share_divided_by_the_inclusion_probability_when_unbiased() -> None:
    dm = digits_federation(4)
    sizes = dm.client_sizes
    unbiased = _fedavg(dm, aggregation="unbiased")
    normalised = _fedavg(dm)
    n = sum(sizes)
    assert unbiased.upload_weight(client_id=1, num_samples=sizes[1], inclusion_probability=0.5) == pytest.approx(
        2 * sizes[1] / n
    )
    assert normalised.upload_weight(client_id=1, num_samples=sizes[1], inclusion_probability=0.5) == pytest.approx(
        sizes[1] / n
    )


def test_unbiased_round_applies_the_sum_of_share_over_probability_times_delta() -> None:
    dm = digits_federation(4)
    plain = _fedavg(dm, aggregation="normalised")
    unbiased = _fedavg(dm, aggregation="unbiased")
    w0 = flat_parameters(plain.model)
    _fit(plain, [UniformSampler(clients_per_round=2)])
    _fit(unbiased, [UniformSampler(clients_per_round=2)])
    cohort = UniformSampler(clients_per_round=2).select_cohort(None, plain, 0)  # type: ignore[arg-type]
    sizes = torch.tensor([dm.client_sizes[c] for c in cohort.client_ids], dtype=torch.float64)
    # Same deltas, so the unbiased step is the normalised one times Σ_S (w_i/p_i) = Σ_S w_i / (K/N).
    scale = float(sizes.sum() / sum(dm.client_sizes) / 0.5)
    step_plain = flat_parameters(plain.model) - w0
    step_unbiased = flat_parameters(unbiased.model) - w0
    assert torch.allclose(step_unbiased, scale * step_plain, atol=1e-6)


def test_unbiased_aggregation_is_recorded_in_the_summary(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(["rounds=2", "sampler=uniform", "clients_per_round=4", "method.aggregation=unbiased"])
    summary = run(cfg, tmp_path)
    assert summary["aggregation"] == "unbiased"
    assert summary["test/acc"] > 0.1


class _LargestUpdateUploads(ClientSampler):
    """Full cohort; only the client with the largest update norm uploads (with probability one)."""

    chooses_uploaders = True

    def __init__(self) -> None:
        self.norms: Tensor | None = None

    def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
        return Cohort.full(round_idx=round_idx, num_clients=module.num_clients)

    def choose_uploaders(self, trainer: Any, module: Any, cohort: Cohort, update_norms: Tensor) -> UploadChoice:
        self.norms = update_norms.clone()
        best = int(update_norms.argmax())
        chosen = Cohort(
            round_idx=cohort.round_idx, client_ids=(cohort.client_ids[best],), inclusion_probabilities=torch.ones(1)
        )
        return UploadChoice(uploaders=chosen)


def test_a_sampler_chooses_uploaders_from_every_clients_update_norm(tmp_path: Path) -> None:
    dm = digits_federation(4)
    module = _fedavg(dm)
    sampler = _LargestUpdateUploads()
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    _fit(module, [sampler, accountant])
    assert sampler.norms is not None and sampler.norms.shape == (4,) and bool((sampler.norms > 0).all())
    with (tmp_path / "records.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["client"]) for r in rows if r["direction"] == "up"] == [int(sampler.norms.argmax())]
    assert sum(r["direction"] == "down" for r in rows) == 4  # every cohort member trained


class _LoseClient(FederatedCallback):
    def __init__(self, client_id: int) -> None:
        self.client_id = client_id
        self.dropped: list[int] = []

    def drops_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> bool:
        return client_id == self.client_id

    def on_upload_dropped(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> None:
        self.dropped.append(client_id)


def test_a_lost_upload_is_neither_counted_nor_aggregated() -> None:
    dm = digits_federation(3)
    lost, reference = _fedavg(dm), _fedavg(dm)
    loser = _LoseClient(0)
    accountant = CommunicationAccountant()
    _fit(lost, [FullParticipation(), loser, accountant])
    assert loser.dropped == [0]
    assert accountant.summary()["comm/uplink_messages"] == 2
    assert int(accountant.per_client[0, 0]) == 0 and int(accountant.per_client[0, 1]) > 0

    class _TwoClients(ClientSampler):
        def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
            return Cohort(round_idx=round_idx, client_ids=(1, 2), inclusion_probabilities=torch.ones(2))

    _fit(reference, [_TwoClients()])  # the same round as if client 0 had never been drawn
    assert torch.allclose(flat_parameters(lost.model), flat_parameters(reference.model), atol=1e-7)


def test_a_method_that_sets_its_state_refuses_a_server_optimiser() -> None:
    class _SetsState(FederatedModule):
        sets_server_state = True

    with pytest.raises(ConfigError, match=r"remove method\.server_optimizer"):
        _SetsState(
            model=LogisticRegression(in_features=64, num_classes=10),
            datamodule=digits_federation(4),
            server_optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        )


LIGHTNING_STEP_HOOKS = ("training_step", "on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step")


@pytest.mark.parametrize("name", sorted(methods.__all__))
def test_no_method_overrides_the_round_or_a_batch_hook(name: str) -> None:
    cls = getattr(importlib.import_module("fedlightning.methods"), name)
    for klass in cls.__mro__:
        if klass.__module__.startswith("fedlightning.methods"):
            overridden = [hook for hook in LIGHTNING_STEP_HOOKS if hook in vars(klass)]
            assert not overridden, f"{klass.__name__} overrides {overridden}"
    source = inspect.getsource(importlib.import_module(cls.__module__))
    assert "server_update" not in source and "ClientUpload" not in source


def test_a_round_whose_every_upload_is_lost_leaves_the_server_state_unchanged() -> None:
    class _LoseAll(FederatedCallback):
        def drops_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> bool:
            return round_idx == 1

    dm = digits_federation(3)
    module = _fedavg(dm, server_optimizer=lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9))
    _fit(module, [FullParticipation()], rounds=1)
    after_one = flat_parameters(module.model)
    again = _fedavg(dm, server_optimizer=lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9))
    _fit(again, [FullParticipation(), _LoseAll()], rounds=2)  # round 1 loses everything
    assert torch.equal(flat_parameters(again.model), after_one)  # no stale gradient, no momentum step


def test_the_fedprox_example_of_docs_engine_md_trains_and_shrinks_the_step() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "engine.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/engine.md", "exec"), namespace)
    fedprox = namespace["FedProx"]
    dm = digits_federation(3)

    plain = _one_round_step(fedprox, dm, mu=0.0)
    proximal = _one_round_step(fedprox, dm, mu=1.0)  # lr * mu < 2 keeps the proximal pull stable
    assert torch.allclose(plain, _one_round_step(FedAvg, dm), atol=1e-6)  # mu = 0 is FedAvg
    assert float(proximal.norm()) < 0.8 * float(plain.norm())  # the proximal term holds clients back


def _one_round_step(method: Any, dm: DigitsDataModule, **kwargs: Any) -> Tensor:
    """The global model's change after one round of ``method`` (20 local SGD steps, lr 0.5)."""
    torch.manual_seed(0)
    module = method(
        model=LogisticRegression(in_features=64, num_classes=10),
        datamodule=dm,
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
        local_steps=20,
        batch_size=32,
        **kwargs,
    )
    w0 = flat_parameters(module.model)
    _fit(module, [FullParticipation()])
    return flat_parameters(module.model) - w0


class _OwnMessages(FedAvg):
    """FedAvg whose clients each receive their own message, a copy of the broadcast (so the round is FedAvg's)."""

    per_client_downlink = True

    def client_downlink(self, *, client_id: int, round_idx: int, broadcast: Tensor) -> Tensor:
        return broadcast.clone()


def test_per_client_downlinks_are_each_counted_and_refuse_a_broadcast_compressor(tmp_path: Path) -> None:
    from fedlightning.callbacks.compression import DownlinkCompression
    from fedlightning.compression import NaturalCompression

    dm = digits_federation(3)
    module = _fedavg(dm, method=_OwnMessages)
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    _fit(module, [FullParticipation(), accountant])
    reference = _fedavg(dm)
    _fit(reference, [FullParticipation()])
    assert torch.allclose(flat_parameters(module.model), flat_parameters(reference.model), atol=1e-6)
    with (tmp_path / "records.csv").open() as handle:
        down = [r for r in csv.DictReader(handle) if r["direction"] == "down"]
    assert sorted(int(r["client"]) for r in down) == [0, 1, 2] and {int(r["bits"]) for r in down} == {32 * 650}
    with pytest.raises(ConfigError, match=r"its own message.*use downlink=none"):
        DownlinkCompression(NaturalCompression()).attach(module)


class _NaNClientOne(FedAvg):
    """FedAvg whose client 1 always uploads NaN."""

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> Any:
        result = super().client_update(client_id=client_id, round_idx=round_idx, received=received)
        if client_id == 1:
            result.upload = torch.full_like(result.upload, float("nan"))
        return result


def test_a_quarantined_member_is_not_chosen_and_leaves_the_cohorts_total_weight() -> None:
    dm = digits_federation(4)
    module = _fedavg(dm, method=_NaNClientOne)
    sampler = _LargestUpdateUploads()
    weights: list[float] = []

    class _Weight(FederatedCallback):
        def on_aggregate(self, trainer: Any, module: Any, round_idx: int, aggregator: Any) -> None:
            weights.append(aggregator.total_weight)

    _fit(module, [sampler, _Weight()])
    assert sampler.norms is not None and float(sampler.norms[1]) == 0.0 and bool((sampler.norms[[0, 2, 3]] > 0).all())
    shares = torch.tensor(dm.client_sizes, dtype=torch.float64) / sum(dm.client_sizes)
    assert weights == [pytest.approx(float(shares[[0, 2, 3]].sum()), abs=1e-12)]
    assert module.reliability_summary()["failures/quarantined_total"] == 1


class _CountsVisits(FedAvg):
    """FedAvg whose clients count their local trainings in the client state."""

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> Any:
        visits = self.client_state.get(client_id, "visits", torch.zeros(()))
        self.client_state.set(client_id, "visits", visits + 1)
        return super().client_update(client_id=client_id, round_idx=round_idx, received=received)


def test_a_repeated_attempt_rolls_the_client_state_back() -> None:
    class _RepeatOnce(FederatedCallback):
        repeats_rounds = True

        def __init__(self) -> None:
            self.attempts: list[int] = []

        def round_verdict(self, trainer: Any, module: Any, round_idx: int, attempt: int, aggregator: Any) -> Any:
            self.attempts.append(attempt)
            return "repeat" if attempt == 0 else "apply"

    module = _fedavg(digits_federation(3), method=_CountsVisits)
    repeat = _RepeatOnce()
    _fit(module, [FullParticipation(), repeat])
    assert repeat.attempts == [0, 1]
    assert [float(module.client_state.get(c, "visits")) for c in range(3)] == [1.0, 1.0, 1.0]


def test_the_loss_at_the_start_is_the_initial_models_first_batch_loss_and_travels_in_checkpoints() -> None:
    dm = digits_federation(3)
    module = _fedavg(dm)
    initial = copy.deepcopy(module.model)
    _fit(module, [FullParticipation()])
    losses = []
    for c in range(3):  # one full-batch step: the first batch is the client's whole data
        x, y = dm.client_tensors(c)
        with torch.no_grad():
            losses.append(float(torch.nn.functional.cross_entropy(initial(x), y)))
    assert module.reliability_summary()["divergence/start_loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    checkpoint: dict[str, Any] = {}
    module.on_save_checkpoint(checkpoint)
    fresh = _fedavg(dm)
    fresh.on_load_checkpoint(checkpoint)
    assert fresh.reliability_summary()["divergence/start_loss"] == module.reliability_summary()["divergence/start_loss"]


def test_a_rounds_hooked_callbacks_are_those_defining_the_hook_themselves_in_the_rounds_order() -> None:
    from fedlightning.federated.rounds import RoundState

    class Drops(FederatedCallback):
        def drops_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> bool:
            return client_id == 3

    class DropsToo(Drops):  # inherits its parent's definition: the hook is still not the default
        pass

    plain, first, second = FederatedCallback(), Drops(), DropsToo()
    rnd = RoundState(round_idx=0, callbacks=[first, plain, second])
    assert rnd.hooked("drops_upload") == [first, second]
    assert rnd.hooked("arrival_probability") == []
    assert rnd.hooked("drops_upload") is rnd.hooked("drops_upload")  # asked per client: listed once a round
