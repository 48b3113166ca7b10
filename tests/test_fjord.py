"""FjORD and eFD (arXiv 2102.13451; thesis arXiv 2207.00392, ch. 7): tiers, slice traffic, slice-wise aggregation."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import DigitsDataModule
from fedlightning.errors import ConfigError
from fedlightning.federated.params import flat_parameters
from fedlightning.methods.fjord import (
    ExtendedFederatedDropout,
    FjORD,
    SliceWeightedMean,
    assign_tiers,
    tier_fractions,
)
from fedlightning.models.ordered_dropout import od_index_set, od_width, ordered_units
from fedlightning.models.presets import build_model
from fedlightning.run import run
from fedlightning.sampling import FullParticipation
from tests.conftest import digits_federation, round_trainer

WIDTHS = [0.2, 0.4, 0.6, 0.8, 1.0]


def _module(dm: DigitsDataModule, method: type[FjORD] = FjORD, **kwargs: Any) -> FjORD:
    torch.manual_seed(0)
    options: dict[str, Any] = {
        "client_optimizer": lambda p: torch.optim.SGD(p, lr=0.5),
        "local_steps": 3,
        "batch_size": 16,
    }
    options.update(kwargs)
    return method(model=build_model("digits_mlp", input_shape=(1, 8, 8), num_classes=10), datamodule=dm, **options)


def _records(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_tier_fractions_follow_the_drop_scale() -> None:
    assert tier_fractions(5, 1.0) == [0.2] * 5
    assert tier_fractions(5, 0.5) == [0.1, 0.1, 0.1, 0.1, 0.6]
    assert tier_fractions(10, 0.5) == [0.05] * 9 + [0.55]
    with pytest.raises(ValueError, match="drop_scale"):
        tier_fractions(5, 1.5)


def test_tiers_are_exact_counts_and_a_pure_function_of_the_seed() -> None:
    tiers = assign_tiers(100, tier_fractions(5, 0.5), torch.Generator().manual_seed(3))
    assert [tiers.count(t) for t in range(5)] == [10, 10, 10, 10, 60]
    assert tiers == assign_tiers(100, tier_fractions(5, 0.5), torch.Generator().manual_seed(3))
    assert tiers != assign_tiers(100, tier_fractions(5, 0.5), torch.Generator().manual_seed(4))
    assert [assign_tiers(7, [0.2] * 5, torch.Generator().manual_seed(0)).count(t) for t in range(5)] == [1, 1, 1, 2, 2]
    dm = digits_federation(10)
    assert _module(dm).client_tier == _module(dm).client_tier  # every process and every resume builds the same


def test_slice_weighted_mean_averages_each_coordinate_over_the_uploads_that_hold_it() -> None:
    # Nested slices of a 4-vector: client a holds {0, 1} (weight 1), b holds {0, 1, 2} (weight 3); nobody holds 3.
    agg = SliceWeightedMean(dim=4)
    agg.expect(torch.tensor([0, 1]))
    agg.accumulate(torch.tensor([2.0, -4.0]), weight=1.0)
    agg.expect(torch.tensor([0, 1, 2]))
    agg.accumulate(torch.tensor([6.0, 4.0, 5.0]), weight=3.0)
    assert agg.result().tolist() == [5.0, 2.0, 5.0, 0.0]  # (2 + 18)/4, (-4 + 12)/4, 15/3, kept
    assert agg.coverage().tolist() == [4.0, 4.0, 3.0, 0.0] and agg.count == 2
    agg.all_reduce(lambda t: 2 * t)  # two identical processes: same mean, twice the uploads
    assert agg.result().tolist() == [5.0, 2.0, 5.0, 0.0] and agg.count == 4
    with pytest.raises(RuntimeError, match="index set"):
        agg.accumulate(torch.tensor([1.0]), weight=1.0)


def test_every_client_sends_and_receives_exactly_its_slice_in_float32(tmp_path: Path) -> None:
    dm = digits_federation(10)
    module = _module(dm)
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    round_trainer(2, [FullParticipation(), accountant]).fit(module)
    template = build_model("digits_mlp", input_shape=(1, 8, 8), num_classes=10)
    slice_bits = {p: 32 * int(od_index_set(template, p).numel()) for p in WIDTHS}
    rows = _records(tmp_path / "records.csv")
    assert len(rows) == 2 * 2 * dm.num_clients
    for row in rows:
        expected = slice_bits[WIDTHS[module.client_tier[int(row["client"])]]]
        assert int(row["bits"]) == expected and row["codec"] == "float32", row
    assert sorted({int(r["bits"]) for r in rows}) == sorted(slice_bits[WIDTHS[t]] for t in set(module.client_tier))


def test_coordinates_outside_every_uploaders_slice_keep_their_value() -> None:
    dm = digits_federation(4)
    module = _module(dm, tiers=[0.4])  # every client can run F_0.4 at most
    before = flat_parameters(module.model)
    round_trainer(1, [FullParticipation()]).fit(module)
    after = flat_parameters(module.model)
    inside = od_index_set(module.model, 0.4)
    outside = torch.ones_like(before, dtype=torch.bool)
    outside[inside] = False
    assert torch.equal(after[outside], before[outside])
    assert (after[inside] != before[inside]).float().mean() > 0.5


def test_the_round_is_the_slice_wise_weighted_mean_of_the_clients_trained_slices() -> None:
    dm = digits_federation(3)
    module = _module(dm, tiers=[0.2, 0.6, 1.0], widths=[0.2, 0.6, 1.0])
    w0 = flat_parameters(module.model)
    results = {}
    for cid in range(3):  # each client's own round from the same start, outside the engine
        idx = module.client_indices(cid, 0)
        results[cid] = (idx, module.client_update(client_id=cid, round_idx=0, received=w0[idx].clone()).upload)
    module.client_model.load_state_dict(module.model.state_dict())
    round_trainer(1, [FullParticipation()]).fit(module)
    num = torch.zeros_like(w0, dtype=torch.float64)
    den = torch.zeros_like(w0, dtype=torch.float64)
    for cid, (idx, delta) in results.items():
        n = dm.client_sizes[cid]
        num[idx] += n * delta.double()
        den[idx] += n
    expected = w0 + torch.where(den > 0, num / den.clamp_min(1), torch.zeros_like(num)).float()
    assert torch.allclose(flat_parameters(module.model), expected, atol=1e-6)


def test_local_widths_are_uniform_over_those_the_client_can_run() -> None:
    dm = digits_federation(10)
    module = _module(dm)
    client = module.client_tier.index(2)  # a p_max = 0.6 client
    assert module.candidates(client) == [0.2, 0.4, 0.6] and module.teacher_width(client) == 0.6
    seen: list[int] = []
    module.arch.forward = lambda model, x, units: seen.append(int(units[0].numel())) or torch.zeros(len(x), 10)  # type: ignore[method-assign]
    module.distillation = False
    loss = module.step_loss(module.client_model, client_id=client, round_idx=0)
    x, y = torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)
    draws = 3000
    for _ in range(draws):
        loss(x, y)
    counts = [seen.count(od_width(p, 64)) for p in (0.2, 0.4, 0.6)]
    sd = math.sqrt(draws * (1 / 3) * (2 / 3))
    assert sum(counts) == draws and all(abs(c - draws / 3) < 4 * sd for c in counts), counts


def test_self_distillation_loss_is_the_teachers_ce_plus_kl_to_the_detached_teacher() -> None:
    dm = digits_federation(10)
    module = _module(dm)
    client = module.client_tier.index(4)  # p_max = 1: teacher F_1
    model = module.client_model
    x, y = dm.client_tensors(client)
    x, y = x[:8], y[:8]
    loss = module.step_loss(model, client_id=client, round_idx=0)(x, y)
    gen = module.generator(0, client, "fjord_width")
    p = WIDTHS[int(torch.randint(5, (1,), generator=gen))]
    student = module.arch.forward(model, x, ordered_units(module.arch.widths(), p))
    teacher = module.arch.forward(model, x, ordered_units(module.arch.widths(), 1.0))
    kl = (F.softmax(teacher, 1) * (F.log_softmax(teacher, 1) - F.log_softmax(student, 1))).sum(1).mean()
    expected = F.cross_entropy(teacher, y) + (kl if p < 1.0 else 0.0)
    assert torch.allclose(loss, expected, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"widths": [0.0, 0.5, 1.0]}, r"outside \(0, 1\]"),
        ({"widths": [0.5, 1.2]}, r"outside \(0, 1\]"),
        ({"widths": [0.6, 0.4]}, "strictly ascending"),
        ({"widths": [0.4, 1.0], "tiers": [0.2, 1.0]}, "below the smallest width"),
        ({"aggregation": "unbiased"}, "normalised"),
        ({"adaptive_dropout": 1.0}, "adaptive_dropout"),
        ({"drop_scale": 0.0}, "drop_scale"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_sentence(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        _module(digits_federation(10), **overrides)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(".")


def test_a_model_without_ordered_dropout_is_refused(make_config: Callable[..., DictConfig], tmp_path: Path) -> None:
    cfg = make_config(["method=fjord", "model=digits_logreg", "rounds=1"])
    with pytest.raises(ConfigError, match="no sub-models of LogisticRegression"):
        run(cfg, tmp_path)


def test_adaptive_dropout_lets_a_tier_sample_the_next_width_with_random_units() -> None:
    dm = digits_federation(10)
    module = _module(dm, adaptive_dropout=0.25)
    tier_06, tier_04 = module.client_tier.index(2), module.client_tier.index(1)
    assert module.candidates(tier_06) == [0.2, 0.4, 0.6, 0.8]  # 0.6 / 0.75 = 0.8
    assert module.candidates(tier_04) == [0.2, 0.4]  # 0.4 / 0.75 < 0.6
    assert torch.equal(module.client_indices(tier_06, 0), od_index_set(module.model, 0.8))
    seen: list[list[int]] = []
    module.arch.forward = lambda model, x, units: seen.append(units[0].tolist()) or torch.zeros(len(x), 10)  # type: ignore[method-assign]
    module.distillation = False
    loss = module.step_loss(module.client_model, client_id=tier_06, round_idx=0)
    for _ in range(200):
        loss(torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long))
    dropped = [u for u in seen if u != list(range(len(u)))]
    assert dropped and all(len(u) == od_width(0.6, 64) and max(u) < od_width(0.8, 64) for u in dropped)


def test_efd_clients_below_the_width_send_and_receive_a_random_sub_model_of_their_size(tmp_path: Path) -> None:
    dm = digits_federation(10)
    module = _module(dm, method=ExtendedFederatedDropout, width=0.8)
    accountant = CommunicationAccountant(records_path=tmp_path / "records.csv")
    round_trainer(2, [FullParticipation(), accountant]).fit(module)
    template = build_model("digits_mlp", input_shape=(1, 8, 8), num_classes=10)
    full = int(od_index_set(template, 0.8).numel())
    per_unit = full // od_width(0.8, 64)  # digits_mlp: each hidden unit carries 64 + 1 + 10 weights
    for row in _records(tmp_path / "records.csv"):
        p_max = WIDTHS[module.client_tier[int(row["client"])]]
        units = od_width(min(p_max, 0.8), 64)
        assert int(row["bits"]) == 32 * (units * per_unit + 10), row
    weak = module.client_tier.index(0)
    a, b = module.client_indices(weak, 5), module.client_indices(weak, 6)
    assert a.numel() == b.numel() and not torch.equal(a, b)  # a fresh random sub-model each round
    assert set(a.tolist()) <= set(od_index_set(template, 0.8).tolist())


def test_fjord_trains_on_digits_and_reports_accuracy_at_every_width(
    make_config: Callable[..., DictConfig], tmp_path: Path
) -> None:
    cfg = make_config(
        [
            "method=fjord",
            "model=digits_mlp",
            "rounds=8",
            "eval_every=8",
            "data.num_clients=10",
            "method.client_optimizer.lr=0.5",
        ]
    )
    summary = run(cfg, tmp_path)
    accs = [summary[f"test/acc@{p}"] for p in WIDTHS]
    assert summary["val/acc"] == summary["val/acc@1.0"] and summary["test/acc"] == summary["test/acc@1.0"]
    assert min(accs) > 0.6, accs  # chance is 0.1


def test_a_layer_wise_uplink_compressor_sees_each_layers_part_of_a_slice() -> None:
    from fedlightning.callbacks.compression import UplinkCompression
    from fedlightning.compression import NaturalCompression
    from fedlightning.compression.operators import Blockwise

    module = _module(digits_federation(10))
    UplinkCompression(NaturalCompression()).attach(module)
    n = int(od_index_set(module.model, 0.2).numel())
    operator = module.uplink_channel.operator(n)
    assert isinstance(operator, Blockwise)
    k = od_width(0.2, 64)
    assert operator.sizes == [k * 64, k, 10 * k, 10]  # the kept parts of W1, b1, W2, b2


def test_a_downlink_compressor_is_refused_because_each_client_gets_its_own_slice() -> None:
    from fedlightning.callbacks.compression import DownlinkCompression
    from fedlightning.compression import NaturalCompression

    with pytest.raises(ConfigError, match=r"its own message.*use downlink=none"):
        DownlinkCompression(NaturalCompression()).attach(_module(digits_federation(10)))
