"""The Zampling family's stacked local work on the vectorised backend equals its loop (arXiv 2503.14246)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fedlightning.datamodules import DigitsDataModule
from fedlightning.datamodules.partition import QuantitySkewPartition
from fedlightning.errors import ConfigError
from fedlightning.federated.failures import ClientFailures
from fedlightning.federated.local import ClientResult, VectorisedRunner
from fedlightning.methods import zampling_stacked
from fedlightning.methods.fedpm import FedPM
from fedlightning.methods.supermask import Supermask
from fedlightning.methods.zampling import RANGE_METRIC, XENT_METRIC, Zampling
from fedlightning.models.mlp import MLP
from fedlightning.models.zampling import row_fan_in, zampling_q
from fedlightning.sampling import FullParticipation
from tests.conftest import record_calls
from tests.test_zampling import _fit, _RoundRecorder, _zampling

ROUNDS = 3


def _federation() -> DigitsDataModule:
    """Four digits clients of 246, 362, 158 and 528 samples: 8, 12, 5 and 17 steps of 32 per epoch."""
    dm = DigitsDataModule(num_clients=4, partition=QuantitySkewPartition(alpha=2.0), seed=0)
    dm.setup("fit")
    return dm


class _Run:
    """What a run's clients produced: every round's uploads and p, each client's result and first loss."""

    def __init__(self, module: Zampling, recorder: _RoundRecorder, results: list[ClientResult], first: list[Tensor]):
        self.module = module
        self.rounds = recorder.rounds
        self.results = results
        self.first_losses = torch.cat(first)


def _train(
    backend: str, monkeypatch: pytest.MonkeyPatch, cls: type[Zampling], callbacks: tuple[Any, ...], **options: Any
) -> _Run:
    results: list[ClientResult] = []
    first: list[Tensor] = []
    client_update, stacked, record = (
        Zampling.client_update,
        Zampling.stacked_client_updates,
        Zampling.record_start_losses,
    )

    def one(self: Zampling, **kwargs: Any) -> ClientResult:
        results.append(client_update(self, **kwargs))
        return results[-1]

    def share(self: Zampling, **kwargs: Any) -> list[ClientResult]:
        results.extend(stacked(self, **kwargs))
        return results[-len(kwargs["share"]) :]

    def started(self: Zampling, losses: Tensor) -> None:
        first.append(losses.detach().clone())
        record(self, losses)

    with monkeypatch.context() as patch:
        patch.setattr(Zampling, "client_update", one)
        patch.setattr(Zampling, "stacked_client_updates", share)
        patch.setattr(Zampling, "record_start_losses", started)
        module = _zampling(_federation(), cls, local_execution=backend, **options)
        recorder = _RoundRecorder()
        _fit(module, ROUNDS, FullParticipation(), recorder, *callbacks)
    return _Run(module, recorder, results, first)


def _stragglers() -> tuple[Any, ...]:
    return (ClientFailures(straggler_probability=0.6, straggler_fraction=0.5),)


CASES: dict[str, tuple[type[Zampling], dict[str, Any], Any]] = {
    "zampling_local_steps": (Zampling, {"local_steps": 5}, tuple),
    "zampling_local_epochs": (Zampling, {"local_steps": None, "local_epochs": 2}, tuple),
    "zampling_clipped_clamped_arithmetic": (
        Zampling,
        {"local_steps": None, "max_grad_norm": 0.05, "p_clamp": 0.01, "uplink": "arithmetic"},
        tuple,
    ),
    "zampling_continuous": (Zampling, {"local_steps": None, "sampling": False}, tuple),
    "zampling_stragglers": (Zampling, {"local_steps": None}, _stragglers),
    "fedpm_local_epochs": (FedPM, {"compression": None, "local_steps": None}, tuple),
    "supermask_local_steps": (Supermask, {"compression": None, "local_steps": 4}, tuple),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vectorised_clients_upload_the_loops_masks_and_end_at_its_p_with_its_losses(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, options, callbacks = CASES[case]
    loop = _train("loop", monkeypatch, cls, callbacks(), **options)
    calls = record_calls(monkeypatch, zampling_stacked, "train_scores_stacked")
    vec = _train("vectorised", monkeypatch, cls, callbacks(), **options)
    assert vec.module.local_runner.name == "vectorised" and len(calls) == ROUNDS  # one stacked share per round
    assert loop.module.local_runner.name == "loop"
    assert len(vec.results) == len(loop.results) == 4 * ROUNDS
    assert not torch.equal(loop.rounds[0][0], loop.rounds[1][0])  # training moved p
    for (masks_v, p_v), (masks_l, p_l) in zip(vec.rounds, loop.rounds, strict=True):
        assert torch.equal(masks_v, masks_l)  # each client's masks from its own streams: the loop's, bit for bit
        assert torch.equal(p_v, p_l)  # so the server's mean of bits is the loop's
    for v, s in zip(vec.results, loop.results, strict=True):
        assert v.num_samples == s.num_samples
        assert float(v.loss) == pytest.approx(float(s.loss), rel=1e-5)
        assert v.metrics == s.metrics  # the same masks under the same p: the same code lengths
        assert set(v.metrics) == {XENT_METRIC, RANGE_METRIC}
    assert vec.first_losses.shape == loop.first_losses.shape
    assert torch.allclose(vec.first_losses, loop.first_losses, rtol=1e-5, atol=0)


def test_vectorised_clients_uploading_p_end_within_float_rounding_of_the_loops_p(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # p_new itself is uploaded: the scores differ by the rounding of the batched products
    # (a full Q·z per step, where the loop updates w incrementally, and the K networks at once).
    options = {"local_steps": None, "upload": "probabilities"}
    loop = _train("loop", monkeypatch, Zampling, (), **options)
    vec = _train("vectorised", monkeypatch, Zampling, (), **options)
    assert vec.module.local_runner.name == "vectorised"
    for (_, p_v), (_, p_l) in zip(vec.rounds, loop.rounds, strict=True):
        assert torch.allclose(p_v, p_l, rtol=0, atol=1e-5), (p_v - p_l).abs().max()
    for v, s in zip(vec.results, loop.results, strict=True):
        assert float(v.loss) == pytest.approx(float(s.loss), rel=1e-5)


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_rmatmat_rows_equal_rmatvec_of_each_gradient_exactly(backend: str) -> None:
    q = zampling_q(row_fan_in(MLP(in_features=64, hidden=[32], num_classes=10)), n=300, d=10, seed=1)
    g = torch.randn(5, q.m, generator=torch.Generator().manual_seed(0))
    batched = q.rmatmat(g, backend=backend)  # type: ignore[arg-type]
    assert batched.shape == (5, q.n)
    assert torch.equal(batched, torch.stack([q.rmatvec(row, backend=backend) for row in g]))  # type: ignore[arg-type]
    assert torch.allclose(batched, g @ q.to_dense(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"must be \(B, 2410\)"):
        q.rmatmat(g[:, :-1])


class _OwnLoss(Zampling):
    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        return super().local_loss(model, x, y)


class _Augmenting(DigitsDataModule):
    def augment(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return self.transform(x) + 0.01 * torch.randn(x.shape, generator=generator)


def _dropout_zampling(dm: DigitsDataModule, **options: Any) -> Zampling:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Dropout(0.1), nn.ReLU(), nn.Linear(32, 10))
    return Zampling(model=model, datamodule=dm, compression=4, local_steps=3, **options)


REFUSALS: dict[str, tuple[Any, str]] = {
    "local_patience": (
        lambda dm, **o: _zampling(dm, local_patience=1, local_steps=None, local_epochs=3, **o),
        r"method\.local_patience stops each client",
    ),
    "reset_optimizer": (
        lambda dm, **o: _zampling(dm, reset_optimizer=False, **o),
        r"method\.reset_optimizer=false carries",
    ),
    "optimizer_lambda": (
        lambda dm, **o: _zampling(dm, client_optimizer=lambda params: torch.optim.Adam(params, lr=0.1), **o),
        r"method\.client_optimizer must be a functools\.partial",
    ),
    "optimizer_amsgrad": (
        lambda dm, **o: _zampling(dm, client_optimizer=functools.partial(torch.optim.Adam, lr=0.1, amsgrad=True), **o),
        r"method\.client_optimizer torch\.optim\.Adam\(lr=0\.1, amsgrad=True\) turns on amsgrad",
    ),
    "optimizer_rmsprop": (
        lambda dm, **o: _zampling(dm, client_optimizer=functools.partial(torch.optim.RMSprop, lr=0.1), **o),
        r"method\.client_optimizer is torch\.optim\.RMSprop\(lr=0\.1\); the stacked clients serve only",
    ),
    "own_local_loss": (
        lambda dm, **o: _zampling(dm, _OwnLoss, **o),
        r"its local work is its own \(local_loss\), not Zampling's stacked local work",
    ),
    "dropout_model": (
        _dropout_zampling,
        r"model: its Dropout layers draw from the global random stream, unlike the stacked clients",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_vectorised_zampling_refuses_each_setting_it_does_not_implement_before_training(case: str) -> None:
    build, sentence = REFUSALS[case]
    dm = DigitsDataModule(num_clients=2, seed=0)
    dm.setup("fit")
    assert VectorisedRunner().refusal(build(dm)) is not None
    module = build(dm, local_execution="vectorised")
    before = module.p.detach().clone()
    with pytest.raises(ConfigError, match=rf"^local_execution=vectorised cannot run \w+'s clients: {sentence}"):
        _fit(module, 1)
    assert torch.equal(module.p.detach(), before)  # refused before any client trained


def test_vectorised_zampling_refuses_a_loss_other_than_plain_cross_entropy_and_an_augmenting_datamodule() -> None:
    dm = DigitsDataModule(num_clients=2, seed=0)
    dm.setup("fit")
    smoothed = _zampling(dm)
    assert VectorisedRunner().refusal(smoothed) is None
    smoothed.loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    assert VectorisedRunner().refusal(smoothed) == (
        "its loss is not the plain cross-entropy of a classification task (data.task)"
    )
    augmenting = _Augmenting(num_clients=2, seed=0)
    augmenting.setup("fit")
    assert VectorisedRunner().refusal(_zampling(augmenting)) == (
        "data: _Augmenting augments each batch randomly, which the stacked clients do not reproduce"
    )


def test_fedpm_and_supermask_share_zamplings_stacked_local_work() -> None:
    dm = DigitsDataModule(num_clients=2, seed=0)
    dm.setup("fit")
    for cls in (Zampling, FedPM, Supermask):
        options = {} if cls is Zampling else {"compression": None}
        assert VectorisedRunner().refusal(_zampling(dm, cls, **options)) is None, cls.__name__
