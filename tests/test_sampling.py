"""Client samplers: the optimal probabilities by hand, AOCS against OCS, and every sampler's unbiasedness."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.errors import ConfigError
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.params import flat_parameters
from fedlightning.federated.rng import torch_generator
from fedlightning.run import run
from fedlightning.sampling import (
    ApproximateOptimalClientSampler,
    FullParticipation,
    ImportanceSampler,
    IndependentSampler,
    OptimalClientSampler,
    UniformSampler,
)
from fedlightning.sampling.probabilities import (
    aocs_probabilities,
    capped_proportional,
    improvement_factor,
    independent_sampling_variance,
    optimal_probabilities,
)
from tests.conftest import digits_federation, round_trainer
from tests.test_round_phases import _fedavg


# ---------------------------------------------------------------------------- (6.7) by hand
@pytest.mark.parametrize(
    ("scores", "m", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 2, [0.5, 0.5, 0.5, 0.5]),  # l = n: p_i = m ũ_i / Σ ũ
        ([1.0, 1.0, 1.0, 10.0], 2, [1 / 3, 1 / 3, 1 / 3, 1.0]),  # the largest saturates, l = 3
        ([0.0, 1.0, 2.0, 3.0], 2, [0.0, 1 / 3, 2 / 3, 1.0]),  # zero update gets 0; 2·3 ≤ 6 keeps l = 4
        ([4.0, 1.0, 9.0, 8.0, 2.0], 3, [4 / 7, 1 / 7, 1.0, 1.0, 2 / 7]),  # two saturate: (3 + 3 − 5)·ũ/7
        ([0.0, 0.0, 5.0, 1.0], 2, [0.0, 0.0, 1.0, 1.0]),  # at most m non-zero updates: all of them send
    ],
)
def test_optimal_probabilities_match_the_water_filling_solution_by_hand(
    scores: list[float], m: int, expected: list[float]
) -> None:
    p = optimal_probabilities(torch.tensor(scores), m)
    assert torch.allclose(p, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_optimal_probabilities_sum_to_m_saturate_the_largest_and_are_proportional_elsewhere() -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        u = torch.exp(2.0 * torch.randn(32, generator=gen, dtype=torch.float64))
        p = optimal_probabilities(u, 3)
        assert float(p.sum()) == pytest.approx(3.0, abs=1e-12) and bool((p <= 1).all()) and bool((p > 0).all())
        free = p < 1
        ratio = p[free] / u[free]
        assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-10)
        if bool((~free).any()):  # saturated clients hold the largest norms
            assert float(u[~free].min()) >= float(u[free].max())


def test_optimal_probabilities_minimise_the_independent_sampling_variance() -> None:
    # Any feasible move (Σ p fixed, 0 < p ≤ 1) from the solution increases V(p).
    gen = torch.Generator().manual_seed(0)
    u = torch.exp(torch.randn(12, generator=gen, dtype=torch.float64))
    p = optimal_probabilities(u, 3)
    best = independent_sampling_variance(u, p)
    for _ in range(200):
        i, j = torch.randperm(12, generator=gen)[:2].tolist()
        step = 0.05 * float(torch.rand((), generator=gen, dtype=torch.float64))
        q = p.clone()
        q[i] += step
        q[j] -= step
        if float(q[i]) <= 1 and float(q[j]) > 0:
            assert independent_sampling_variance(u, q) > best


def test_aocs_with_four_iterations_reproduces_ocs_on_heavy_tailed_norms() -> None:
    gen = torch.Generator().manual_seed(1)
    u = torch.exp(2.5 * torch.randn(32, generator=gen, dtype=torch.float64))
    exact = optimal_probabilities(u, 3)
    approx = aocs_probabilities(u, 3, j_max=4)
    assert float(approx.probabilities.sum()) == pytest.approx(3.0, abs=1e-9)
    assert torch.allclose(approx.probabilities, exact, atol=1e-9)
    # Each iteration's (I, P) is the sum of what the clients reported.
    for (count, mass), reports in zip(approx.sums, approx.reports, strict=True):
        assert count == float(reports[:, 0].sum()) and mass == pytest.approx(float(reports[:, 1].sum()))


def test_aocs_without_iterations_is_the_capped_first_guess() -> None:
    u = torch.tensor([1.0, 1.0, 1.0, 10.0], dtype=torch.float64)
    result = aocs_probabilities(u, 2, j_max=0)
    assert result.iterations == 0
    assert torch.allclose(result.probabilities, torch.tensor([2 / 13, 2 / 13, 2 / 13, 1.0], dtype=torch.float64))


def test_improvement_factor_is_one_for_equal_norms_and_zero_with_at_most_m_updates() -> None:
    u = torch.ones(10)
    assert improvement_factor(u, optimal_probabilities(u, 3), 3) == pytest.approx(1.0)
    sparse = torch.tensor([0.0] * 8 + [1.0, 2.0])
    assert improvement_factor(sparse, optimal_probabilities(sparse, 3), 3) == 0.0
    skewed = torch.tensor([1.0] * 9 + [100.0])
    alpha = improvement_factor(skewed, optimal_probabilities(skewed, 3), 3)
    assert 0.0 < alpha < 0.05  # the one large update is always sent


def test_capped_proportional_is_the_limit_of_iterative_renormalisation() -> None:
    w = torch.tensor([50.0, 30.0, 10.0, 5.0, 3.0, 2.0], dtype=torch.float64)
    p = 3 * w / w.sum()
    for _ in range(50):  # p ← min(p·b/Σp, 1)
        p = torch.clamp(p * 3 / p.sum(), max=1.0)
    assert torch.allclose(capped_proportional(w, 3), p, atol=1e-12)


# ---------------------------------------------------------------------------- unbiasedness
class _Federation:
    """The parts of a federated module a sampler reads: clients, their shares and random streams."""

    def __init__(self, sizes: list[int]) -> None:
        self.num_clients = len(sizes)
        self.datamodule = type("DM", (), {"client_sizes": sizes})()
        self.total = sum(sizes)

    def client_share(self, *, client_id: int, num_samples: int) -> float:
        return num_samples / self.total

    def generator(self, round_idx: int, client_id: int, purpose: str) -> torch.Generator:
        return torch_generator(seed=0, round_idx=round_idx, client_id=client_id, purpose=purpose)


SIZES = [5, 40, 12, 3, 25, 8, 60, 7, 15, 30]
DRAWS = 2500


def _updates() -> Tensor:
    gen = torch.Generator().manual_seed(7)
    scale = torch.exp(torch.randn(len(SIZES), 1, generator=gen, dtype=torch.float64))
    return scale * torch.randn(len(SIZES), 3, generator=gen, dtype=torch.float64)


def _estimate(fed: _Federation, sampler: ClientSampler, round_idx: int, updates: Tensor) -> Tensor:
    """Σ_{uploaders} w_i / P(i uploads) · U_i: the unbiased estimator of Σ_i w_i U_i."""
    cohort = sampler.select_cohort(None, fed, round_idx)  # type: ignore[arg-type]
    probability = dict(zip(cohort.client_ids, cohort.inclusion_probabilities.double().tolist(), strict=True))
    if sampler.chooses_uploaders:
        norms = updates[list(cohort.client_ids)].norm(dim=1)
        choice = sampler.choose_uploaders(None, fed, cohort, norms)  # type: ignore[arg-type]
        chosen = choice.uploaders
        probability = {
            c: probability[c] * q
            for c, q in zip(chosen.client_ids, chosen.inclusion_probabilities.double().tolist(), strict=True)
        }
    total = torch.zeros(updates.shape[1], dtype=torch.float64)
    for c, p in probability.items():
        total += SIZES[c] / fed.total / p * updates[c]
    return total


def _prepared(sampler: ClientSampler, fed: _Federation) -> ClientSampler:
    sampler.setup(None, fed, "fit")  # type: ignore[arg-type]
    return sampler


@pytest.mark.parametrize(
    "make",
    [
        FullParticipation,
        lambda: UniformSampler(clients_per_round=3),
        lambda: IndependentSampler(clients_per_round=3),
        lambda: IndependentSampler(probabilities=[0.2, 0.9, 0.5, 0.1, 0.6, 0.3, 1.0, 0.25, 0.4, 0.7]),
        lambda: ImportanceSampler(clients_per_round=3),
        lambda: OptimalClientSampler(expected_uploaders=3),
        lambda: ApproximateOptimalClientSampler(expected_uploaders=3, j_max=1),
        lambda: OptimalClientSampler(expected_uploaders=2, cohort_size=6),
    ],
    ids=["full", "uniform", "independent", "independent_given_p", "importance", "ocs", "aocs_j1", "ocs_cohort6"],
)
def test_every_sampler_gives_an_unbiased_estimate_of_the_full_aggregate(make: Callable[[], ClientSampler]) -> None:
    fed = _Federation(SIZES)
    sampler = _prepared(make(), fed)
    updates = _updates()
    shares = torch.tensor(SIZES, dtype=torch.float64) / fed.total
    full = (shares[:, None] * updates).sum(dim=0)
    draws = torch.stack([_estimate(fed, sampler, r, updates) for r in range(DRAWS)])
    # 4.5 standard errors of the mean of the draws, per coordinate (fixed seeds: deterministic).
    tolerance = 4.5 * draws.std(dim=0) / math.sqrt(len(draws)) + 1e-12
    assert bool(((draws.mean(dim=0) - full).abs() <= tolerance).all()), (draws.mean(dim=0), full, tolerance)


def test_ocs_estimator_variance_matches_the_closed_form_and_beats_uniform() -> None:
    fed = _Federation(SIZES)
    updates = _updates()
    shares = torch.tensor(SIZES, dtype=torch.float64) / fed.total
    scores = shares * updates.norm(dim=1)
    full = (shares[:, None] * updates).sum(dim=0)
    results = {}
    for name, sampler in {
        "ocs": OptimalClientSampler(expected_uploaders=3),
        "independent": IndependentSampler(clients_per_round=3),
    }.items():
        _prepared(sampler, fed)
        draws = torch.stack([_estimate(fed, sampler, r, updates) for r in range(DRAWS)])
        results[name] = float(((draws - full) ** 2).sum(dim=1).mean())
    predicted_ocs = independent_sampling_variance(scores, optimal_probabilities(scores.float().double(), 3))
    predicted_uniform = independent_sampling_variance(scores, torch.full((10,), 0.3, dtype=torch.float64))
    assert results["ocs"] == pytest.approx(predicted_ocs, rel=0.1)
    assert results["independent"] == pytest.approx(predicted_uniform, rel=0.1)
    assert results["ocs"] < results["independent"]


def test_samplers_refuse_settings_they_cannot_honour() -> None:
    fed = _Federation([10, 10, 10, 10])
    with pytest.raises(ConfigError, match="lets every client upload"):
        _prepared(OptimalClientSampler(expected_uploaders=4), fed)
    with pytest.raises(ConfigError, match=r"exceeds data\.num_clients"):
        _prepared(OptimalClientSampler(expected_uploaders=2, cohort_size=5), fed)
    with pytest.raises(ConfigError, match="either clients_per_round"):
        IndependentSampler(clients_per_round=2, probabilities=[0.5] * 4)
    with pytest.raises(ConfigError, match=r"in \(0, 1\]"):
        IndependentSampler(probabilities=[0.5, 0.0, 0.5, 0.5])
    with pytest.raises(ConfigError, match="lists 3 clients"):
        _prepared(IndependentSampler(probabilities=[0.5] * 3), fed)


# ---------------------------------------------------------------------------- through the engine
def _records(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("sampler_cls", [OptimalClientSampler, ApproximateOptimalClientSampler])
def test_fedavg_with_ocs_applies_chosen_updates_over_q_normalised_by_everyone_who_computed(
    sampler_cls: type[OptimalClientSampler], tmp_path: Path
) -> None:
    dm = digits_federation(6)
    module = _fedavg(dm)
    w0 = flat_parameters(module.model).clone()
    deltas = {c: module.client_update(client_id=c, round_idx=0, received=w0).upload for c in range(6)}
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    round_trainer(1, [sampler_cls(expected_uploaders=2), accountant]).fit(module)
    rows = _records(tmp_path / "records.csv")
    uploads = {
        int(r["client"]): float(r["probability"]) for r in rows if r["kind"] == "payload" and r["direction"] == "up"
    }
    assert uploads, "no client uploaded"
    n = sum(dm.client_sizes)
    expected = sum(dm.client_sizes[c] / n / q * deltas[c] for c, q in uploads.items())  # Σ_cohort w_i = 1
    assert torch.allclose(flat_parameters(module.model) - w0, expected, atol=1e-6)
    # OCS: each client sends its norm and receives q_i (one float each way); AOCS adds u and the sums.
    control = [r for r in rows if r["kind"] == "control"]
    assert sorted({int(r["client"]) for r in control}) == list(range(6))
    up_bits = {int(r["bits"]) for r in control if r["direction"] == "up"}
    if sampler_cls is OptimalClientSampler:
        assert up_bits == {32} and {int(r["bits"]) for r in control if r["direction"] == "down"} == {32}
    else:
        assert len(up_bits) == 1 and (up_bits.pop() - 32) % 64 == 0  # ũ_i, then (1, p_i) or (0, 0) per iteration
    payload_up = sum(int(r["bits"]) for r in rows if r["kind"] == "payload" and r["direction"] == "up")
    control_up = sum(int(r["bits"]) for r in control if r["direction"] == "up")
    assert accountant.summary()["comm/uplink_bits_total"] == payload_up + control_up
    assert accountant.summary()["comm/uplink_control_bits_total"] == control_up


def test_a_method_whose_server_step_is_not_a_weighted_mean_refuses_ocs(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(["method=diana", "sampler=ocs", "clients_per_round=2", "rounds=1", "data.num_clients=4"])
    with pytest.raises(ConfigError, match="chooses uploaders after local work, which DIANA does not support"):
        run(cfg, tmp_path)


@pytest.mark.parametrize("sampler", ["independent", "importance", "ocs", "aocs"])
def test_each_sampler_config_trains_fedavg_on_digits(
    sampler: str, make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config([f"sampler={sampler}", "clients_per_round=3", "rounds=5", "method.aggregation=unbiased"])
    summary = run(cfg, tmp_path)
    assert summary["test/acc"] > 0.3  # 3x chance after 5 rounds (full participation: 0.50)
    if sampler in ("ocs", "aocs"):
        assert summary["comm/uplink_control_bits_total"] > 0


def test_cohort_helpers_are_deterministic_per_round() -> None:
    fed = _Federation(SIZES)
    sampler = _prepared(IndependentSampler(clients_per_round=4), fed)
    first = sampler.select_cohort(None, fed, 5)  # type: ignore[arg-type]
    again = sampler.select_cohort(None, fed, 5)  # type: ignore[arg-type]
    assert isinstance(first, Cohort) and first.client_ids == again.client_ids


def test_ocs_uploads_go_through_the_uplink_compressor_and_norms_are_counted_apart(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(["sampler=ocs", "clients_per_round=3", "rounds=2", "compressor=natural", "model=digits_logreg"])
    summary = run(cfg, tmp_path)
    rows = _records(tmp_path / "comm_records.csv")
    payload = [r for r in rows if r["kind"] == "payload" and r["direction"] == "up"]
    control = [r for r in rows if r["kind"] == "control" and r["direction"] == "up"]
    assert payload and {int(r["bits"]) for r in payload} == {9 * 650}  # C_nat: 9 bits per entry
    assert len(control) == 2 * 10 and {int(r["bits"]) for r in control} == {32}  # every client, every round
    assert all(0 < float(r["probability"]) <= 1 for r in payload)
    assert summary["comm/uplink_bits_total"] == 9 * 650 * len(payload) + 32 * len(control)


@pytest.mark.slow
def test_ocs_on_mnist_matches_full_participation_within_a_point_with_four_times_fewer_uplink_bits(
    make_config: Callable[..., DictConfig], shared_data_root: Path, tmp_path: Path
) -> None:
    # 100 clients with Dirichlet(0.1) label skew, 10 expected uploaders, 50 rounds (about 20 minutes).
    base = ["+experiment=ocs_mnist", f"data.root={shared_data_root}"]
    full = run(make_config([*base, "sampler=full"]), tmp_path / "full")
    ocs = run(make_config([*base, "sampler=ocs"]), tmp_path / "ocs")
    assert ocs["test/acc"] >= full["test/acc"] - 0.01
    assert ocs["comm/uplink_bits_total"] * 4 <= full["comm/uplink_bits_total"]  # norms included
    assert ocs["comm/uplink_control_bits_total"] == 32 * 100 * 50


class _LoseFirstUpload(FederatedCallback):
    """Loses the first upload of the run (a chosen client whose message never arrives)."""

    def __init__(self) -> None:
        self.lost: int | None = None

    def drops_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int) -> bool:
        if self.lost is None:
            self.lost = client_id
            return True
        return False


def test_a_lost_ocs_upload_still_counts_in_the_total_weight_of_those_who_computed(tmp_path: Path) -> None:
    dm = digits_federation(6)
    module = _fedavg(dm)
    w0 = flat_parameters(module.model).clone()
    deltas = {c: module.client_update(client_id=c, round_idx=0, received=w0).upload for c in range(6)}
    loser = _LoseFirstUpload()
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    round_trainer(1, [OptimalClientSampler(expected_uploaders=3), loser, accountant]).fit(module)
    rows = _records(tmp_path / "records.csv")
    sent = {
        int(r["client"]): float(r["probability"]) for r in rows if r["kind"] == "payload" and r["direction"] == "up"
    }
    assert loser.lost is not None and loser.lost not in sent and sent
    n = sum(dm.client_sizes)
    expected = sum(dm.client_sizes[c] / n / q * deltas[c] for c, q in sent.items())  # denominator Σ_cohort w_i = 1
    assert torch.allclose(flat_parameters(module.model) - w0, expected, atol=1e-6)
