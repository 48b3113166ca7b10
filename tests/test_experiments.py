"""Every experiment config composes, and the quick variants not smoke-tested elsewhere run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedlightning.run import run

from .conftest import CONFIG_DIR

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_config_composes(make_config: Callable[..., DictConfig], name: str) -> None:
    cfg = make_config([f"+experiment={name}"])
    assert cfg.rounds >= 1 and "_target_" in cfg.method and "_target_" in cfg.data


@pytest.mark.parametrize(
    ("name", "shrink"),
    [
        ("compression_mnist_quick", ["rounds=1", "eval_every=1", "data.max_train_samples=3000"]),
        ("compression_mnist_bidir_quick", ["rounds=1", "eval_every=1", "data.max_train_samples=3000"]),
        ("diana_digits_quick", ["rounds=3", "eval_every=3"]),
        ("diana_synthetic_quick", ["rounds=3", "eval_every=3"]),
        ("diana_golub_quick", ["rounds=3", "eval_every=3"]),
    ],
)
def test_quick_experiment_smoke(
    make_config: Callable[..., DictConfig], shared_data_root: Path, tmp_path: Path, name: str, shrink: list[str]
) -> None:
    summary = run(make_config([f"+experiment={name}", f"data.root={shared_data_root}", *shrink]), tmp_path)
    assert summary["comm/uplink_bits_total"] > 0
    assert summary["test/acc"] is not None and summary["test/acc"] > 0.1
