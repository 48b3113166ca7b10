"""E-FLoPS: wire format, server rebuild, end-to-end Golub run with exact bits both ways."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlightning.callbacks.declared import declared_callbacks
from fedlightning.callbacks.sparse_report import SparseModelReport
from fedlightning.compression.gated_sparse import GateMessageCodec, pack_gate_state, unpack_gate_state
from fedlightning.compression.index_coding import encode_positions
from fedlightning.compression.operators import Sign
from fedlightning.errors import ConfigError
from fedlightning.federated.params import flat_parameters
from fedlightning.federated.payloads import Payload
from fedlightning.methods.eflops import EFLoPS
from fedlightning.methods.eflops_aggregation import GatedUploadSums, aggregate_gated_uploads
from fedlightning.methods.eflops_off_support import expand_groups, off_support_means
from fedlightning.methods.eflops_support import gated_top_m
from fedlightning.models.hard_concrete import (
    expected_gate,
    expected_gate_tail,
    gate_survival,
    prob_nonzero,
    test_gate,
)
from fedlightning.run import run


def test_codec_roundtrip_and_exact_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    dim = 1000
    support = torch.zeros(dim, dtype=torch.bool)
    support[torch.randperm(dim, generator=gen)[:20]] = True
    theta = torch.randn(dim, generator=gen)
    pi = torch.rand(dim, generator=gen) * 0.9 + 0.05
    x = pack_gate_state(theta, pi, support, 0.7)
    msg = GateMessageCodec().encode(x)
    assert torch.equal(msg.decode(), x)
    _, pos_bits = encode_positions(torch.nonzero(support).reshape(-1), dim)
    assert msg.num_bits == pos_bits + 20 * 64 + 32  # positions + (theta, pi) float32 + lambda
    _, _, s, _, lam = unpack_gate_state(msg.decode())
    assert torch.equal(s, support) and float(lam) == pytest.approx(0.7)


def test_codec_with_off_support_statistics_counts_32_bits_each() -> None:
    gen = torch.Generator().manual_seed(1)
    dim, sizes = 100, [60, 30, 10]
    support = torch.zeros(dim, dtype=torch.bool)
    support[torch.randperm(dim, generator=gen)[:5]] = True
    theta, pi = torch.randn(dim, generator=gen), torch.rand(dim, generator=gen) * 0.9 + 0.05
    pi_off = off_support_means(pi, support, sizes, fallback=0.0)
    x = pack_gate_state(theta, pi, support, -0.3, pi_off)
    msg = GateMessageCodec(num_groups=3).encode(x)
    assert torch.equal(msg.decode(), x)
    _, pos_bits = encode_positions(torch.nonzero(support).reshape(-1), dim)
    assert msg.num_bits == pos_bits + 5 * 64 + 3 * 32 + 32  # + one float32 per parameter tensor
    _, _, s, off, lam = unpack_gate_state(msg.decode(), 3)
    assert torch.equal(s, support) and torch.allclose(off, pi_off) and float(lam) == pytest.approx(-0.3)


def test_off_support_statistics_hand_example() -> None:
    pi = torch.tensor([0.9, 0.1, 0.3, 0.8, 0.2])
    support = torch.tensor([True, False, False, True, True])
    assert off_support_means(pi, support, [3, 2], 0.5).tolist() == pytest.approx([0.2, 0.5])
    assert expand_groups(torch.tensor([0.2, 0.5]), [3, 2]).tolist() == pytest.approx([0.2, 0.2, 0.2, 0.5, 0.5])


def test_server_rebuild_hand_example() -> None:
    thetas = torch.tensor([[1.0, 0.0, 3.0], [3.0, 5.0, 0.0]])
    pis = torch.tensor([[0.5, 0.0, 0.9], [0.7, 0.8, 0.0]])
    theta, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.5, 0.5]), pi_unsent=0.1)
    assert theta.tolist() == [2.0, 5.0, 3.0]  # mean over the senders only
    assert pi.tolist() == pytest.approx([0.6, 0.45, 0.5])  # non-senders count as pi_unsent
    fill = torch.tensor([[0.1], [0.3]])  # each client's own off-support statistic
    _, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.5, 0.5]), fill)
    assert pi.tolist() == pytest.approx([0.6, 0.45, 0.6])
    _, pi = aggregate_gated_uploads(thetas, pis, torch.tensor([0.25, 0.75]), fill, senders_only=True)
    assert pi.tolist() == pytest.approx([0.65, 0.8, 0.9])  # like theta: mean over the senders


def _module(**kwargs: object) -> EFLoPS:
    """E-FLoPS on a 4-tensor MLP (|θ| = 54, m = 5) without data (server-side maths only)."""
    model = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 2))
    return EFLoPS(density=0.1, model=model, datamodule=types.SimpleNamespace(task="regression"), **kwargs)  # type: ignore[arg-type]


def _random_messages(module: EFLoPS, gen: torch.Generator, count: int) -> torch.Tensor:
    """``count`` client messages with random supports (some coordinates sent by nobody)."""
    rows = []
    for _ in range(count):
        log_alpha = torch.randn(module.dim, generator=gen) * 3
        theta = torch.randn(module.dim, generator=gen)
        rows.append(module.upload_message(theta, log_alpha, torch.randn(1, generator=gen)))
    return torch.stack(rows)


@pytest.mark.parametrize("gate_aggregation", ["senders", "all"])
@pytest.mark.parametrize("off_support_gates", ["resume", "reset"])
def test_streaming_sums_match_the_stacked_rebuild(gate_aggregation: str, off_support_gates: str) -> None:
    """The server's fixed-size sums give aggregate_gated_uploads on the stacked uploads (float64 vs float32)."""
    module = _module(gate_aggregation=gate_aggregation, off_support_gates=off_support_gates)
    gen = torch.Generator().manual_seed(7)
    messages = _random_messages(module, gen, count=6)
    samples = torch.tensor([3, 9, 1, 4, 4, 7])
    d, groups = module.dim, module.num_groups
    assert bool(((messages[:, d : 2 * d] > 0).sum(0) == 0).any())  # some coordinates nobody sent
    weights = samples.double() / samples.sum()
    if groups:
        offs = messages[:, 2 * d : 2 * d + groups].clamp(module.pi_min, 1.0)
        unsent: float | torch.Tensor = torch.stack([expand_groups(o, module.group_sizes) for o in offs])
    else:
        unsent = module.pi_min
    theta_ref, pi_ref = aggregate_gated_uploads(
        messages[:, :d], messages[:, d : 2 * d], weights.float(), unsent, senders_only=gate_aggregation == "senders"
    )
    lam_ref = (weights.float() * messages[:, -1]).sum().reshape(1)

    aggregator = module.make_aggregator(round_idx=0)
    assert isinstance(aggregator, GatedUploadSums) and aggregator.sums.dtype == torch.float64
    assert aggregator.sums.numel() == 4 * d + 2  # independent of the cohort size
    for row, n in zip(messages, samples.tolist(), strict=True):  # shares n_k / n of a 50-sample federation
        aggregator.accumulate(row, weight=n / 50)
    theta, pi, lam = aggregator.result()
    torch.testing.assert_close(theta, theta_ref)
    torch.testing.assert_close(pi, pi_ref)
    torch.testing.assert_close(lam, lam_ref)

    module.set_server_state(round_idx=0, aggregator=aggregator)  # what the server keeps
    torch.testing.assert_close(flat_parameters(module.model), theta_ref)
    log_alpha_ref = module.hc.log_alpha_from_prob_nonzero(pi_ref.clamp(module.pi_min, 1.0 - 1e-7))
    torch.testing.assert_close(module.log_alpha.detach(), log_alpha_ref, rtol=1e-5, atol=1e-4)  # logit near 0 and 1
    torch.testing.assert_close(module.lagrange.detach(), lam_ref)


def test_streaming_sums_add_across_processes() -> None:
    """Two processes' shares, summed by one all-reduce, give the one-process result."""
    module = _module()
    messages = _random_messages(module, torch.Generator().manual_seed(3), count=5)
    whole, part_a, part_b = (module.make_aggregator(round_idx=0) for _ in range(3))
    for k, row in enumerate(messages):
        whole.accumulate(row, weight=0.1 * (k + 1))
        (part_a if k % 2 else part_b).accumulate(row, weight=0.1 * (k + 1))
    other = torch.cat([part_b.sums, torch.tensor([float(part_b.count)], dtype=torch.float64)])
    part_a.all_reduce(lambda packed: packed + other)
    assert part_a.count == whole.count == 5
    for mine, reference in zip(part_a.result(), whole.result(), strict=True):
        torch.testing.assert_close(mine, reference)


def test_engine_contract() -> None:
    """Gated sparse payloads both ways, a set server state, the sparse report as a model callback."""
    assert _module().uplink_numel == 2 * 54 + 1  # the default "closed": no off-support statistics
    module = _module(off_support_gates="resume")
    assert module.sets_server_state and module.supported_aggregation == ("normalised",)
    for channel in (module.uplink_channel, module.downlink_channel):
        assert channel.payload is Payload.GATED_SPARSE and isinstance(channel.codec, GateMessageCodec)
        assert channel.codec.num_groups == 4
    assert module.uplink_numel == 2 * 54 + 4 + 1
    for hook in ("configure_optimizers", "training_step", "on_train_batch_end", "on_test_epoch_end"):
        assert hook not in vars(EFLoPS), hook  # the engine's round and Lightning's hooks are not overridden
    assert [type(cb) for cb in declared_callbacks(module)] == [SparseModelReport]
    assert set(module.server_metrics(1)) == {
        "eflops/lambda",
        "eflops/mean_prob_nonzero",
        "eflops/temperature",
        "model/expected_density",  # D and the KL/constraint pull reach the run summary
        "model/kl_pull_ratio",
    }
    with pytest.raises(ConfigError, match="gated sparse values"):
        module.uplink_channel.attach(Sign())  # a dense operator does not understand the gated message
    with pytest.raises(ConfigError, match="aggregation"):
        _module(aggregation="unbiased")


def test_client_update_runs_through_the_engine_routine() -> None:
    """Local training is the engine's local_train (Adam groups: θ̃ and log α); repeatable from the streams."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 10, generator=gen)
    y = x[:, :2] @ torch.tensor([1.0, -1.0])
    data = types.SimpleNamespace(
        task="regression", num_clients=1, client_sizes=[12], client_tensors=lambda k: (x, y), augment=lambda v, g: v
    )
    model = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 1))
    module = EFLoPS(
        density=0.1,
        model=model,
        datamodule=data,
        batch_size=4,
        lambda_lr=0.1,
        client_optimizer=lambda params: torch.optim.Adam(params, lr=0.01),
    )
    calls: list[dict[str, object]] = []
    routine = module.local_train

    def spy(**kwargs: object) -> object:
        calls.append(kwargs)
        return routine(**kwargs)  # type: ignore[arg-type]

    module.local_train = spy  # type: ignore[method-assign,assignment]
    received = GateMessageCodec(num_groups=module.num_groups).encode(module.broadcast_state(0)).decode()
    screening = module.client_update(client_id=0, round_idx=0, received=received)
    assert float(unpack_gate_state(screening.upload, module.num_groups)[-1]) == 0.0  # first round: λ held
    calls.clear()
    first = module.client_update(client_id=0, round_idx=1, received=received)
    again = module.client_update(client_id=0, round_idx=1, received=received)
    assert len(calls) == 2 and torch.equal(first.upload, again.upload)
    groups = calls[0]["params"]
    assert isinstance(groups, list) and groups[1]["lr"] == module.log_alpha_lr
    assert first.upload.numel() == module.uplink_numel and first.num_samples == 12
    _, _, support, _, lam = unpack_gate_state(first.upload, module.num_groups)
    assert int(support.sum()) == module.m and float(lam) != 0.0  # the dual variable moved
    assert set(first.metrics) == set(module.client_metric_names) and 0 < first.metrics["eflops/local_density"] < 1


def test_expected_gate_tail_is_positive_and_accurate() -> None:
    log_alpha = torch.tensor([-10.0, -5.0, -2.4, 0.0, 2.0, 5.0, 10.0], dtype=torch.float64)
    assert torch.allclose(gate_survival(0.0, log_alpha), prob_nonzero(log_alpha))  # P(z > 0) = P(z != 0)
    assert float(expected_gate_tail(torch.tensor(0.0), nodes=4)) == 0.5  # symmetric at log alpha = 0
    tail = expected_gate_tail(log_alpha, nodes=32)
    reference = expected_gate(log_alpha, nodes=200_000)  # fine midpoint rule over u
    assert torch.allclose(tail, reference, rtol=0.03, atol=1e-6)
    # where the test-time gate (and the coarse u rule) is exactly 0, E[z] is still positive
    assert float(test_gate(log_alpha[2])) == 0.0 and float(expected_gate(log_alpha[0], nodes=32)) == 0.0
    assert bool((tail > 0).all()) and bool((tail <= prob_nonzero(log_alpha)).all())  # E[z] <= P(z != 0)


def test_gated_top_m_hand_example() -> None:
    # |theta * g| = [1.8, 0.3, 0.4, 0.5]: the two largest are coordinates 0 and 3
    out = gated_top_m(torch.tensor([2.0, -3.0, 0.5, 1.0]), torch.tensor([0.9, 0.1, 0.8, 0.5]), 2)
    assert out.tolist() == pytest.approx([1.8, 0.0, 0.0, 0.5])


@pytest.mark.parametrize(("final_support", "nonzero"), [("top_m", 2), ("test_gate", 1)])
def test_final_support_hand_example(final_support: str, nonzero: int) -> None:
    """|theta| = 4, rho = 0.5: m = 2; coordinate 0 has a huge theta but P(z != 0) = 2.2e-4 < 0.31.

    Scores |theta| P(z != 0) = [22.4, 0.83, 1.66, 0.42] and |theta E[z]| = [6.1, 0.5, 1.0, 0.25]
    both pick S = {0, 2}; the test-time gate is z_hat = [0, 0.5, 0.5, 0.5], so the old rule
    zeroes coordinate 0 of its own support, while top_m keeps theta_0 E[z_0] > 0.
    """
    module = EFLoPS(
        density=0.5,
        model=nn.Linear(3, 1),
        datamodule=types.SimpleNamespace(task="regression"),
        selection="expected_magnitude",
        final_support=final_support,  # type: ignore[arg-type]
    )
    assert module.m == 2
    theta, log_alpha = torch.tensor([1e5, -1.0, 2.0, 0.5]), torch.tensor([-10.0, 0.0, 0.0, 0.0])
    out = module.final_parameters(theta, log_alpha)
    assert int(torch.count_nonzero(out)) == nonzero
    assert float(out[2]) == 1.0 and float(out[1]) == 0.0 and float(out[3]) == 0.0  # 2 * E[z] = 2 * 0.5
    if final_support == "top_m":
        assert 0 < float(out[0]) / 1e5 < float(prob_nonzero(log_alpha[0]))
    else:
        assert float(out[0]) == 0.0


def test_rejects_unknown_final_support() -> None:
    with pytest.raises(ConfigError, match=r"method\.final_support"):
        EFLoPS(
            density=0.5,
            model=nn.Linear(3, 1),
            datamodule=types.SimpleNamespace(task="regression"),
            final_support="median",  # type: ignore[arg-type]
        )


def _linear_module(support_allocation: str, **kwargs: object) -> EFLoPS:
    """nn.Linear(4, 1) at rho = 0.4: |theta| = 5, m = 2; per tensor: weight floor(1.6) = 1, bias max(1, 0) = 1."""
    return EFLoPS(
        density=0.4,
        model=nn.Linear(4, 1),
        datamodule=types.SimpleNamespace(task="regression"),
        support_allocation=support_allocation,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("support_allocation", "support"), [("global", [0, 1]), ("per_tensor", [0, 4])])
def test_message_regrow_rebuild_and_final_support_share_the_allocation(
    support_allocation: str, support: list[int]
) -> None:
    """theta = [3, 2, 0.1, 0.5 | 0.2], every gate at log alpha = 0: the scores rank as |theta|.

    The global top 2 is {0, 1} (both weights); per tensor the weight keeps its largest (0) and
    the bias its only coordinate (4). The message, the server's regrow rebuild and both final
    supports must pick that same set.
    """
    module = _linear_module(support_allocation, off_support_gates="regrow")
    assert module.m == 2 and module.support_budgets == ([2] if support_allocation == "global" else [1, 1])
    theta, log_alpha = torch.tensor([3.0, 2.0, 0.1, 0.5, 0.2]), torch.zeros(5)
    sent = unpack_gate_state(module.upload_message(theta, log_alpha, torch.tensor(0.0)))[2]
    assert torch.nonzero(sent).flatten().tolist() == support
    for final_support in ("top_m", "test_gate"):
        out = _linear_module(support_allocation, final_support=final_support).final_parameters(theta, log_alpha)
        assert torch.nonzero(out).flatten().tolist() == support, final_support
    # regrow rebuild: one dense upload; the server closes every gate outside its own support
    agg = GatedUploadSums(dim=5, group_sizes=[4, 1], num_groups=0, pi_min=module.pi_min, senders_only=True)
    agg.accumulate(pack_gate_state(theta, torch.full((5,), 0.5), torch.ones(5, dtype=torch.bool), 0.0), weight=1.0)
    module.set_server_state(round_idx=1, aggregator=agg)
    open_gates = module.log_alpha.detach() > module.hc.log_alpha_min
    assert torch.nonzero(open_gates).flatten().tolist() == support


def test_rejects_unknown_or_infeasible_support_allocation() -> None:
    with pytest.raises(ConfigError, match=r"method\.support_allocation='layerwise' is unknown"):
        _linear_module("layerwise")
    with pytest.raises(ConfigError, match=r"support_allocation=per_tensor: 2 parameter tensors .* m = 1"):
        EFLoPS(
            density=0.25,  # nn.Linear(3, 1): |theta| = 4, m = 1 < 2 tensors
            model=nn.Linear(3, 1),
            datamodule=types.SimpleNamespace(task="regression"),
            support_allocation="per_tensor",
        )


@pytest.fixture
def golub_cfg(make_config: Callable[..., object], shared_data_root: Path) -> Callable[..., object]:
    def build(*overrides: str) -> object:
        return make_config(["+experiment=golub_eflops_quick", f"data.root={shared_data_root}", *overrides])

    return build


def test_golub_quick_run(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    summary = run(golub_cfg("rounds=3"), tmp_path)  # type: ignore[arg-type]
    dim, m = 3571 + 1, int(0.02 * (3571 + 1))  # the one-output logistic model: m = 71
    # final_support=top_m: the evaluated model keeps exactly the m communicated coordinates
    assert summary["model/nonzero"] == m and summary["model/density"] == pytest.approx(m / dim)
    assert summary["model/macs"] <= summary["model/nonzero"] and summary["model/macs_dense"] == 3571
    assert summary["test/acc"] is not None
    # every message is sparse: far below dense float32, both directions
    assert summary["comm/uplink_compression"] > 10 and summary["comm/downlink_compression"] > 10
    rows = list(csv.DictReader((tmp_path / "comm_records.csv").open()))
    assert {r["direction"] for r in rows} == {"up", "down"}
    assert all(int(r["bits"]) <= m * 64 + 32 + 20 * m + 64 for r in rows)
    selected = json.loads((tmp_path / "selected_features.json").read_text())
    assert selected["num_selected"] >= 1 and "probe_id" in selected["features"][0]


def test_rejects_bad_config(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"method\.density"):
        run(golub_cfg("method.density=0"), tmp_path)  # type: ignore[arg-type]
    server_optimizer = [
        f"+method.server_optimizer.{k}" for k in ("_target_=torch.optim.SGD", "_partial_=true", "lr=0.5")
    ]
    with pytest.raises(ConfigError, match="server_optimizer"):  # the server sets its rebuilt state: none allowed
        run(golub_cfg("rounds=1", *server_optimizer), tmp_path / "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"method\.prior"):
        run(golub_cfg("method.prior=laplace"), tmp_path / "c")  # type: ignore[arg-type]


def test_density_estimators_and_priors_run(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    cfg = golub_cfg(
        "rounds=1",
        "method.density_estimator=expected_gate",
        "method.prior=uniform",
        "method.quadrature_nodes=8",
        "method.off_support=zero",
    )
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    assert summary["model/density"] <= 0.02


def test_golub_density_reaches_target(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    """After the full 30 rounds the evaluated density is within 10% of rho (0.9 rho <= density <= rho).

    With ``final_support=top_m`` it keeps exactly m = 71 non-zeros of the logistic model's
    3,572 (m/|theta| = 0.01988).
    """
    rho, dim = 0.02, 3571 + 1
    m = int(rho * dim)
    for seed in (0, 1):
        summary = run(golub_cfg("rounds=30", f"seed={seed}", "eval_every=1000"), tmp_path / str(seed))  # type: ignore[arg-type]
        assert 0.9 * rho <= summary["model/density"] <= rho, summary["model/density"]
        assert summary["model/nonzero"] == m and summary["model/macs"] <= m


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eflops", "fediht"])
def test_two_processes_reproduce_one_process(method: str, golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    """The fixed-size sums all-reduced over 2 CPU processes (trainer=ddp) give the 1-process run."""
    overrides = ["rounds=3", "eval_every=3", f"method={method}"]
    cfg = golub_cfg(*overrides)
    one = run(cfg, tmp_path / "one")  # type: ignore[arg-type]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("LOCAL_RANK", None)
    command = [
        sys.executable,
        "-m",
        "fedlightning.cli",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "+experiment=golub_eflops_quick",
        f"data.root={cfg.data.root}",  # type: ignore[attr-defined]
        *overrides,
        "trainer=ddp",
        f"hydra.run.dir={tmp_path / 'two'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (one["processes"], two["processes"]) == (1, 2)
    for key in ("comm/uplink_bits_total", "comm/downlink_bits_total", "model/nonzero", "test/acc"):
        assert two[key] == one[key], key
    a, b = (
        torch.load(tmp_path / k / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for k in ("one", "two")
    )
    for name in a:  # float64 sums: the order of the processes' shares moves the result by a few ulps
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_mnist_cnn_quick_smoke(make_config: Callable[..., object], shared_data_root: Path, tmp_path: Path) -> None:
    cfg = make_config(["+experiment=eflops_mnist_cnn_quick", f"data.root={shared_data_root}", "rounds=1"])
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    assert 0 < summary["model/density"] <= 0.025 and summary["model/macs"] < summary["model/macs_dense"]
    assert summary["comm/uplink_compression"] > 10


@pytest.mark.slow
def test_golub_eflops_accuracy_over_seeds(golub_cfg: Callable[..., object], tmp_path: Path) -> None:
    accs = [run(golub_cfg("rounds=30", f"seed={s}"), tmp_path / str(s))["test/acc"] for s in range(5)]  # type: ignore[arg-type]
    assert sum(accs) / len(accs) >= 0.85


#: |θ| = 301, k = 6, N/|θ| = 0.5, λ step 1000, 10 rounds: the synthetic problem of the support tests.
SMALL_SPARSE_PROBLEM = (
    "+experiment=sparse_regression_eflops",
    "data.num_features=300",
    "data.sparsity=6",
    "data.samples_per_parameter=0.5",
    "data.num_test=200",
    "data.val_fraction=0",
    "method.lambda_lr=1000",
    "rounds=10",
    "eval_every=1000",
)


def test_expected_density_matches_target_and_support_gates_are_open(
    make_config: Callable[..., object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synthetic sparse regression (|θ| = 301, k = 6, N/|θ| = 0.5, ρ = 0.02, m = 6), 10 rounds.

    The expected density of the server's gates, mean_j P(z_j ≠ 0), is within 10% of ρ, every
    kept coordinate has an open gate (P(z ≠ 0) ≥ 0.9) and a weight far from zero (|w| ≥ 0.03;
    the non-zero truth weights are of order 1). With ``off_support_gates=resume`` (off-support
    gates restarted from a per-tensor mean) the same run ends at D ≈ ρ/2 with min |w| ≈ 3e-4:
    the budget is then held by thousands of almost-closed gates, which this test refuses.
    """
    states: list[EFLoPS] = []
    rebuild = EFLoPS.set_server_state

    def capture(self: EFLoPS, **kwargs: object) -> None:
        rebuild(self, **kwargs)  # type: ignore[arg-type]
        states[:] = [self]

    monkeypatch.setattr(EFLoPS, "set_server_state", capture)
    cfg = make_config(
        [
            *SMALL_SPARSE_PROBLEM,
            "method.density=0.02",
        ]
    )
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    module = states[0]
    pi = module.hc.prob_nonzero(module.log_alpha.detach())
    rho = 0.02
    assert abs(float(pi.mean()) - rho) <= 0.1 * rho, float(pi.mean())
    assert module.m == 6 and float(torch.topk(pi, module.m).values.min()) >= 0.9
    features = json.loads((tmp_path / "selected_features.json").read_text())["features"]
    weights = [w for f in features for w in f["weights"]]
    assert len(weights) >= 5 and min(abs(w) for w in weights) >= 0.03, weights
    assert summary["model/nonzero"] == 6


@pytest.mark.parametrize("off_support_gates", ["closed", "regrow"])
def test_support_after_round_two_is_fixed_when_closed_and_revised_with_regrow(
    off_support_gates: str, make_config: Callable[..., object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's support (its m most open gates) after each round, same problem as above.

    ``closed`` never revises the support chosen in rounds 1–2 (a closed gate gets no gradient);
    ``regrow`` lets a closed coordinate back in, and still holds D within 10% of ρ with exactly
    m non-zeros in the evaluated model.
    """
    supports: list[frozenset[int]] = []
    states: list[EFLoPS] = []
    rebuild = EFLoPS.set_server_state

    def capture(self: EFLoPS, **kwargs: object) -> None:
        rebuild(self, **kwargs)  # type: ignore[arg-type]
        pi = self.hc.prob_nonzero(self.log_alpha.detach())
        supports.append(frozenset(torch.topk(pi, self.m).indices.tolist()))
        states[:] = [self]

    monkeypatch.setattr(EFLoPS, "set_server_state", capture)
    cfg = make_config(
        [
            *SMALL_SPARSE_PROBLEM,
            f"method.off_support_gates={off_support_gates}",
        ]
    )
    summary = run(cfg, tmp_path)  # type: ignore[arg-type]
    later = set(supports[1:])  # the supports after rounds 2..10
    if off_support_gates == "closed":
        assert len(later) == 1, [sorted(s) for s in supports]
    else:
        assert len(later) > 1, [sorted(s) for s in supports]
    d = float(states[0].hc.prob_nonzero(states[0].log_alpha.detach()).mean())
    assert abs(d - 0.02) <= 0.1 * 0.02 and summary["model/expected_density"] == pytest.approx(d)
    assert summary["model/nonzero"] == 6


@pytest.mark.parametrize("method", ["eflops_cnn", "eflops", "fediht", "fedavg_prune"])
def test_mnist_cnn_experiment_config_gives_every_method_the_shared_settings(
    method: str, make_config: Callable[..., object]
) -> None:
    """The methods of the MNIST CNN comparison compose with one data set, round count, ρ = 0.025 and client SGD."""
    cfg = make_config(["+experiment=eflops_mnist_cnn", f"method={method}"])
    assert cfg.method.density == 0.025 and cfg.rounds == 50 and cfg.data.num_clients == 10  # type: ignore[attr-defined]
    assert cfg.method.client_optimizer._target_ == "torch.optim.SGD"  # type: ignore[attr-defined]
    assert cfg.method.client_optimizer.lr == 0.03  # type: ignore[attr-defined]


def test_mnist_cnn_experiment_starts_eflops_gates_open_and_baselines_without_gate_keys(
    make_config: Callable[..., object],
) -> None:
    """E-FLoPS in the MNIST experiment is ``eflops_cnn`` (log α = 8); the baselines get no gate setting."""
    cfg = make_config(["+experiment=eflops_mnist_cnn"])
    assert cfg.method._target_.endswith("EFLoPS") and cfg.method.log_alpha_init == 8.0  # type: ignore[attr-defined]
    assert float(prob_nonzero(torch.tensor(cfg.method.log_alpha_init))) > 0.999  # type: ignore[attr-defined]
    for baseline in ("fediht", "fedavg_prune"):
        assert "log_alpha_init" not in make_config(["+experiment=eflops_mnist_cnn", f"method={baseline}"]).method  # type: ignore[attr-defined]


@pytest.mark.parametrize(("log_alpha", "low", "high"), [(0.0, 0.0, 0.3), (3.0, 0.7, 1.05)])
def test_initial_gates_shrink_the_cnn_logits_at_log_alpha_zero_but_not_at_three(
    log_alpha: float, low: float, high: float
) -> None:
    """The MNIST CNN's diagnosis in miniature: one hard-concrete sample per weight at log α = 0
    (E[z] = 0.5, sd 0.39) shrinks the logits' spread of the FedAvg CNN several-fold; at log α = 3
    (E[z] = 0.94) the gated network is close to the plain one."""
    from torch.func import functional_call

    from fedlightning.models import SmallCNN
    from fedlightning.models.hard_concrete import sample_gate, uniform_noise

    torch.manual_seed(0)
    model = SmallCNN(input_shape=(1, 28, 28), num_classes=10)
    x = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        plain = model(x).std()
        gated = {
            n: p * sample_gate(torch.full_like(p, log_alpha), uniform_noise(p.shape, gen))
            for n, p in model.named_parameters()
        }
        ratio = float(functional_call(model, gated, (x,)).std() / plain)
    assert low <= ratio <= high, ratio
