"""Client failures (drop-outs, stragglers, quorum) and the divergence guard."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import DigitsDataModule
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator, WeightedMean
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.divergence import DivergenceError, DivergenceGuard
from fedlightning.federated.failures import ClientFailures, bernoulli
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import flat_parameters
from fedlightning.methods import FedAvg
from fedlightning.models import LogisticRegression
from fedlightning.run import run
from fedlightning.sampling import FullParticipation
from tests.conftest import digits_federation, round_trainer

SEED = 0


def _fedavg(dm: DigitsDataModule, method: type[FedAvg] = FedAvg, **kwargs: Any) -> FedAvg:
    """One full-batch SGD step per client (lr 0.1) on logistic regression."""
    torch.manual_seed(0)
    options: dict[str, Any] = {"local_steps": 1, "batch_size": 10_000}
    options.update(kwargs)
    return method(
        model=LogisticRegression(in_features=64, num_classes=10),
        datamodule=dm,
        seed=SEED,
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        **options,
    )


def _fit(module: FederatedModule, callbacks: list[Any], rounds: int = 1) -> None:
    round_trainer(rounds, callbacks).fit(module)


def _drawn(round_idx: int, client_id: int, q: float, kind: str = "dropout", attempt: int = 0) -> bool:
    """The Bernoulli draw recomputed by hand from the run's stream."""
    from fedlightning.federated.rng import torch_generator

    gen = torch_generator(seed=SEED, round_idx=round_idx, client_id=client_id, purpose=f"failures/{kind}/{attempt}")
    return bool(torch.rand((), generator=gen) < q)


class _Spy(FederatedCallback):
    """Records the dropped clients per (round, attempt) and the aggregate of the applied rounds."""

    def __init__(self) -> None:
        self.attempt = 0
        self.dropped: dict[tuple[int, int], list[int]] = {}
        self.aggregates: list[Tensor] = []

    def on_attempt_start(self, trainer: Any, module: Any, round_idx: int, attempt: int) -> None:
        self.attempt = attempt
        self.dropped[(round_idx, attempt)] = []

    def on_upload_dropped(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> None:
        self.dropped[(round_idx, self.attempt)].append(client_id)

    def on_aggregate(self, trainer: Any, module: Any, round_idx: int, aggregator: Aggregator) -> None:
        assert isinstance(aggregator, WeightedMean)
        self.aggregates.append(aggregator.result(torch.float64).clone())


# ---------------------------------------------------------------------------- drop-outs
def test_dropouts_are_the_bernoulli_draws_of_the_run_stream_and_only_their_uploads_go_uncounted(
    tmp_path: Path,
) -> None:
    q, rounds, n = 0.3, 3, 10
    failures, spy = ClientFailures(dropout=q), _Spy()
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    _fit(_fedavg(digits_federation(n)), [FullParticipation(), failures, spy, accountant], rounds=rounds)
    expected = {(r, c) for r in range(rounds) for c in range(n) if _drawn(r, c, q)}
    assert 0 < len(expected) < rounds * n  # the seed draws some, not all
    assert {(r, c) for (r, _), cs in spy.dropped.items() for c in cs} == expected
    assert failures.summary_metrics()["failures/dropped_total"] == len(expected)
    with (tmp_path / "records.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    # The files count rounds from 1; the engine's round_idx (and _drawn) from 0.
    down = {(int(r["round"]) - 1, int(r["client"])) for r in rows if r["direction"] == "down"}
    up = {(int(r["round"]) - 1, int(r["client"])) for r in rows if r["direction"] == "up"}
    assert down == {(r, c) for r in range(rounds) for c in range(n)}  # every broadcast counted
    assert up == down - expected  # no upload of a dropped client
    summary = accountant.summary()
    assert summary["comm/uplink_messages"] == rounds * n - len(expected)
    assert summary["comm/downlink_messages"] == rounds * n


def test_the_normalised_estimator_renormalises_over_the_uploads_that_arrived() -> None:
    n, q = 6, 0.4
    dm = digits_federation(n)
    failures, spy = ClientFailures(dropout=q), _Spy()
    module = _fedavg(dm)
    w0 = flat_parameters(module.model)
    _fit(module, [FullParticipation(), failures, spy])
    arrived = [c for c in range(n) if not _drawn(0, c, q)]
    assert 0 < len(arrived) < n

    class _Arrived(ClientSampler):
        def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
            return Cohort(
                round_idx=round_idx, client_ids=tuple(arrived), inclusion_probabilities=torch.ones(len(arrived))
            )

    reference = _fedavg(dm)
    _fit(reference, [_Arrived()])  # the round as if only the arrived clients had been drawn
    assert torch.allclose(flat_parameters(module.model) - w0, flat_parameters(reference.model) - w0, atol=1e-7)


class _ConstantUploads(FedAvg):
    """Client i uploads the fixed vector (i + 1) · u (no training), so the round's aggregate is the estimator."""

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        upload = torch.linspace(-1.0, 1.0, received.numel()) * (client_id + 1) * 1e-4
        return ClientResult(
            upload=upload, num_samples=len(self.datamodule.client_tensors(client_id)[1]), loss=torch.ones(())
        )


def test_reweighting_makes_the_unbiased_estimator_unbiased_under_dropout() -> None:
    n, q, rounds = 5, 0.3, 100
    dm = digits_federation(n)
    shares = torch.tensor(dm.client_sizes, dtype=torch.float64) / sum(dm.client_sizes)
    u = torch.linspace(-1.0, 1.0, 650, dtype=torch.float64) * 1e-4
    target = float(sum(shares[i] * (i + 1) for i in range(n)))  # Σ w_i Δ_i = target · u
    # Var of the coefficient of u per round: Σ_i (w_i (i+1))² q/(1-q) with reweighting.
    se = math.sqrt(sum(float(shares[i] * (i + 1)) ** 2 for i in range(n)) * q / (1 - q) / rounds)
    means = {}
    for reweight in (True, False):
        spy = _Spy()
        module = _fedavg(dm, method=_ConstantUploads, aggregation="unbiased")
        _fit(module, [FullParticipation(), ClientFailures(dropout=q, reweight=reweight), spy], rounds=rounds)
        coefficients = torch.stack([agg[-1] / u[-1] for agg in spy.aggregates])
        means[reweight] = float(coefficients.mean())
    assert abs(means[True] - target) < 4 * se
    assert abs(means[False] - (1 - q) * target) < 4 * se * (1 - q)  # without it: (1-q) Σ w_i Δ_i
    assert abs(means[False] - target) > 4 * se


def test_reweighting_is_refused_where_the_normalised_estimator_cancels_it() -> None:
    with pytest.raises(ConfigError, match=r"no effect on the normalised estimator.*method\.aggregation=unbiased"):
        _fit(_fedavg(digits_federation(3)), [FullParticipation(), ClientFailures(dropout=0.2, reweight=True)])


# ---------------------------------------------------------------------------- quorum
def test_a_round_below_the_quorum_is_skipped_and_leaves_the_global_model_bitwise_unchanged() -> None:
    n, q = 6, 0.3
    assert any(_drawn(r, c, q) for r in range(2) for c in range(n)) and all(
        any(_drawn(r, c, q) for c in range(n)) for r in range(2)
    )
    module = _fedavg(digits_federation(n), server_optimizer=lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9))
    w0 = flat_parameters(module.model).clone()
    failures = ClientFailures(dropout=q, min_uploads=n, below_quorum="skip")
    _fit(module, [FullParticipation(), failures], rounds=2)
    assert torch.equal(flat_parameters(module.model), w0)
    assert failures.totals["rounds_skipped"] == 2 and failures.totals["rounds_repeated"] == 0
    assert module.global_step == 2  # the skipped rounds count


def test_a_repeated_round_draws_fresh_failures_and_applies_the_attempt_that_reached_the_quorum() -> None:
    n, q = 6, 0.25
    dropped = [[c for c in range(n) if _drawn(0, c, q, attempt=a)] for a in range(4)]
    quorum = n - 1
    first_ok = next(a for a, d in enumerate(dropped) if len(d) <= n - quorum)
    assert first_ok >= 1, "the seed should make attempt 0 miss the quorum"
    dm = digits_federation(n)
    failures, spy = ClientFailures(dropout=q, min_uploads=quorum, below_quorum="repeat", max_retries=3), _Spy()
    accountant = CommunicationAccountant()
    module = _fedavg(dm)
    _fit(module, [FullParticipation(), failures, spy, accountant])
    assert [spy.dropped[(0, a)] for a in range(first_ok + 1)] == dropped[: first_ok + 1]
    assert failures.totals["rounds_repeated"] == first_ok and failures.totals["rounds_skipped"] == 0
    assert accountant.summary()["comm/downlink_messages"] == n * (first_ok + 1)  # each attempt re-sends
    arrived = [c for c in range(n) if c not in dropped[first_ok]]

    class _Arrived(ClientSampler):
        def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
            return Cohort(
                round_idx=round_idx, client_ids=tuple(arrived), inclusion_probabilities=torch.ones(len(arrived))
            )

    reference = _fedavg(dm)
    _fit(reference, [_Arrived()])
    assert torch.allclose(flat_parameters(module.model), flat_parameters(reference.model), atol=1e-7)


# ---------------------------------------------------------------------------- stragglers
class _CountsSteps(FedAvg):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: dict[tuple[int, int], int] = {}

    def local_train(self, *, client_id: int, round_idx: int, **kwargs: Any) -> Any:
        done = super().local_train(client_id=client_id, round_idx=round_idx, **kwargs)
        self.steps[(round_idx, client_id)] = done.steps
        return done


def test_stragglers_complete_the_ceiling_of_their_fraction_of_the_planned_steps() -> None:
    n, s = 6, 0.5
    module = _fedavg(digits_federation(n), method=_CountsSteps, local_steps=5, batch_size=16)
    failures = ClientFailures(straggler_probability=s, straggler_fraction=0.3)
    _fit(module, [FullParticipation(), failures], rounds=2)
    expected = {(r, c): 2 if _drawn(r, c, s, kind="straggler") else 5 for r in range(2) for c in range(n)}
    assert module.steps == expected  # ceil(0.3 * 5) = 2
    assert failures.totals["stragglers"] == sum(v == 2 for v in expected.values()) > 0


def test_stragglers_are_refused_by_methods_that_plan_or_skip_local_training(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"plans each client's local steps"):
        run(make_config(["rounds=1", "method=fedshuffle", "failures=stragglers"]), tmp_path / "a")


# ---------------------------------------------------------------------------- quarantine
class _PoisonsClient(FedAvg):
    """FedAvg whose client ``bad`` uploads NaN in round 0."""

    bad = 1

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        result = super().client_update(client_id=client_id, round_idx=round_idx, received=received)
        if client_id == self.bad and round_idx == 0:
            result.upload = result.upload.clone()
            result.upload[3] = float("nan")
        return result


def test_a_nonfinite_upload_is_quarantined_and_the_aggregate_is_that_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dm = digits_federation(3)
    module = _fedavg(dm, method=_PoisonsClient)
    accountant = CommunicationAccountant()
    with caplog.at_level(logging.WARNING, logger="fedlightning.federated.divergence"):
        _fit(module, [FullParticipation(), accountant])
    assert "Round 1: client 1 produced a non-finite update" in caplog.text
    assert module.reliability_summary()["failures/quarantined_total"] == 1
    assert accountant.summary()["comm/uplink_messages"] == 2 and accountant.summary()["comm/downlink_messages"] == 3

    class _Others(ClientSampler):
        def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
            return Cohort(round_idx=round_idx, client_ids=(0, 2), inclusion_probabilities=torch.ones(2))

    reference = _fedavg(dm)
    _fit(reference, [_Others()])
    assert torch.equal(flat_parameters(module.model), flat_parameters(reference.model))


def test_on_nonfinite_client_stop_ends_the_run_naming_the_client_and_round() -> None:
    module = _fedavg(digits_federation(3), method=_PoisonsClient)
    with pytest.raises(
        DivergenceError, match=r"^Client 1 produced a non-finite update in round 1; lower the client learning rate"
    ):
        _fit(module, [FullParticipation(), DivergenceGuard(on_nonfinite_client="stop")])


# ---------------------------------------------------------------------------- divergence
@pytest.mark.parametrize(
    ("overrides", "sentence"),
    [
        (
            ["method.client_optimizer.lr=1e6", "rounds=3"],
            r"^Training diverged in round 1: .*; lower the client learning rate \(method\.client_optimizer\.lr\) "
            r"from 1e\+06 or set method\.max_grad_norm\.$",
        ),
        (
            ["method=fedadam", "method.server_optimizer.lr=1e38", "rounds=1"],
            r"^The server state became non-finite in round 1; lower the server learning rate "
            r"\(method\.server_optimizer\.lr\) from 1e\+38\.$",
        ),
    ],
    ids=["client_lr_1e6", "server_lr_1e38"],
)
def test_a_diverged_run_stops_with_one_sentence_and_writes_no_summary(
    make_config: Callable[..., DictConfig], tmp_path: Path, overrides: list[str], sentence: str
) -> None:
    with pytest.raises(DivergenceError, match=sentence):
        run(make_config(overrides), tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_an_exploding_validation_loss_after_a_finite_server_step_names_the_server_lr() -> None:
    # SGD(lr=1e6) on the server: the clients' losses and the server state stay finite, the global loss explodes.
    module = _fedavg(digits_federation(3), server_optimizer=lambda p: torch.optim.SGD(p, lr=1e6))
    with pytest.raises(
        DivergenceError, match=r"after round 1: .* validation loss .*server learning rate .* from 1e\+06"
    ):
        _fit(module, [FullParticipation()], rounds=1)


def test_the_summary_carries_the_failure_totals(make_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    summary = run(make_config(["rounds=2", "failures=dropout", "failures.dropout=0.3"]), tmp_path)
    dropped = sum(_drawn(r, c, 0.3) for r in range(2) for c in range(10))
    assert summary["failures/dropped_total"] == dropped > 0
    assert summary["failures/quarantined_total"] == 0 and summary["failures/rounds_skipped_total"] == 0
    assert summary["comm/uplink_messages"] == 20 - dropped


def test_failure_totals_survive_a_checkpoint() -> None:
    failures = ClientFailures(dropout=0.1)
    failures.totals["dropped"] = 7
    restored = ClientFailures(dropout=0.1)
    restored.load_state_dict(failures.state_dict())
    assert restored.summary_metrics()["failures/dropped_total"] == 7


def test_bernoulli_draws_are_pure_functions_of_the_stream() -> None:
    draws = [
        bernoulli(seed=3, round_idx=r, client_id=c, purpose="x", probability=0.5) for r in range(20) for c in range(5)
    ]
    again = [
        bernoulli(seed=3, round_idx=r, client_id=c, purpose="x", probability=0.5) for r in range(20) for c in range(5)
    ]
    assert draws == again and 20 < sum(draws) < 80


# ---------------------------------------------------------------------------- real data (slow)
@pytest.mark.slow
def test_twenty_percent_dropout_on_mnist_keeps_fedavg_within_one_point_and_is_counted(
    shared_data_root: Path, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    base = [
        "data=mnist",
        f"data.root={shared_data_root}",
        "model=mnistfc",
        "partition=iid",
        "data.num_clients=10",
        "sampler=full",
        "rounds=10",
    ]
    plain = run(make_config(base), tmp_path / "plain")
    lossy = run(make_config([*base, "failures=dropout", "failures.dropout=0.2"]), tmp_path / "dropout")
    expected = sum(_drawn(r, c, 0.2) for r in range(10) for c in range(10))
    print(
        f"no drop-out: test/acc {plain['test/acc']:.4f}; 20% drop-out: test/acc {lossy['test/acc']:.4f}, "
        f"dropped {lossy['failures/dropped_total']} of 100 uploads, uplink messages {lossy['comm/uplink_messages']}, "
        f"downlink messages {lossy['comm/downlink_messages']}, "
        f"wall {plain['time/wall_s']:.0f} s / {lossy['time/wall_s']:.0f} s"
    )
    assert lossy["failures/dropped_total"] == expected > 0
    assert lossy["comm/uplink_messages"] == 100 - expected and lossy["comm/downlink_messages"] == 100
    assert lossy["failures/rounds_skipped_total"] == 0 and lossy["failures/quarantined_total"] == 0
    assert abs(lossy["test/acc"] - plain["test/acc"]) <= 0.01


@pytest.mark.slow
def test_two_processes_draw_the_same_failures_as_one(make_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    from tests.test_distributed import final_state, records, run_two_processes

    overrides = [
        "rounds=3",
        "failures=stragglers",
        "failures.dropout=0.3",
        "failures.min_uploads=8",
        "failures.below_quorum=repeat",
        "failures.max_retries=1",
    ]
    one = run(make_config(overrides), tmp_path / "one")
    two = run_two_processes(overrides, tmp_path / "two")
    assert two["processes"] == 2
    keys = [k for k in one if k.startswith("failures/")]
    assert {k: two[k] for k in keys} == {k: one[k] for k in keys}
    assert one["failures/dropped_total"] > 0 and one["failures/stragglers_total"] > 0
    assert one["failures/rounds_repeated_total"] + one["failures/rounds_skipped_total"] > 0
    assert records(tmp_path / "two") == records(tmp_path / "one")
    a, b = final_state(tmp_path / "one"), final_state(tmp_path / "two")
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), rtol=1e-5, atol=1e-6), name
