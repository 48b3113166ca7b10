"""The catalogue of bad inputs: each stops before compute with one sentence naming the key and the fix.

Most cases run in-process: composition (Hydra's own refusals, told as one sentence by
:func:`fedlightning.jobs.error_sentence`), the schema (:func:`fedlightning.schema.validate_config`)
or :func:`fedlightning.run.run` itself. The command maps each of them to exit status 1 and the
sentence as its last stderr line, which the CLI cases at the end check on three of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig

from fedlightning.errors import ConfigError, FedLightningError
from fedlightning.jobs import error_sentence
from fedlightning.run import run
from fedlightning.schema import validate_config

from .conftest import CONFIG_DIR, QUIET, REPO_ROOT

Composer = Callable[[list[str]], DictConfig]

# (overrides, fragments the sentence must hold: the key, then the fix)
COMPOSE_CASES = {
    "unknown method": (["method=fedavgg"], ["method=fedavgg is not a config", "did you mean method=fedavg?"]),
    "unknown data": (["data=mnistt"], ["data=mnistt is not a config", "did you mean data=mnist?", "choose one of"]),
    "unknown experiment": (
        ["+experiment=compresion_mnist"],
        ["experiment=compresion_mnist is not a config", "compression_mnist", "configs/experiment/"],
    ),
    "unknown compressor": (["compressor=topk"], ["compressor=topk", "did you mean compressor=top_k?"]),
    "top-level key without +": (["foo=1"], ["foo is not a key of the config", "--cfg job", "TrainSchema"]),
    "misspelt top-level key without +": (["rouns=3"], ["rouns is not a key", "did you mean rounds?"]),
    "group key without +": (
        ["method.lcoal_epochs=2"],
        ["method.lcoal_epochs is not a key", "did you mean method.local_epochs?", "--cfg job"],
    ),
    "misspelt nested key without +": (
        ["method.client_optimizer.lrr=0.1"],
        ["method.client_optimizer.lrr is not a key", "did you mean method.client_optimizer.lr?"],
    ),
    "misspelt key the config leaves at its default": (
        ["trainer.max_epoch=3"],
        ["trainer.max_epoch is not a key", "did you mean +trainer.max_epochs=...?"],
    ),
    "group key without + and no close key": (
        ["method.zzz=2"],
        ["method.zzz is not a key", "--cfg job", "+method.zzz=... if its component takes it"],
    ),
    "malformed override": (["rounds=="], ["rounds==", "Error parsing override"]),
}

SCHEMA_CASES = {
    "rounds not a number": (
        ["rounds=abc"],
        ["rounds (the number of federated rounds) must be an integer (got 'abc')", "e.g. rounds=50"],
    ),
    "rounds fractional": (
        ["rounds=2.5"],
        ["rounds (the number of federated rounds) must be an integer (got 2.5)", "e.g. rounds=50"],
    ),
    "rounds boolean": (["rounds=true"], ["must be an integer (got true)"]),
    "rounds zero": (["rounds=0"], ["rounds", "must be at least 1 (got 0)", "e.g. rounds=50"]),
    "rounds negative": (["rounds=-5"], ["rounds", "must be at least 1 (got -5)"]),
    "threads zero": (["threads=0"], ["threads", "must be at least 1 (got 0)", "e.g. threads=auto"]),
    "threads text": (
        ["threads=two"],
        ["threads", "must be an integer or one of 'auto' or null (got 'two')", "e.g. threads=auto"],
    ),
    "local_execution unknown": (
        ["local_execution=gpu"],
        ["local_execution", "must be one of 'auto', 'loop', 'fused', 'vectorised' (got 'gpu')"],
    ),
    "checkpoint_every negative": (["checkpoint_every=-1"], ["checkpoint_every", "at least 0", "checkpoint_every=10"]),
    "checkpoint_every fractional": (["checkpoint_every=1.5"], ["checkpoint_every", "must be an integer (got 1.5)"]),
    "eval_every zero": (["eval_every=0"], ["eval_every", "must be at least 1", "e.g. eval_every=1"]),
    "eval_every text": (["eval_every=abc"], ["eval_every", "must be an integer (got 'abc')"]),
    "seed negative": (["seed=-1"], ["seed", "must be at least 0", "e.g. seed=0"]),
    "seed fractional": (["seed=0.5"], ["seed", "must be an integer (got 0.5)", "e.g. seed=0"]),
    "clients_per_round zero": (["clients_per_round=0"], ["clients_per_round", "at least 1", "clients_per_round=10"]),
    "clients_per_round text": (
        ["clients_per_round=ten"],
        ["clients_per_round", "must be an integer or null (got 'ten')"],
    ),
    "boolean as text": (
        ["save_partition=maybe"],
        ["save_partition", "must be true or false (got 'maybe')", "save_partition=true"],
    ),
    "boolean as number": (["save_partition=1"], ["save_partition", "must be true or false (got 1)"]),
    "ckpt_path as number": (["ckpt_path=3"], ["ckpt_path", "must be a string or null (got 3)"]),
    "unknown top-level key": (["+foo=1"], ["foo is not a top-level key", "remove +foo=..."]),
    "misspelt top-level key": (["+roundz=3"], ["roundz is not a top-level key", "did you mean rounds?"]),
    "client lr negative": (["method.client_optimizer.lr=-1"], ["method.client_optimizer.lr must be positive", "e.g."]),
    "client lr zero": (["method.client_optimizer.lr=0"], ["method.client_optimizer.lr must be positive"]),
    "server lr negative": (["method.server_optimizer.lr=-0.1"], ["method.server_optimizer.lr must be positive"]),
    "momentum negative": (
        ["method.client_optimizer.momentum=-0.5"],
        ["client_optimizer.momentum must be non-negative"],
    ),
    "batch_size zero": (["method.batch_size=0"], ["method.batch_size must be at least 1"]),
    "batch_size text": (
        ["method.batch_size=abc"],
        ["method.batch_size must be an integer (got 'abc')", "its default is method.batch_size=32"],
    ),
    "local_epochs zero": (["method.local_epochs=0"], ["method.local_epochs must be at least 1"]),
    "local_steps fractional": (["method.local_steps=2.5"], ["method.local_steps must be an integer or null (got 2.5)"]),
    "aggregation unknown": (
        ["method.aggregation=foo"],
        ["method.aggregation must be one of 'normalised', 'unbiased' (got 'foo')"],
    ),
    "unknown method key": (
        ["+method.lcoal_epochs=2"],
        ["method has no key lcoal_epochs", "did you mean local_epochs?"],
    ),
    "unknown optimiser key": (["+method.client_optimizer.lrr=0.1"], ["client_optimizer has no key lrr", "mean lr?"]),
    "unknown data key": (["+data.rooot=/tmp"], ["data has no key rooot", "did you mean root?"]),
    "num_clients text": (
        ["data.num_clients=abc"],
        ["data.num_clients must be an integer (got 'abc')", "default is data.num_clients=10"],
    ),
    "num_clients zero": (["data.num_clients=0"], ["data.num_clients must be at least 1"]),
    "val_fraction text": (["data.val_fraction=abc"], ["data.val_fraction must be a number (got 'abc')"]),
    "missing partition file": (
        ["+data.partition_file=/nonexistent/partition.json"],
        ["data.partition_file=/nonexistent/partition.json does not exist", "or unset it"],
    ),
    "unknown partition key": (["+partition.alfa=1"], ["partition has no key alfa", "did you mean alpha?"]),
    "key of another partition": (
        ["partition=iid", "+partition.alpha=0.5"],
        ["partition has no key alpha", "IIDPartition takes seed, min_partition_size."],
    ),
    "unknown compressor key": (
        ["compressor=top_k", "+compressor.compressor.fractio=0.1"],
        ["compressor.compressor has no key fractio", "did you mean fraction?"],
    ),
    "compressor boolean as text": (
        ["compressor=top_k", "compressor.error_feedback=maybe"],
        ["compressor.error_feedback must be true or false (got 'maybe')"],
    ),
    "unknown sampler key": (["sampler=uniform", "+sampler.clients=3"], ["sampler has no key clients"]),
    "unknown downlink key": (["downlink=qsgd", "+downlink.compressor.levels=4"], ["downlink.compressor has no key"]),
    "unknown trainer key": (["+trainer.max_epoch=3"], ["trainer has no key max_epoch", "did you mean max_epochs?"]),
    "unknown logger key": (["logger=csv", "+logger.csv.nme=x"], ["logger.csv has no key nme", "did you mean name?"]),
    "unknown model key": (["model=mlp", "+model.hiden=[8]"], ["model has no key hiden", "did you mean hidden?"]),
    "target that does not import": (["method._target_=fedlightning.methods.NoSuch"], ["method._target_", "spelling"]),
}

RUN_CASES = {
    "wrong data.root": (["data=mnist", "data.root=/nonexistent/folder", "model=mnistfc"], ["data.root"]),
    "cohort larger than the federation": (
        ["sampler=uniform", "clients_per_round=50"],
        ["clients_per_round=50 exceeds data.num_clients=10", "lower clients_per_round"],
    ),
    "negative Dirichlet alpha": (["partition.alpha=-1"], ["partition.alpha"]),
    "max_grad_norm negative": (
        ["method.max_grad_norm=-1"],
        ["method.max_grad_norm must be a positive finite number or null (got -1)", "method.max_grad_norm=1.0"],
    ),
    "max_grad_norm zero": (["method.max_grad_norm=0"], ["method.max_grad_norm must be a positive finite number"]),
    "max_grad_norm not finite": (["method.max_grad_norm=inf"], ["method.max_grad_norm", "(got inf)"]),
    "top-k that keeps every coordinate": (
        ["compressor=top_k", "+compressor.compressor.k=100000000", "compressor.compressor.fraction=null"],
        ["compressor.compressor.k=100000000 keeps every coordinate", "set compressor.compressor.k below"],
    ),
    "top-k fraction that keeps every coordinate": (
        ["compressor=top_k", "compressor.compressor.fraction=1.0", "compressor.granularity=model"],
        ["compressor.compressor.fraction=1 keeps every coordinate of the", "compressor=none"],
    ),
    "downlink top-k that keeps every coordinate": (
        ["downlink=top_k", "+downlink.compressor.k=100000000", "downlink.compressor.fraction=null"],
        ["downlink.compressor.k=100000000 keeps every coordinate", "or use downlink=none"],
    ),
    "model for other inputs": (["model=mnistfc"], ["model=mnistfc expects 784 input features"]),
    # Fed-IHT broadcasts a hard-thresholded model of its own: the refusal points to its codec under
    # either scheme, not from one scheme to the other.
    "downlink operator on an own broadcast (Algorithm 1)": (
        ["method=fediht", "downlink=natural"],
        [
            "FedIHT broadcasts a hard-thresholded model, which the downlink compressor natural does not compress",
            "downlink=none",
        ],
    ),
    "downlink operator on an own broadcast (replica)": (
        ["method=fediht", "downlink=natural", "downlink.scheme=replica"],
        [
            "FedIHT broadcasts a hard-thresholded model, which the downlink compressor natural does not compress",
            "downlink=none",
        ],
    ),
    "infinite heterogeneity of the synthetic clients": (
        ["data=synthetic_regression", "partition=iid", "model=mlp", "data.heterogeneity=inf"],
        ["data.heterogeneity must be a finite number >= 0 (got inf)", "features and targets infinite"],
    ),
    "synthetic noise beyond float32": (
        ["data=synthetic_regression", "partition=iid", "model=mlp", "data.snr=1e-80"],
        ["synthetic_regression's training targets are not all finite (inf or nan)", "check data.heterogeneity and"],
    ),
    "infinite scale of the synthetic logistic weights": (
        ["data=synthetic_logistic", "model=logistic", "data.scale=inf"],
        ["data.scale must be a finite number >= 0 (got inf)"],
    ),
    "optimal sampling that samples nothing": (
        ["sampler=ocs", "clients_per_round=10"],
        ["sampler=ocs expects clients_per_round=10 uploaders out of a 10-client cohort", "lower clients_per_round"],
    ),
}


@pytest.fixture(scope="module")
def composer() -> Iterator[Composer]:
    """Compose ``train.yaml`` with overrides (one Hydra initialisation for the whole catalogue)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield lambda overrides: compose(config_name="train", overrides=[*QUIET, *overrides])


def _assert_one_sentence(text: str, fragments: list[str], *, full_stop: bool = True) -> None:
    assert "\n" not in text.strip(), text
    assert not full_stop or text.rstrip().endswith((".", "?")), text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


def test_the_catalogue_holds_at_least_40_cases() -> None:
    assert len(COMPOSE_CASES) + len(SCHEMA_CASES) + len(RUN_CASES) >= 40


@pytest.mark.parametrize(("overrides", "fragments"), COMPOSE_CASES.values(), ids=COMPOSE_CASES)
def test_config_that_does_not_compose_is_told_in_one_sentence(
    composer: Composer, overrides: list[str], fragments: list[str]
) -> None:
    with pytest.raises(HydraException) as info:
        composer(overrides)
    _assert_one_sentence(error_sentence(info.value), fragments)


@pytest.mark.parametrize("override", ["foo=1", "method.zzz=2", "data.qqq=1"])
def test_an_unknown_key_with_no_close_key_gets_no_suggestion(composer: Composer, override: str) -> None:
    with pytest.raises(HydraException) as info:
        composer([override])
    sentence = error_sentence(info.value)
    _assert_one_sentence(sentence, [f"{override.partition('=')[0]} is not a key of the config"])
    assert "did you mean" not in sentence


@pytest.mark.parametrize(("overrides", "fragments"), SCHEMA_CASES.values(), ids=SCHEMA_CASES)
def test_schema_refuses_before_compute(composer: Composer, overrides: list[str], fragments: list[str]) -> None:
    cfg = composer(overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    _assert_one_sentence(str(info.value), fragments)


def test_run_checks_the_schema_before_building_anything(composer: Composer, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^rounds \(the number of federated rounds\) must be an integer \(got 2\.5\)"
    ):
        run(composer(["rounds=2.5"]), tmp_path)
    assert not (tmp_path / "partition.json").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_a_gpu_accelerator_on_a_machine_without_one_is_refused_before_any_data_is_read(
    composer: Composer, tmp_path: Path, accelerator: str
) -> None:
    with pytest.raises(ConfigError) as info:
        run(composer(["rounds=1", f"trainer.accelerator={accelerator}"]), tmp_path)
    _assert_one_sentence(str(info.value), [f"trainer.accelerator={accelerator} needs a CUDA GPU", "accelerator=cpu"])
    assert not (tmp_path / "partition.json").exists() and not (tmp_path / "run.json").exists()


@pytest.mark.parametrize(("overrides", "fragments"), RUN_CASES.values(), ids=RUN_CASES)
def test_run_refuses_before_training(
    composer: Composer, tmp_path: Path, overrides: list[str], fragments: list[str]
) -> None:
    with pytest.raises(FedLightningError) as info:
        run(composer(["rounds=1", *overrides]), tmp_path)
    _assert_one_sentence(str(info.value), fragments, full_stop=False)  # constructors' own sentences
    assert not (tmp_path / "summary.json").exists()


def test_an_override_no_node_reads_is_refused_before_training(composer: Composer, tmp_path: Path) -> None:
    # sampler=full trains every client; clients_per_round=4 would have been dropped without a word.
    overrides = ["rounds=1", "clients_per_round=4"]
    with pytest.raises(
        ConfigError, match=r"^clients_per_round=4 would change nothing: .*\(the sampler is FullParticipation\)"
    ):
        run(composer(overrides), tmp_path, overrides=overrides)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "checkpoints").exists()
    partial = [*overrides, "sampler=uniform"]
    summary = run(composer(partial), tmp_path / "uniform", overrides=partial)
    assert summary["comm/uplink_messages"] == 4  # one round, 4 uploaders
    # Chosen on the command line (as in a sweep over sampler=full,uniform), full takes every client.
    full = [*overrides, "sampler=full"]
    assert run(composer(full), tmp_path / "full", overrides=full)["comm/uplink_messages"] == 10


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "fedlightning.cli", *QUIET, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["method=fedavgg"], ["method=fedavgg is not a config", "did you mean method=fedavg?"]),
        (["rounds=abc"], ["rounds (the number of federated rounds) must be an integer (got 'abc')", "e.g. rounds=50"]),
        (["rouns=3"], ["rouns is not a key of the config (did you mean rounds?)"]),
    ],
    ids=["composition", "schema", "misspelt key"],
)
def test_cli_exits_1_with_the_sentence_as_its_last_line(
    tmp_path: Path, overrides: list[str], fragments: list[str]
) -> None:
    result = _cli(*overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=REPO_ROOT)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fedlightning: error: "), result.stderr[-2000:]
    _assert_one_sentence(last, fragments)
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    assert "append to your config" not in result.stderr  # Hydra's +key advice is not repeated
    if (tmp_path / "run").exists():  # the job started (its config composed): its folder keeps the record
        assert (tmp_path / "run" / "error.txt").read_text().startswith(last.removeprefix("fedlightning: error: "))
        assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"


def test_loaded_features_that_are_not_finite_stop_setup_naming_the_data_set_and_its_files(tmp_path: Path) -> None:
    from fedlightning.datamodules import DigitsDataModule

    class InfiniteDigits(DigitsDataModule):
        name = "digits_with_an_inf"

        def _load(self) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
            (x, y), test = super()._load()
            x = x.float().clone()
            x.view(-1)[5] = float("inf")
            return (x, y), test

    with pytest.raises(ValueError) as info:
        InfiniteDigits(root=str(tmp_path)).setup("fit")
    _assert_one_sentence(
        str(info.value),
        ["digits_with_an_inf's training features are not all finite (inf or nan)", f"data.root={tmp_path}"],
    )


def test_a_loss_that_is_not_finite_before_any_step_is_blamed_on_the_data_not_the_learning_rate(
    composer: Composer, tmp_path: Path
) -> None:
    # Finite float32 features and targets around 1e20, whose squared error overflows float32.
    overrides = ["rounds=2", "data=synthetic_regression", "partition=iid", "model=mlp", "data.heterogeneity=1e20"]
    with pytest.raises(FedLightningError) as info:
        run(composer(overrides), tmp_path)
    sentence = str(info.value)
    _assert_one_sentence(
        sentence,
        ["the model's loss was non-finite before any step", "synthetic_regression's features or targets"],
    )
    assert "learning rate is not the cause" in sentence and "client_optimizer.lr" not in sentence
    assert not (tmp_path / "summary.json").exists()
