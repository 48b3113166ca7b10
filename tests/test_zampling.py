"""Zampling parameterisation, estimators and the federated method (arXiv 2503.14246)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor

from fedlightning.callbacks.declared import declared_callbacks
from fedlightning.callbacks.zampling_evaluation import ZamplingEvaluation
from fedlightning.callbacks.zampling_sensitivity import (
    accuracy_deviation,
    hypercube_indicator,
    perturb_in_hypercube,
    perturbation_draw,
    perturbation_support,
    relative_sensitivity,
)
from fedlightning.compression.arithmetic import BernoulliRangeCodec
from fedlightning.compression.codecs import BitPackCodec
from fedlightning.compression.mask import MaskCodec
from fedlightning.compression.operators import Sign
from fedlightning.datamodules import DigitsDataModule
from fedlightning.errors import ConfigError, MessageDecodeError
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.local import FusedRunner
from fedlightning.federated.local.fused import chain_gradients_, linear_chain
from fedlightning.federated.message import Message
from fedlightning.federated.payloads import Payload
from fedlightning.methods.zampling import (
    EPOCHS_METRIC,
    OPTIMIZER_KEY,
    RANGE_METRIC,
    XENT_METRIC,
    Zampling,
    bernoulli_draw,
    frozen_fraction,
    mean_of_bits,
    trainable_size,
)
from fedlightning.models.mlp import MLP
from fedlightning.models.sampled_network import SampledNetwork
from fedlightning.models.zampling import (
    SparseQ,
    ZampledNetwork,
    ZampledWeights,
    diagonal_q,
    draw_distinct_columns,
    row_fan_in,
    zampling_q,
)
from fedlightning.models.zampling_estimators import (
    ClippedScore,
    SigmoidScore,
    probability_from_score,
    score_estimator,
    score_from_probability,
)
from fedlightning.run import run
from fedlightning.sampling import FullParticipation, UniformSampler
from tests.conftest import digits_federation, record_calls, round_trainer

SMALL = MLP(in_features=784, hidden=[20, 20], num_classes=10)  # m = 16,330


# ---------------------------------------------------------------------------------- Q
@pytest.mark.parametrize(("n", "d"), [(510, 10), (16, 16), (16, 10), (8331, 100), (3, 1)])
def test_row_degree_is_exactly_d_with_distinct_columns(n: int, d: int) -> None:
    q = zampling_q(row_fan_in(SMALL), n=n, d=d, seed=3)
    assert q.shape == (16_330, n)
    assert torch.equal(q.row_degree(), torch.full((16_330,), d))
    assert int(q.cols.min()) >= 0 and int(q.cols.max()) < n
    assert torch.all(q.vals != 0)


def test_same_seed_same_q_and_other_seed_differs() -> None:
    a = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=7)
    b = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=7)  # "the client" builds its own copy
    c = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=8)
    assert torch.equal(a.cols, b.cols) and torch.equal(a.vals, b.vals)
    assert not torch.equal(a.cols, c.cols)


def test_d_larger_than_n_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"method\.d"):
        zampling_q(row_fan_in(SMALL), n=16, d=50, seed=0)


def test_fan_in_of_weights_and_biases() -> None:
    fan = row_fan_in(MLP(in_features=3, hidden=[2], num_classes=4))
    # layer 1: 2x3 weights + 2 biases feed neurons with 3 inputs; layer 2: 4x2 + 4 with 2 inputs
    assert fan.tolist() == [3.0] * 8 + [2.0] * 12


def test_q_variance_matches_6_over_d_fan_in() -> None:
    # mnistfc-like first layer: 300 x 784 rows with fan-in 784; d = 10
    fan = torch.full((235_200,), 784.0)
    q = zampling_q(fan, n=8000, d=10, seed=0)
    expected = 6.0 / (10 * 784)
    var = float(q.vals.double().var())
    # 2.35M N(0, s²) draws: relative standard error of the variance is sqrt(2/N) ≈ 0.1%
    assert var == pytest.approx(expected, rel=0.01)
    # Kaiming lemma: Var((Q p)_i) = 6 E[p²] / fan_in = 2 / fan_in for p ~ U(0,1) (expected network)
    p = torch.rand(8000, generator=torch.Generator().manual_seed(1))
    assert float(q.matvec(p).double().var()) == pytest.approx(2.0 / 784, rel=0.05)
    # ... and 6 E[z] / fan_in = 3 / fan_in for a sampled network (1.5 times Kaiming's 2 / fan_in)
    z = torch.bernoulli(p, generator=torch.Generator().manual_seed(2))
    assert float(q.matvec(z).double().var()) == pytest.approx(3.0 / 784, rel=0.05)


def test_draw_distinct_columns_hand_case() -> None:
    cols = draw_distinct_columns(2, 3, 3, torch.Generator().manual_seed(0))
    assert cols.tolist() == [[0, 1, 2], [0, 1, 2]]


# ---------------------------------------------------------------------------------- products
def _tiny_q() -> SparseQ:
    # Q = [[2, 0, 1], [0, 3, 0]] written as d = 2 rows? row 2 has d = 1: use d = 2 with distinct cols
    return SparseQ(cols=torch.tensor([[0, 2], [1, 2]]), vals=torch.tensor([[2.0, 1.0], [3.0, -1.0]]), n=3)


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_q_products_by_hand(backend: str) -> None:
    q = _tiny_q()  # Q = [[2, 0, 1], [0, 3, -1]]
    assert q.matvec(torch.tensor([1.0, 1.0, 0.0]), backend=backend).tolist() == [2.0, 3.0]
    assert q.rmatvec(torch.tensor([1.0, 2.0]), backend=backend).tolist() == [2.0, 6.0, -1.0]
    assert torch.equal(q.to_dense(), torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, -1.0]]))
    w = torch.tensor([2.0, 3.0])  # Q·(1, 1, 0); z → (0, 1, 1): column 2 up, column 0 down
    q.add_columns_(w, torch.tensor([2, 0]), torch.tensor([1.0, -1.0]), backend=backend)
    assert w.tolist() == [1.0, 2.0]
    w = torch.tensor([2.0, 3.0])  # a continuous step: z (1, 1, 0) → (0.5, 1, 0.25)
    q.add_columns_(w, torch.tensor([0, 2]), torch.tensor([-0.5, 0.25]), backend=backend)
    assert w.tolist() == [1.25, 2.75]


@pytest.mark.parametrize("n", [510, 70_000])  # uint16 and uint32 column indices in the row layout
def test_compiled_kernels_equal_the_torch_products(n: int) -> None:
    fan = torch.full((3000,), 50.0)
    q = zampling_q(fan, n=n, d=7, seed=9)
    assert q.row_arrays()[0].dtype.name == ("uint16" if n <= 2**16 else "uint32")
    gen = torch.Generator().manual_seed(0)
    z = torch.bernoulli(torch.full((n,), 0.5), generator=gen)
    g = torch.randn(3000, generator=gen)
    exact_w = (q.vals.double() * z.double()[q.cols]).sum(1)  # row by row, in float64
    assert torch.allclose(q.matvec(z, backend="compiled").double(), exact_w, atol=1e-6)
    assert torch.allclose(q.matvec(z, backend="torch").double(), exact_w, atol=1e-6)
    assert torch.allclose(q.rmatvec(g, backend="compiled"), q.rmatvec(g, backend="torch"), atol=1e-6)
    columns = torch.nonzero(torch.rand(n, generator=gen) < 0.1).squeeze(1)
    coef = torch.randn(columns.numel(), generator=gen)
    compiled, reference = torch.zeros(3000), torch.zeros(3000)
    q.add_columns_(compiled, columns, coef, backend="compiled")
    q.add_columns_(reference, columns, coef, backend="torch")
    assert torch.allclose(compiled, reference, atol=1e-6)
    p = torch.rand(n, generator=gen).clamp(0.1, 0.9)
    frozen = torch.rand(n, generator=gen) < 0.8
    p[frozen] = torch.randint(0, 2, (int(frozen.sum()),), generator=gen).float()  # at 0 or at 1
    free = (p > 0) & (p < 1)
    exact_g = torch.zeros(n, dtype=torch.float64).index_add_(
        0, q.cols.reshape(-1), (q.vals.double() * g.double()[:, None]).reshape(-1)
    )
    on_free, num_free = q.free_rmatvec(g, p)
    assert num_free == int(free.sum()) and torch.all(on_free[~free] == 0)
    assert torch.allclose(on_free.double(), exact_g * free, atol=1e-6)


def test_free_rmatvec_by_hand() -> None:
    q = _tiny_q()  # Q = [[2, 0, 1], [0, 3, -1]]
    for frozen_at in (0.0, 1.0):
        free_gradient, num_free = q.free_rmatvec(torch.tensor([1.0, 2.0]), torch.tensor([0.5, frozen_at, 0.25]))
        assert free_gradient.tolist() == [2.0, 0.0, -1.0] and num_free == 2


def test_the_masked_backward_gathers_exactly_when_fewer_than_its_threshold_of_columns_are_free() -> None:
    q = zampling_q(torch.full((3000,), 100.0), n=500, d=4, seed=3)
    weights = ZampledWeights(q, backend="compiled")  # the gather below 45% free columns
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(3000, generator=gen)
    for share in (0.9, 0.1, 0.2, 0.9, 0.8, 0.1):  # into and out of the gather's range
        p = torch.rand(500, generator=gen)
        frozen = torch.rand(500, generator=gen) >= share
        p[frozen] = torch.randint(0, 2, (int(frozen.sum()),), generator=gen).float()
        free = (p > 0) & (p < 1)
        weights.set_free(p)
        gathers = weights.stats["free_gathers"]
        out = weights.masked_rmatvec(g)
        gathered = int(free.sum()) < 0.45 * 500
        assert weights.stats["free_gathers"] == gathers + gathered
        expected = q.free_rmatvec(g, p)[0] if gathered else q.rmatvec(g, backend="compiled") * free
        assert torch.equal(out, expected)


def test_changed_columns_are_added_as_add_columns_adds_them_or_not_at_all() -> None:
    q = zampling_q(torch.full((3000,), 100.0), n=500, d=4, seed=3)
    gen = torch.Generator().manual_seed(1)
    z_old = torch.bernoulli(torch.full((500,), 0.5), generator=gen)
    z = z_old.clone()
    flip = torch.rand(500, generator=gen) < 0.1
    z[flip] = 1 - z[flip]
    w, reference = q.matvec(z_old), q.matvec(z_old)
    changed = torch.nonzero(z != z_old).squeeze(1)
    q.add_columns_(reference, changed, (z - z_old)[changed], backend="compiled")
    kept = z_old.clone()
    assert q._add_changed_columns_unchecked(w.clone(), z, kept, max_changed=changed.numel() - 1) == changed.numel()
    assert torch.equal(kept, z_old)  # over the limit: nothing written
    assert q._add_changed_columns_unchecked(w, z, kept, max_changed=changed.numel()) == changed.numel()
    assert torch.equal(w, reference) and torch.equal(kept, z)  # the same bits, and z_old ← z


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_wrong_lengths_stop_before_the_unchecked_kernels(backend: str) -> None:
    q = _tiny_q()  # 2 x 3
    with pytest.raises(ValueError, match="Q·z needs 3 values, not 2"):
        q.matvec(torch.ones(2), backend=backend)
    with pytest.raises(ValueError, match="Qᵀ·g needs 2 values, not 3"):
        q.rmatvec(torch.ones(3), backend=backend)
    with pytest.raises(ValueError, match=r"column index in \[0, 3\)"):
        q.add_columns_(torch.zeros(2), torch.tensor([3]), torch.ones(1), backend=backend)


def test_unknown_q_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Q backend 'cuda'"):
        _tiny_q().matvec(torch.ones(3), backend="cuda")  # type: ignore[arg-type]


def test_continuous_model_gives_w_equal_q_p_exactly() -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=0)
    p = torch.rand(510, generator=torch.Generator().manual_seed(0))
    dense = q.to_dense().double() @ p.double()
    weights = ZampledWeights(q)
    w = weights(p.clone().requires_grad_(True), p)  # continuous: z = p
    assert torch.allclose(w.double(), dense, atol=1e-6)
    # the expected-network helper is the same product
    assert torch.allclose(q.matvec(p).double(), dense, atol=1e-6)


def test_d1_n_m_is_a_supermask_parameterisation() -> None:
    m = 16_330
    q = zampling_q(row_fan_in(SMALL), n=m, d=1, seed=0)
    z = torch.bernoulli(torch.full((m,), 0.5), generator=torch.Generator().manual_seed(0))
    w = q.matvec(z)
    # each weight is either 0 or its own fixed random value: w_i = q_i · z_{c(i)}
    assert torch.equal(w, q.vals[:, 0] * z[q.cols[:, 0]])
    # with the identity column map (diagonal_q) it is exactly Zhou's supermask w = w0 ⊙ z
    w0 = torch.randn(m)
    assert torch.equal(diagonal_q(w0).matvec(z), w0 * z)


def test_incremental_updates_match_full_product() -> None:
    q = zampling_q(row_fan_in(SMALL), n=2000, d=10, seed=1)
    weights = ZampledWeights(q, incremental_fraction=0.05, refresh_every=1000)
    gen = torch.Generator().manual_seed(0)
    z = torch.bernoulli(torch.full((2000,), 0.5), generator=gen)
    for _ in range(30):
        flip = torch.rand(2000, generator=gen) < 0.01
        z = torch.where(flip, 1 - z, z)
        assert torch.allclose(weights.weights_for(z), q.matvec(z), atol=1e-5)
    assert weights.stats["incremental"] >= 25


def test_masked_backward_is_q_transpose_on_free_columns() -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=2)
    gen = torch.Generator().manual_seed(0)
    for frozen_share in (0.0, 0.3, 0.9):
        p = torch.rand(510, generator=gen)
        frozen = torch.rand(510, generator=gen) < frozen_share
        p = torch.where(frozen, torch.round(p), p).requires_grad_(True)
        g = torch.randn(16_330, generator=gen)
        weights = ZampledWeights(q)
        w = weights(p, torch.bernoulli(p.detach(), generator=gen))
        (w * g).sum().backward()
        expected = (q.to_dense().T @ g) * ((p.detach() > 0) & (p.detach() < 1)).float()
        assert torch.allclose(p.grad, expected, atol=1e-5)


def test_estimators_by_hand() -> None:
    q = SparseQ(cols=torch.tensor([[0], [1]]), vals=torch.tensor([[2.0], [3.0]]), n=2)
    z = torch.tensor([1.0, 0.0])
    # Zampling: dL/ds = Qᵀ g ⊙ 1{0<p<1}: coordinate 1 sits at p = 1 and is frozen
    s = torch.tensor([0.4, 1.0], requires_grad=True)
    p = probability_from_score(s, "zampling")
    ZampledWeights(q)(p, z).sum().backward()
    assert s.grad.tolist() == [2.0, 0.0]
    # Zhou: p = sigmoid(s), dL/ds = σ'(s) Qᵀg; at s = 0: 0.25 · [2, 3]
    s = torch.zeros(2, requires_grad=True)
    ZampledWeights(q, mask_frozen=False)(probability_from_score(s, "zhou"), z).sum().backward()
    assert s.grad.tolist() == [0.5, 0.75]
    # FedPM: the same times p = 0.5
    s = torch.zeros(2, requires_grad=True)
    ZampledWeights(q, mask_frozen=False, scale_by_p=True)(probability_from_score(s, "fedpm"), z).sum().backward()
    assert s.grad.tolist() == [0.25, 0.375]


def test_score_maps_and_server_maths() -> None:
    assert score_from_probability(torch.tensor([0.3]), "zampling").tolist() == pytest.approx([0.3])
    s = score_from_probability(torch.tensor([0.2, 0.9]), "fedpm")
    assert probability_from_score(s, "fedpm").tolist() == pytest.approx([0.2, 0.9])
    assert mean_of_bits(torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])).tolist() == [1.0, 0.25]
    assert frozen_fraction(torch.tensor([1.0, 0.25, 0.0, 0.0])) == 0.75
    assert trainable_size(m=16_330, compression=8, n=None) == 2041
    with pytest.raises(ConfigError, match="exactly one"):
        trainable_size(m=10, compression=2, n=5)


def test_zampled_network_runs_the_model_functionally() -> None:
    model = MLP(in_features=4, hidden=[3], num_classes=2)
    net = ZampledNetwork(model)
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    x = torch.randn(5, 4)
    assert torch.allclose(net.forward(x, w), model(x))
    assert not torch.allclose(net.forward(x, 2 * w), model(x))


# ---------------------------------------------------------------------------------- end to end
DIGITS = [
    "method=zampling",
    "data=digits",
    "model=digits_mlp",
    "partition=iid",
    "reports.zampling_evaluation.val_samples=3",
]


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "summary.json").read_text())


def test_federated_zampling_on_digits(make_config, tmp_path: Path) -> None:
    cfg = make_config([*DIGITS, "rounds=3", "method.compression=4", "reports.zampling_evaluation.test_samples=5"])
    summary = run(cfg, tmp_path)
    n = 4810 // 4
    # uplink: exactly n bits per client per round, bit-packed
    assert summary["comm/uplink_bits_per_client_round"] == n
    assert summary["comm/uplink_compression"] == pytest.approx(32 * 4810 / n)
    for key in (
        "test/acc",
        "test/acc_sampled_mean",
        "test/acc_sampled_std",
        "test/acc_best_mask",
        "test/acc_discretised",
        "val/acc_sampled_mean",
        "model/frozen_fraction",
    ):
        assert key in summary, key
    assert 0 < summary["model/frozen_fraction"] < 1
    assert summary["test/acc"] > 0.3  # 3 rounds on digits: far above the 0.1 of chance


def test_server_p_is_exactly_a_mean_of_bits_and_lattice_downlink(make_config, tmp_path: Path) -> None:
    cfg = make_config(
        [
            *DIGITS,
            "rounds=3",
            "method.compression=8",
            "method.downlink=lattice",
            "method.uplink=arithmetic",
            "reports.zampling_evaluation.test_samples=2",
        ]
    )
    summary = run(cfg, tmp_path)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    p = ckpt["state_dict"]["p"]
    assert torch.equal(p * 10, torch.round(p * 10))  # K = 10 clients
    n = 4810 // 8
    # downlink: round 0 float32 (p(0) ~ U(0,1)), then 32-bit header + 4 bits per coordinate
    assert summary["comm/downlink_bits_total"] == 10 * (32 * n + 2 * (32 + 4 * n))
    # uplink range-coded against the broadcast p: below n bits once p has polarised
    records = (tmp_path / "comm_records.csv").read_text().splitlines()[1:]
    last_round_up = [int(r.split(",")[3]) for r in records if r.startswith("3,") and ",up," in r]  # round 3 of 3
    assert len(last_round_up) == 10 and max(last_round_up) < n


def test_frozen_fraction_remedy_keeps_every_coordinate_trainable(make_config, tmp_path: Path) -> None:
    cfg = make_config(
        [
            *DIGITS,
            "rounds=3",
            "method.compression=4",
            "method.p_clamp=0.01",
            "reports.zampling_evaluation.test_samples=2",
        ]
    )
    summary = run(cfg, tmp_path / "clamp")
    assert summary["model/frozen_fraction"] == 0.0
    assert summary["model/saturated_fraction"] > 0.2  # the raw mean does hit 0 and 1 ...
    faithful = run(
        make_config([*DIGITS, "rounds=3", "method.compression=4", "reports.zampling_evaluation.test_samples=2"]),
        tmp_path / "f",
    )
    assert faithful["model/frozen_fraction"] == faithful["model/saturated_fraction"] > 0.2  # ... and freezes there


def test_local_and_continuous_zampling_run(make_config, tmp_path: Path) -> None:
    base = [
        "data=digits",
        "model=digits_mlp",
        "partition=iid",
        "data.num_clients=1",
        "rounds=2",
        "method.compression=2",
        "reports.zampling_evaluation.val_samples=2",
        "reports.zampling_evaluation.test_samples=2",
    ]
    local = run(make_config(["method=local_zampling", *base, "method.client_optimizer.lr=0.01"]), tmp_path / "l")
    assert local["comm/uplink_bits_per_client_round"] == 32 * (4810 // 2)  # p itself, float32
    assert local["test/acc_sampled_mean"] > 0.2
    cont = run(make_config(["method=continuous_zampling", *base]), tmp_path / "c")
    assert cont["test/acc"] > 0.5  # the continuous model is evaluated as the expected network


def test_the_evaluation_settings_are_the_reports_node_with_the_callbacks_defaults(make_config) -> None:
    cfg = make_config(["method=zampling"])
    defaults = {
        name: list(p.default) if isinstance(p.default, tuple) else p.default
        for name, p in inspect.signature(ZamplingEvaluation).parameters.items()
    }
    assert OmegaConf.to_container(cfg.reports.zampling_evaluation) == defaults  # configs/reports/default.yaml
    assert not set(defaults) & set(cfg.method)  # the method takes none of them
    assert not hasattr(_zampling(digits_federation(2)), "evaluation_options")
    (evaluation,) = declared_callbacks(
        _zampling(digits_federation(2)), settings={"zampling_evaluation": {"val_samples": 3}}
    )
    assert (evaluation.val_samples, evaluation.test_samples) == (3, 100)


def test_bad_configs_name_the_key(make_config, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"method\.d"):
        run(make_config([*DIGITS, "rounds=1", "method.compression=1024", "method.d=10"]), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"method\.estimator"):
        run(make_config([*DIGITS, "rounds=1", "method.estimator=relu"]), tmp_path / "b")
    with pytest.raises(ConfigError, match=r"method\.uplink=arithmetic"):
        run(
            make_config([*DIGITS, "rounds=1", "method.upload=probabilities", "method.uplink=arithmetic"]),
            tmp_path / "c",
        )
    with pytest.raises(ConfigError, match="Bernoulli mask"):  # a sparsifier on a mask, refused before training
        run(make_config([*DIGITS, "rounds=1", "compressor=top_k"]), tmp_path / "d")


# ---------------------------------------------------------------------------------- on the round engine
def _zampling(dm: DigitsDataModule, cls: type[Zampling] = Zampling, **kwargs: Any) -> Zampling:
    torch.manual_seed(0)
    options: dict[str, Any] = {"compression": 4, "local_steps": 3}
    options.update(kwargs)
    return cls(model=MLP(in_features=64, hidden=[32], num_classes=10), datamodule=dm, **options)


def _fit(module: Zampling, rounds: int, *callbacks: Any) -> L.Trainer:
    trainer = round_trainer(rounds, list(callbacks) or [FullParticipation()], limit_val_batches=0)
    trainer.fit(module)
    return trainer


class _RoundRecorder(FederatedCallback):
    """Keeps every round's decoded uploads and the server's p after the round."""

    def __init__(self) -> None:
        self.rounds: list[tuple[Tensor, Tensor]] = []
        self._uploads: list[Tensor] = []

    def on_round_start(self, trainer: Any, module: Any, round_idx: int) -> None:
        self._uploads = []

    def on_client_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int, message: Message) -> None:
        self._uploads.append(message.decode())

    def on_round_end(self, trainer: Any, module: Any, round_idx: int, metrics: dict[str, Any]) -> None:
        self.rounds.append((torch.stack(self._uploads), module.p.detach().clone()))


def test_server_p_is_exactly_the_mean_of_the_uploaded_masks() -> None:
    # 3 of 5 clients a round; the clients hold different sample counts, so a sample-weighted
    # mean would differ from the paper's plain mean 1/K sum_k z^k.
    dm = digits_federation(5)
    assert len(set(dm.client_sizes)) > 1
    module = _zampling(dm)
    recorder = _RoundRecorder()
    _fit(module, 3, UniformSampler(clients_per_round=3), recorder)
    assert len(recorder.rounds) == 3
    for masks, p in recorder.rounds:
        assert masks.shape == (3, module.n)
        assert torch.equal(masks, torch.round(masks)) and float(masks.min()) >= 0 and float(masks.max()) <= 1
        assert torch.equal(p, masks.mean(dim=0))
        assert torch.equal(p, mean_of_bits(masks))


def test_reset_optimizer_false_restores_the_clients_adam_state() -> None:
    dm = digits_federation(2)
    module = _zampling(dm, reset_optimizer=False)
    _fit(module, 2)
    for client_id in range(2):
        saved = module.client_state.get(client_id, OPTIMIZER_KEY)["state"][0]
        assert float(saved["step"]) == 6  # 3 local steps in each of 2 rounds: round 1 continued round 0's Adam
        restored = module.make_client_optimizer(
            [torch.zeros(module.n, requires_grad=True)], client_id=client_id, round_idx=2
        ).state_dict()["state"][0]
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(restored[key], saved[key]), key
        assert float(saved["exp_avg_sq"].abs().sum()) > 0
    fresh = _zampling(dm, reset_optimizer=True)
    _fit(fresh, 2)
    assert fresh.client_state.get(0, OPTIMIZER_KEY) is None
    new = fresh.make_client_optimizer([torch.zeros(fresh.n, requires_grad=True)], client_id=0, round_idx=2)
    assert new.state_dict()["state"] == {}


class _Counting(Zampling):
    """Counts the engine's per-batch hooks; checks what local training hands them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.losses = 0
        self.step_ends = 0

    def local_loss(self, model: Any, x: Tensor, y: Tensor) -> Tensor:
        assert isinstance(model, SampledNetwork)
        self.losses += 1
        return super().local_loss(model, x, y)

    def on_local_step_end(self, model: Any) -> None:
        assert isinstance(model, SampledNetwork)
        self.step_ends += 1


def test_local_training_runs_through_the_engines_routine() -> None:
    dm = digits_federation(2)
    module = _zampling(dm, _Counting)
    _fit(module, 1)
    assert isinstance(module, _Counting)
    assert module.losses == module.step_ends == 2 * 3  # local_loss and on_local_step_end on every step
    # Clipping comes from local_train too: SGD(lr=1) on gradients clipped to norm 1e-3 moves
    # p by at most 3e-3 in 3 steps (one client uploading p itself).
    dm1 = digits_federation(1)
    start = _zampling(dm1).p.detach().clone()
    sgd = {"client_optimizer": lambda params: torch.optim.SGD(params, lr=1.0), "upload": "probabilities"}
    clipped = _zampling(dm1, max_grad_norm=1e-3, **sgd)
    _fit(clipped, 1)
    assert 0 < float((clipped.p.detach() - start).norm()) <= 3e-3 + 1e-6
    free = _zampling(dm1, **sgd)
    _fit(free, 1)
    assert float((free.p.detach() - start).norm()) > 10 * 3e-3


class _ScriptedHoldout(Zampling):
    """Client-side early stopping on a scripted held-out accuracy; keeps the score of every epoch."""

    script = (0.5, 0.7, 0.70005, 0.6, 0.69, 0.99)  # epoch 6 (0.99) is never reached

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scores: dict[int, list[Tensor]] = {}  # client -> its score after each epoch
        self.current_client = -1

    def local_holdout_accuracy(self, network: SampledNetwork, x: Tensor, y: Tensor, masks: torch.Generator) -> float:
        seen = self.scores.setdefault(self.current_client, [])
        seen.append(network.score.detach().clone())
        return self.script[len(seen) - 1]

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> Any:
        self.current_client = client_id
        return super().client_update(client_id=client_id, round_idx=round_idx, received=received)


class _MetricRecorder(FederatedCallback):
    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []

    def on_round_end(self, trainer: Any, module: Any, round_idx: int, metrics: dict[str, Any]) -> None:
        self.metrics.append(dict(metrics))


def test_local_early_stopping_uploads_a_mask_of_the_best_epochs_p() -> None:
    # Patience 3, min_delta 1e-4: epoch 2 (0.7) is the best; 0.70005 is not a gain above
    # 1e-4, so epochs 3-5 are stale and the round ends after epoch 5 of the 20 allowed.
    dm = digits_federation(2)
    options = {"local_steps": None, "local_epochs": 20, "local_patience": 3, "local_min_delta": 1e-4}
    module = _zampling(dm, _ScriptedHoldout, **options)
    recorder, metrics = _RoundRecorder(), _MetricRecorder()
    _fit(module, 1, FullParticipation(), recorder, metrics)
    assert isinstance(module, _ScriptedHoldout)
    masks, _ = recorder.rounds[0]
    for client_id in range(2):
        scores = module.scores[client_id]
        assert len(scores) == 5
        assert not torch.equal(scores[1], scores[4])  # training moved p after the best epoch
        best_p = module.score_estimator.probability(scores[1])
        expected = bernoulli_draw(best_p, module.generator(0, client_id, "zampling_upload"))
        assert torch.equal(masks[client_id], expected)
    assert metrics.metrics[0][EPOCHS_METRIC] == 5.0


def test_local_early_stopping_trains_only_on_the_kept_samples_and_stops_at_patience() -> None:
    # Adam with lr 0 never moves p and the continuous model scores w = Q·p itself, so the
    # held-out accuracy never improves after epoch 1: each client runs 1 + patience epochs
    # over its kept samples, 10% of them held out.
    dm = digits_federation(2)
    frozen = {"client_optimizer": lambda params: torch.optim.Adam(params, lr=0.0), "sampling": False}
    options = {"local_steps": None, "local_epochs": 50, "local_patience": 2, "batch_size": 32}
    module = _zampling(dm, _Counting, **frozen, **options)
    metrics = _MetricRecorder()
    _fit(module, 1, FullParticipation(), metrics)
    assert isinstance(module, _Counting)
    assert metrics.metrics[0][EPOCHS_METRIC] == 3.0
    steps = 0
    for client_id in range(2):
        size = dm.client_sizes[client_id]
        kept, held = module.local_holdout(client_id, size)
        assert len(held) == round(0.1 * size) and len(kept) + len(held) == size
        assert not set(kept.tolist()) & set(held.tolist())
        x, _ = module.client_data(client_id)
        full, _ = dm.client_tensors(client_id)
        assert torch.equal(x, full[kept])
        steps += 3 * -(-len(kept) // 32)
    assert module.losses == steps


def test_local_early_stopping_refuses_local_steps_and_bad_values() -> None:
    dm = digits_federation(2)
    with pytest.raises(ConfigError, match="local_steps=null"):
        _zampling(dm, local_patience=10)  # _zampling sets local_steps=3
    for key, value in (("local_patience", 0), ("local_val_fraction", 1.0), ("local_val_samples", 0)):
        options = {"local_steps": None, "local_epochs": 20, "local_patience": 2, key: value}
        with pytest.raises(ConfigError, match=f"method.{key}"):
            _zampling(dm, **options)
    # patience 10 needs 11 epochs to stop a round: with at most 10 it would be a setting that does nothing
    with pytest.raises(ConfigError, match=r"can never end a round of at most method\.local_epochs=10"):
        _zampling(dm, local_steps=None, local_epochs=10, local_patience=10)
    tiny = digits_federation(1000)  # 1,438 training digits: some clients hold a single one
    assert min(tiny.client_sizes) == 1
    with pytest.raises(ConfigError, match="a client here has 1 sample"):
        _fit(_zampling(tiny, local_steps=None, local_epochs=20, local_patience=2), 1)
    assert _zampling(dm).client_metric_names == (XENT_METRIC, RANGE_METRIC)  # no local epochs logged without it


def test_payloads_codecs_and_refusals() -> None:
    dm = digits_federation(2)
    module = _zampling(dm)
    assert module.uplink_channel.payload is Payload.BERNOULLI_MASK
    assert module.downlink_channel.payload is Payload.PROBABILITIES
    assert module.uplink_numel == module.n and module.sets_server_state
    assert module.uplink_channel.codec.name == BitPackCodec().name
    assert [type(cb) for cb in declared_callbacks(module)] == [ZamplingEvaluation]
    local = _zampling(dm, upload="probabilities")
    assert local.uplink_channel.payload is Payload.PROBABILITIES and local.client_metric_names == ()
    # arithmetic coding: the range coder's model is the broadcast p of the round
    coded = _zampling(dm, uplink="arithmetic", p_clamp=0.1)
    state = coded.broadcast_state(0)
    assert torch.equal(torch.from_numpy(coded.uplink_channel.codec.range.model_p).float(), state.clamp(0.1, 0.9))
    with pytest.raises(ConfigError, match="Bernoulli mask"):
        module.uplink_channel.attach(Sign())  # a sign of a mask is not a mask
    with pytest.raises(ConfigError, match="server_optimizer"):
        _zampling(dm, server_optimizer=lambda params: torch.optim.SGD(params, lr=1.0))
    with pytest.raises(ConfigError, match="aggregation"):
        _zampling(dm, aggregation="unbiased")


def test_score_estimators_are_strategies() -> None:
    assert isinstance(score_estimator("zampling"), ClippedScore)
    assert isinstance(score_estimator("zhou"), SigmoidScore) and isinstance(score_estimator("fedpm"), SigmoidScore)
    flags = {name: (score_estimator(name).mask_frozen, score_estimator(name).scale_by_p) for name in SCORE_NAMES}
    assert flags == {"zampling": (True, False), "zhou": (False, False), "fedpm": (False, True)}
    q = _tiny_q()
    weights = score_estimator("fedpm").weights(q)
    assert isinstance(weights, ZampledWeights) and weights.scale_by_p and not weights.mask_frozen
    with pytest.raises(ConfigError, match=r"method\.estimator='relu'"):
        score_estimator("relu")


SCORE_NAMES = ("zampling", "zhou", "fedpm")


# ---------------------------------------------------------------------------------- sensitivity
def test_hypercube_support_by_hand() -> None:
    p = torch.tensor([0.0, 0.005, 0.01, 0.3, 0.5, 0.85, 0.99, 1.0])
    assert hypercube_indicator(p, 0.01).tolist() == [False, False, True, True, True, True, True, False]
    assert hypercube_indicator(p, 0.2).tolist() == [False, False, False, True, True, False, False, False]
    assert hypercube_indicator(p, 0.5).tolist() == [False, False, False, False, True, False, False, False]
    assert perturbation_support(p, 0.2, "complement").tolist() == [True, True, True, False, False, True, True, True]
    with pytest.raises(ConfigError, match="sensitivity_taus"):
        hypercube_indicator(p, 0.6)
    with pytest.raises(ConfigError, match="sensitivity_region"):
        perturbation_support(p, 0.1, "everywhere")  # type: ignore[arg-type]


def test_perturbation_moves_only_the_support_and_stays_in_the_unit_cube() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 1.0, 0.05, 0.5, 0.7] * 2000)
    perturbed, eps = perturb_in_hypercube(p, 0.1, gen)
    support = hypercube_indicator(p, 0.1)
    assert torch.all(eps[~support] == 0) and torch.equal(perturbed[~support], p[~support])
    assert torch.equal(perturbed, (p + eps).clamp(0, 1))
    assert float(perturbed.min()) >= 0.0 and float(perturbed.max()) <= 1.0
    # eps ~ N(0, 1) on the 4,000 free coordinates: mean 0 ± 4/sqrt(4000), std 1 ± 0.05
    free_eps = eps[support]
    assert free_eps.numel() == 4000
    assert abs(float(free_eps.mean())) < 4 / 4000**0.5
    assert abs(float(free_eps.std()) - 1.0) < 0.05
    again, _ = perturb_in_hypercube(p, 0.1, torch.Generator().manual_seed(0))
    assert torch.equal(again, perturbed)  # seeded


def test_perturbation_draw_is_the_hypercube_perturbation_plus_its_full_draw() -> None:
    p = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    a, eps_a = perturb_in_hypercube(p, 0.2, torch.Generator().manual_seed(4))
    b, eps_b, draw = perturbation_draw(p, 0.2, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and torch.equal(eps_a, eps_b)  # the same stream, the same perturbation
    support = perturbation_support(p, 0.2, "hypercube")
    assert torch.equal(eps_b[support], draw[support]) and bool((eps_b[~support] == 0).all())
    assert float(draw.norm()) == pytest.approx(1000**0.5, rel=0.1)  # E||N(0, I_n)||^2 = n


def test_sensitivity_and_deviation_by_hand() -> None:
    assert relative_sensitivity(0.8, 0.8) == 0.0
    assert relative_sensitivity(0.5, 0.25) == 0.5
    assert relative_sensitivity(0.5, 0.75) == -0.5  # an improvement is a negative drop
    assert accuracy_deviation(0.5, 0.25, 5.0) == 5.0  # 25 percentage points / norm 5
    assert accuracy_deviation(0.5, 0.25, 0.0) == 0.0  # nothing perturbed


def test_sensitivity_study_logs_a_row_per_tau(make_config, tmp_path: Path) -> None:
    cfg = make_config(
        [
            "method=local_zampling",
            "data.num_clients=1",
            "rounds=1",
            "method.local_steps=3",
            "method.compression=4",
            "method.d=2",
            "reports.zampling_evaluation.val_samples=1",
            "reports.zampling_evaluation.test_samples=2",
            "reports.zampling_evaluation.sensitivity_taus=[0.0,0.5]",
            "reports.zampling_evaluation.sensitivity_perturbations=2",
            "reports.zampling_evaluation.sensitivity_samples=2",
        ]
    )
    s = run(cfg, tmp_path)
    assert s["test/sensitivity/reference_acc_expected"] == pytest.approx(s["test/acc"])
    assert s["test/sensitivity/0/perturbed_fraction"] == 1.0  # tau = 0: every p in [0, 1] moves
    assert s["test/sensitivity/0/eps_norm"] > 0
    # tau = 0.5 under the stated rule moves only p == 0.5 exactly: nothing, so no change
    assert s["test/sensitivity/0.5/perturbed_fraction"] == 0.0
    assert s["test/sensitivity/0.5/acc_expected"] == pytest.approx(s["test/acc"])
    assert s["test/sensitivity/0.5/sensitivity_expected"] == 0.0
    # tau = 0 perturbs every coordinate, so eps_tau is the whole draw and both deviations agree
    assert s["test/sensitivity/0/eps_full_norm"] == pytest.approx(s["test/sensitivity/0/eps_norm"])
    assert s["test/sensitivity/0/deviation_full_expected"] == pytest.approx(s["test/sensitivity/0/deviation_expected"])
    # tau = 0.5: nothing moves, but the full draw still has a norm near sqrt(n)
    assert s["test/sensitivity/0.5/eps_norm"] == 0.0
    assert s["test/sensitivity/0.5/eps_full_norm"] > 0


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_fast_path_matches_reference_over_a_training_run(backend: str) -> None:
    """The incremental Q·z and the free-column Qᵀ·g equal the full products (fast=False) step by step.

    A Local-Zampling-like loop on the small MLP at m/n = 32, d = 10: p starts 80% frozen (few
    flips, so the incremental forward and the free-column backward are used), clipped Adam
    steps freeze more columns as it runs (on ``torch``, block rebuilds), and at step 60 frozen
    columns are released again (a column outside the cached block becomes free).
    """
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=4)
    net = ZampledNetwork(SMALL)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    p0 = torch.round(torch.rand(510, generator=gen) * 10) / 10
    p0 = torch.where(torch.rand(510, generator=gen) < 0.8, torch.round(p0), p0)
    s = p0.clone().requires_grad_(True)
    adam = torch.optim.Adam([s], lr=0.02)
    fast, reference = ZampledWeights(q, backend=backend), ZampledWeights(q, fast=False)
    for step in range(120):
        if step == 60:
            with torch.no_grad():  # release a third of the frozen columns
                frozen = (s <= 0) | (s >= 1)
                release = frozen & (torch.rand(510, generator=gen) < 0.33)
                s[release] = torch.rand(int(release.sum()), generator=gen)
        p = probability_from_score(s, "zampling")
        z = torch.bernoulli(p.detach(), generator=gen)
        grads = []
        for weights in (fast, reference):
            p_leaf = p.detach().requires_grad_(True)
            w = weights(p_leaf, z)
            loss = torch.nn.functional.cross_entropy(net.forward(x, w), y)
            loss.backward()
            grads.append((w.detach(), p_leaf.grad))
        (w_fast, g_fast), (w_ref, g_ref) = grads
        assert torch.allclose(w_fast, w_ref, atol=2e-6, rtol=0), step
        assert torch.allclose(g_fast, g_ref, atol=1e-6, rtol=1e-4), step
        free = (p.detach() > 0) & (p.detach() < 1)
        assert torch.all(g_fast[~free] == 0)
        adam.zero_grad(set_to_none=True)
        s.grad = g_ref.clone()
        adam.step()
    # the fast shortcuts were actually exercised (the free-column gather on the compiled
    # kernels, the cached block and its rebuilds on torch), the reference never took them
    assert fast.stats["incremental"] >= 60
    if backend == "compiled":
        assert fast.stats["free_gathers"] >= 100 and fast.stats["block_builds"] == 0
    else:
        assert fast.stats["block_builds"] >= 2 and fast.stats["free_gathers"] == 0
    assert (
        reference.stats["incremental"] == 0 and reference.stats["block_builds"] == reference.stats["free_gathers"] == 0
    )


def test_incremental_drift_is_bounded_over_many_steps() -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=5)
    weights = ZampledWeights(q, refresh_every=10_000)  # no refresh: the drift itself is checked
    gen = torch.Generator().manual_seed(0)
    z = torch.bernoulli(torch.full((510,), 0.5), generator=gen)
    weights.weights_for(z)
    for _ in range(2000):
        z = torch.where(torch.rand(510, generator=gen) < 0.03, 1 - z, z)
        w = weights.weights_for(z)
    assert weights.stats["full"] == 1 and weights.stats["incremental"] == 2000
    exact = q.to_dense().double() @ z.double()
    # |w| ~ 0.1: 2000 float32 additions keep it within a few 1e-6 of the float64 product
    assert float((w.double() - exact).abs().max()) < 1e-5


def test_padded_columns_and_free_block_by_hand() -> None:
    q = _tiny_q()  # Q = [[2, 0, 1], [0, 3, -1]]
    rows, vals = q.padded_columns()
    assert rows.tolist() == [[0, 0], [1, 0], [0, 1]]  # column-major, padded with row 0 / value 0
    assert vals.tolist() == [[2.0, 0.0], [3.0, 0.0], [1.0, -1.0]]
    block = q.free_block(torch.tensor([1, 2]))
    assert torch.mv(block, torch.tensor([1.0, 2.0, 0.0])).tolist() == [6.0, -1.0]


def test_resume_continues_the_same_run(make_config, tmp_path: Path) -> None:
    # The lattice downlink's K and every client's Adam state come back from the checkpoint.
    args = [
        *DIGITS,
        "rounds=3",
        "method.compression=8",
        "method.local_steps=4",
        "method.downlink=lattice",
        "method.reset_optimizer=false",
        "reports.zampling_evaluation.test_samples=2",
        "checkpoint_every=1",
    ]
    straight = run(make_config(args), tmp_path / "straight")
    checkpoint = tmp_path / "straight" / "checkpoints" / "round-0002.ckpt"
    resumed = run(make_config([*args, f"ckpt_path={checkpoint}"]), tmp_path / "resumed")

    def final_p(folder: str) -> Tensor:
        return torch.load(tmp_path / folder / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]["p"]

    assert torch.equal(final_p("resumed"), final_p("straight"))
    for key in ("test/acc", "test/acc_sampled_mean", "test/acc_best_mask", "comm/downlink_bits_total"):
        assert resumed[key] == straight[key], key
    n = 4810 // 8
    assert straight["comm/downlink_bits_total"] == 10 * (32 * n + 2 * (32 + 4 * n))  # rounds 1-2 on the lattice


# ---------------------------------------------------------------------------------- batched evaluation
@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.parametrize("n", [510, 70_000])  # uint16 and uint32 column indices in the row layout
def test_matmat_rows_equal_matvec_of_each_mask(backend: str, n: int) -> None:
    q = zampling_q(torch.full((3000,), 50.0), n=n, d=7, seed=9)
    masks = torch.bernoulli(torch.full((5, n), 0.5), generator=torch.Generator().manual_seed(1))
    batched = q.matmat(masks, backend=backend)
    assert batched.shape == (5, 3000)
    for b in range(5):
        exact = (q.vals.double() * masks[b].double()[q.cols]).sum(1)  # row by row, in float64
        assert torch.allclose(batched[b].double(), exact, atol=1e-6)
        assert torch.allclose(batched[b], q.matvec(masks[b], backend=backend), atol=1e-6)
    with pytest.raises(ValueError, match=r"must be \(B, 3\)"):
        _tiny_q().matmat(torch.ones(3), backend=backend)


def test_forward_many_equals_forward_of_each_network() -> None:
    net = ZampledNetwork(MLP(in_features=4, hidden=[3], num_classes=2))
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, net.m, generator=gen)
    x = torch.randn(5, 4, generator=gen)
    out = net.forward_many(x, w)
    assert out.shape == (6, 5, 2)
    for b in range(6):
        assert torch.allclose(out[b], net.forward(x, w[b]), atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        net.forward_many(x, w[0])


def test_batched_sampled_accuracies_equal_one_by_one_on_the_same_masks() -> None:
    dm = digits_federation(2)
    module = _zampling(dm)
    batches = [(x, y) for x, y in dm.val_dataloader()]
    p = torch.rand(module.n, generator=torch.Generator().manual_seed(2))
    results = {}
    for per_forward in (1, 3, 7, 10):  # 7 masks: one chunk, a partial last chunk, one by one
        evaluation = ZamplingEvaluation(networks_per_forward=per_forward)
        evaluation._batches = batches
        gen = torch.Generator().manual_seed(5)
        results[per_forward] = evaluation.sampled_accuracies(module, p, 7, gen)
    assert len(set(results[1].tolist())) > 1  # distinct masks, distinct scores
    for per_forward in (3, 7, 10):
        assert torch.equal(results[per_forward], results[1])
    with pytest.raises(ConfigError, match=r"reports\.zampling_evaluation\.networks_per_forward"):  # checked when built
        declared_callbacks(_zampling(dm), settings={"zampling_evaluation": {"networks_per_forward": 0}})


def test_bitpacked_run_reports_the_range_coded_size_of_its_masks() -> None:
    class Bits(FederatedCallback):
        def __init__(self) -> None:
            self.bits: list[int] = []
            self.range: list[float] = []

        def on_client_upload(self, trainer: Any, module: Any, round_idx: int, client_id: int, message: Message) -> None:
            self.bits.append(message.num_bits)

        def on_round_end(self, trainer: Any, module: Any, round_idx: int, metrics: dict[str, Any]) -> None:
            self.range.append(metrics[RANGE_METRIC])

    dm = digits_federation(3)
    seen = {}
    for uplink in ("arithmetic", "bitpack"):
        module, bits = _zampling(dm, uplink=uplink), Bits()
        _fit(module, 2, FullParticipation(), bits)
        seen[uplink] = (module, bits)
    coded_module, coded = seen["arithmetic"]
    _, packed = seen["bitpack"]
    n = coded_module.n
    assert packed.bits == [n] * 6  # bit-packed: n bits per upload
    for r in range(2):  # the metric is the range coder's size of the same masks
        assert packed.range[r] == pytest.approx(sum(coded.bits[3 * r : 3 * r + 3]) / (3 * n), rel=1e-6)
    assert packed.range == coded.range


# ---------------------------------------------------------------------------------- uplink fallback
def _mask_and_model(n: int, p_value: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.bernoulli(torch.full((n,), 0.95), generator=gen), torch.full((n,), p_value)


def test_mask_codec_sends_the_range_code_with_a_flag_when_it_is_shorter() -> None:
    z, p = _mask_and_model(4096, 0.95)  # the masks are likely under p: about 0.29 bits each
    message = MaskCodec(model_p=p).encode(z)
    ranged = BernoulliRangeCodec(model_p=p).encode(z)
    assert ranged.num_bits < 4096
    assert message.num_bits == 1 + ranged.num_bits
    assert message.header_bits == 1
    assert message.payload[0] & 1 == 1  # the flag: range code
    assert torch.equal(message.decode(), z)


def test_mask_codec_falls_back_to_n_bits_plus_the_flag_when_the_range_code_is_longer() -> None:
    z, p = _mask_and_model(4096, 0.05)  # the masks are unlikely under p: the range code exceeds n bits
    message = MaskCodec(model_p=p).encode(z)
    assert BernoulliRangeCodec(model_p=p).encode(z).num_bits > 4096
    assert message.num_bits == 4096 + 1
    assert message.payload[0] & 1 == 0  # the flag: bit-packed
    assert torch.equal(message.decode(), z)


def test_mask_codec_refuses_a_stream_whose_flag_is_not_its_choice() -> None:
    z, p = _mask_and_model(64, 0.5)  # p = 1/2: the range code takes at least n bits, so bit-packing wins
    codec = MaskCodec(model_p=p)
    packed = BitPackCodec().encode(z)
    ranged = BernoulliRangeCodec(model_p=p).encode(z)
    stream = np.concatenate([[1], np.unpackbits(np.frombuffer(ranged.payload, np.uint8), bitorder="little")])
    forged = Message(
        payload=np.packbits(stream.astype(np.uint8), bitorder="little").tobytes(),
        num_bits=1 + ranged.num_bits,
        codec=codec,
        shape=(64,),
    )
    assert codec.encode(z).num_bits == 1 + packed.num_bits
    with pytest.raises(MessageDecodeError, match=r"^mask_range_or_bitpack: "):
        forged.decode()


# ---------------------------------------------------------------------------------- steps by hand
def _sampled_pair(
    estimator: str, *, sampling: bool = True, mask_frozen: bool | None = None
) -> tuple[SampledNetwork, SampledNetwork, Tensor, Tensor]:
    """Two identical client networks on the small MLP (one for autograd, one by hand) and a batch.

    p starts with a third of its coordinates frozen at exactly 0 or 1, so the masked backward
    and the clip's bounds are exercised. ``mask_frozen`` overrides the estimator's own rule for
    the Q·z product.
    """
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=4)
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(510, generator=gen)
    p = torch.where(torch.rand(510, generator=gen) < 0.33, torch.round(p), p)
    est = score_estimator(estimator)
    chain = linear_chain(SMALL)
    networks = [
        SampledNetwork(
            est.score(p),
            network=ZampledNetwork(SMALL),
            weights=est.weights(q) if mask_frozen is None else ZampledWeights(q, mask_frozen=mask_frozen),
            estimator=est,
            sampling=sampling,
            generator=torch.Generator().manual_seed(7),
            chain=chain,
            chain_gradients=chain_gradients_,
        )
        for _ in range(2)
    ]
    x, y = torch.randn(32, 1, 28, 28, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    return networks[0], networks[1], x, y


@pytest.mark.parametrize(
    ("estimator", "sampling", "mask_frozen"),
    [
        ("zampling", True, None),
        ("zampling", False, None),
        ("zampling", True, False),  # the clip without the gradient mask: its own derivative zeroes s outside [0, 1]
        ("zhou", True, None),
        ("fedpm", True, None),
    ],
)
def test_hand_taken_step_equals_autograd_in_loss_and_score_gradient_over_adam_steps(
    estimator: str, sampling: bool, mask_frozen: bool | None
) -> None:
    reference, by_hand, x, y = _sampled_pair(estimator, sampling=sampling, mask_frozen=mask_frozen)
    optimizers = [torch.optim.Adam(net.parameters(), lr=0.05) for net in (reference, by_hand)]
    for step in range(12):  # Adam moves s, so later steps draw other masks and flip bits incrementally
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        reference.resample()
        expected = torch.nn.functional.cross_entropy(reference(x), y)
        expected.backward()
        loss = by_hand.fused_gradient_(x, y)
        if step == 0 or sampling:  # the same forward ops on the same w (the same masks drawn)
            assert torch.equal(loss, expected.detach()), step
        else:  # w = Q·p of scores that Adam moved by different roundings
            assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-5), step
        g_ref, g_hand = reference.score.grad, by_hand.score.grad
        assert g_ref is not None and g_hand is not None
        assert torch.allclose(g_hand, g_ref, rtol=1e-4, atol=1e-7), (step, (g_hand - g_ref).abs().max())
        if estimator == "zampling" and mask_frozen is None:  # no gradient where p is 0 or 1
            p = reference.probabilities().detach()
            assert torch.all(g_hand[(p == 0) | (p == 1)] == 0)
            assert int(((p == 0) | (p == 1)).sum()) > 100
        if mask_frozen is False:  # the clip's own derivative: none where s ∉ (0, 1)
            outside = (reference.score <= 0) | (reference.score >= 1)
            assert bool(outside.any()) and torch.all(g_hand[outside] == 0)
        for opt in optimizers:
            opt.step()
        assert torch.allclose(by_hand.score, reference.score, rtol=1e-5, atol=1e-6), step
    assert by_hand._weights.stats == reference._weights.stats  # the same products, full or incremental
    assert (by_hand._weights.stats["incremental"] > 0) == sampling  # w = Q·p moves everywhere each step


def test_hand_taken_step_updates_the_cached_w_in_place_and_keeps_its_value() -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=4)
    in_place, copying = ZampledWeights(q), ZampledWeights(q)
    gen = torch.Generator().manual_seed(0)
    z = torch.bernoulli(torch.full((q.n,), 0.5), generator=gen)
    first = in_place.weights_for(z, in_place=True)
    copying.weights_for(z)
    for _ in range(5):
        z = z.clone()
        flips = torch.randint(q.n, (10,), generator=gen)
        z[flips] = 1 - z[flips]
        same = in_place.weights_for(z, in_place=True)
        assert same is first  # a few flips: updated incrementally, in place
        kept = copying.weights_for(z)
        assert kept is not first and torch.equal(same, kept)
    assert in_place.stats["incremental"] == 5


def test_draw_weights_draws_torch_bernoulli_masks_and_their_products_bit_for_bit() -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=4)
    drawing, reference = ZampledWeights(q, refresh_every=7), ZampledWeights(q, refresh_every=7)  # refreshes too
    g_draw, g_ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    p = torch.rand(q.n, generator=torch.Generator().manual_seed(5))
    frozen = (p > 0.5).float()
    p[50:] = 0.5  # about half of the bits flip: over the incremental limit, full products
    p[:50] = frozen[:50]
    for step in range(40):
        if step == 20:  # most of p frozen: few flips, the incremental kernel
            p[:480] = frozen[:480]
        w = drawing.draw_weights(p, g_draw)
        z = torch.bernoulli(p, generator=g_ref)
        assert torch.equal(w, reference.weights_for(z, in_place=True)), step
        assert torch.equal(drawing._z, z), step
    assert drawing.stats == reference.stats
    assert drawing.stats["incremental"] >= 15 and drawing.stats["full"] >= 21  # every path taken
    assert torch.equal(torch.rand(3, generator=g_draw), torch.rand(3, generator=g_ref))  # the streams stay in step


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.25])
def test_draw_weights_refuses_a_probability_that_is_nan_or_outside_0_1(bad: float) -> None:
    q = zampling_q(row_fan_in(SMALL), n=510, d=10, seed=4)
    weights, gen = ZampledWeights(q), torch.Generator().manual_seed(0)
    p = torch.full((q.n,), 0.5)
    weights.draw_weights(p, gen)  # the first draw: torch.bernoulli's own checks
    p[7] = bad
    with pytest.raises(ValueError, match="NaN or outside"):
        weights.draw_weights(p, gen)


def test_zampling_runs_take_hand_steps_that_equal_autograd_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = digits_federation(3)
    finals = {}
    for backend in ("loop", "auto"):
        module = _zampling(dm, compression=8, local_steps=5, local_execution=backend)
        calls = record_calls(monkeypatch, SampledNetwork, "fused_gradient_")
        _fit(module, 3)
        assert len(calls) == (3 * 3 * 5 if backend == "auto" else 0)  # 3 rounds x 3 clients x 5 steps by hand
        assert module.local_runner.name == ("fused" if backend == "auto" else "loop")
        finals[backend] = module.p.detach().clone()
    assert torch.equal(finals["auto"], finals["loop"])  # the same masks drawn, so the same means of bits


def test_local_execution_fused_names_why_zampling_cannot_take_its_steps_by_hand() -> None:
    from fedlightning.models.cnn import SmallCNN

    dm = digits_federation(2)
    model = SmallCNN(input_shape=(1, 8, 8), num_classes=10)
    cnn = Zampling(model=model, datamodule=dm, compression=4, local_steps=1, local_execution="fused")
    with pytest.raises(ConfigError, match=r"^local_execution=fused cannot run .*its model cannot: SmallCNN is not"):
        _fit(cnn, 1)
    counting = _zampling(dm, _Counting)
    assert FusedRunner().refusal(counting) == (
        "its local work is its own (local_loss, on_local_step_end), not the engine's cross-entropy steps"
    )
