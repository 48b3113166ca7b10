"""Shared pytest fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

REPO_ROOT = Path(__file__).resolve().parents[1]

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    """The offline copy of the real data sets (``$FEDLIGHTNING_TEST_DATA``, default ``../shared/data``).

    Skips the test when the folder is absent.
    """
    root = Path(os.environ.get("FEDLIGHTNING_TEST_DATA", REPO_ROOT.parent / "shared" / "data")).resolve()
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root}; set FEDLIGHTNING_TEST_DATA to the folder holding MNIST/raw")
    return root


os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
# The package's caches (the pre-flight's target index) go to a folder of this test process, not the user's.
os.environ["FEDLIGHTNING_CACHE"] = tempfile.mkdtemp(prefix="fedlightning-test-cache-")
atexit.register(shutil.rmtree, os.environ["FEDLIGHTNING_CACHE"], ignore_errors=True)

CONFIG_DIR = REPO_ROOT / "configs"
QUIET = ["logger=none", "trainer.enable_progress_bar=false", "checkpoint_every=0"]


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The real ``configs/train.yaml`` composed with ``overrides`` (quiet by default)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[*QUIET, *overrides])


@pytest.fixture
def make_config() -> Callable[..., DictConfig]:
    """Compose the real config from overrides: ``make_config(["rounds=2"])``."""
    return compose_config


def digits_federation(num_clients: int) -> Any:
    """The bundled digits split IID over ``num_clients`` clients, set up (seed 0)."""
    from fedlightning.datamodules import DigitsDataModule, IIDPartition

    dm = DigitsDataModule(num_clients=num_clients, partition=IIDPartition(), seed=0)
    dm.setup("fit")
    return dm


def round_trainer(rounds: int, callbacks: list[object], **kwargs: object) -> L.Trainer:
    """A quiet Lightning trainer for ``rounds`` federated rounds, evaluating once at the end."""
    options: dict[str, object] = {
        "max_steps": rounds,
        "val_check_interval": rounds,
        "check_val_every_n_epoch": None,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": callbacks,
    }
    options.update(kwargs)
    return L.Trainer(**options)  # type: ignore[arg-type]


Call = tuple[tuple[Any, ...], dict[str, Any]]


def record_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[Call]:
    """Replace ``owner.name`` by a wrapper that records each call's (args, kwargs), then delegates."""
    calls: list[Call] = []
    original = getattr(owner, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return calls
