"""Local execution: one key chooses a backend per round; the engine itself names none."""

from __future__ import annotations

import ast
import functools
import logging
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import fedlightning.federated.module as engine
from fedlightning.datamodules import DigitsDataModule
from fedlightning.federated.local import FusedRunner, LoopRunner, VectorisedRunner, choose_runner
from fedlightning.methods import FedAvg, FedShuffle
from fedlightning.models.mlp import MLP
from fedlightning.run import configure_threads
from tests.conftest import round_trainer


def _mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=[16], num_classes=10)


def _on(module: FedAvg, device: str) -> FedAvg:
    module._device = torch.device(device, 0) if device == "cuda" else torch.device(device)  # no tensor moves
    return module


def test_engine_module_has_no_backend_branches() -> None:
    source = Path(engine.__file__).read_text()
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) for a in n.names}
    words = {n: set(re.findall(r"[A-Z]?[a-z]+", n)) for n in names}  # snake_case and CamelCase parts
    backend_words = {"fused", "Fused", "fuse", "vectorised", "Vectorised", "stacked", "Stacked", "chain"}
    assert sorted(n for n, parts in words.items() if parts & backend_words) == []


def test_auto_takes_vectorised_on_cuda_fused_on_a_cpu_and_loop_where_neither_serves() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    runner, why = choose_runner(_on(FedAvg(model=_mlp(), datamodule=dm, client_optimizer=sgd), "cuda"), "auto")
    assert isinstance(runner, VectorisedRunner) and why == "local_execution=auto"
    runner, why = choose_runner(FedAvg(model=_mlp(), datamodule=dm, client_optimizer=sgd), "auto")
    assert isinstance(runner, FusedRunner)
    assert why == "local_execution=auto; vectorised: only on CUDA, as the sequential backends are as fast on a CPU"
    adam = functools.partial(torch.optim.Adam, lr=0.1)
    runner, _ = choose_runner(_on(FedAvg(model=_mlp(), datamodule=dm, client_optimizer=adam), "cuda"), "auto")
    assert isinstance(runner, VectorisedRunner)  # Adam clients are stacked too
    amsgrad = functools.partial(torch.optim.Adam, lr=0.1, amsgrad=True)
    runner, why = choose_runner(_on(FedAvg(model=_mlp(), datamodule=dm, client_optimizer=amsgrad), "cuda"), "auto")
    assert type(runner) is LoopRunner
    assert why == (
        "local_execution=auto; vectorised: method.client_optimizer torch.optim.Adam(lr=0.1, amsgrad=True) turns on "
        "amsgrad, which StackedAdam does not implement; "
        "fused: its client optimiser is not torch.optim.SGD (method.client_optimizer)"
    )
    shuffle = FedShuffle(model=_mlp(), datamodule=dm, client_optimizer=sgd)
    assert isinstance(choose_runner(_on(shuffle, "cuda"), "auto")[0], VectorisedRunner)  # per-client rates stack


def test_the_chosen_backend_and_its_reason_are_logged_once_before_the_first_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    module = FedAvg(model=_mlp(), datamodule=DigitsDataModule(num_clients=3, seed=0), max_grad_norm=1.0)
    with caplog.at_level(logging.INFO, logger="fedlightning.federated.module"):
        round_trainer(3, []).fit(module)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Local execution")]
    assert lines == [
        "Local execution: loop (local_execution=auto; vectorised: only on CUDA, as the sequential backends are "
        "as fast on a CPU; fused: method.max_grad_norm clips each gradient)."
    ]


def test_a_method_reads_the_fused_layers_through_the_runner_only_while_the_fused_backend_runs() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    fused = FusedRunner()
    fused.begin_round(FedAvg(model=_mlp(), datamodule=dm))
    assert [layer.out_features for layer in fused.layers or []] == [16, 10]
    assert LoopRunner().layers is None and VectorisedRunner().layers is None
    assert all(isinstance(layer, nn.Linear) for layer in fused.layers or [])


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (16, None)])
def test_threads_auto_takes_one_per_process_on_at_most_two_cores_and_torchs_default_elsewhere(
    cores: int, expected: int | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = torch.get_num_threads()
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(cores)))
    try:
        torch.set_num_threads(3)  # stands in for torch's default on the larger machine
        with caplog.at_level(logging.INFO):
            n = configure_threads("auto")
        assert n == (expected if expected is not None else 3)
        reason = "one per process" if expected == 1 else "torch's default"
        assert f"threads=auto: {reason} on a machine with {cores} core" in caplog.text
    finally:
        torch.set_num_threads(before)


def test_backends_answer_for_methods_whose_local_work_names_hooks_the_engine_lacks() -> None:
    from fedlightning.methods import FjORD, Zampling

    dm = DigitsDataModule(num_clients=3, seed=0)
    zampling = _on(Zampling(model=_mlp(), datamodule=dm, compression=4), "cuda")  # client_network: Zampling's own
    fjord = _on(FjORD(model=_mlp(), datamodule=dm), "cuda")  # step_loss, client_indices, ...: FjORD's own
    assert FusedRunner().refusal(zampling) is None  # its hand steps
    assert FusedRunner().refusal(fjord) == (
        "its local work is its own (client_update, step_loss, client_indices, candidates, teacher_width, reach), "
        "not the engine's cross-entropy steps"
    )
    assert VectorisedRunner().refusal(fjord) is None  # its stacked local work
    assert LoopRunner().refusal(zampling) is None and LoopRunner().refusal(fjord) is None
