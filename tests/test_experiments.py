"""Every experiment config composes, and the quick variants not smoke-tested elsewhere run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedlightning.run import run
from fedlightning.schema import validate_config

from .conftest import CONFIG_DIR

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_config_composes(make_config: Callable[..., DictConfig], name: str) -> None:
    cfg = make_config([f"+experiment={name}"])
    assert cfg.rounds >= 1 and "_target_" in cfg.method and "_target_" in cfg.data
    validate_config(cfg)  # its keys and types pass the schema checked before every run


@pytest.mark.parametrize(
    ("name", "shrink", "min_acc"),
    [
        ("compression_mnist_quick", ["rounds=1", "eval_every=1", "data.max_train_samples=3000"], 0.2),
        ("compression_mnist_bidir_quick", ["rounds=1", "eval_every=1", "data.max_train_samples=3000"], 0.2),
        ("compression_emnist_quick", ["rounds=1", "eval_every=1", "data.test_from=train"], 0.04),  # 47 classes
        ("compression_cifar10_quick", ["rounds=1", "eval_every=1", "data.cache_dir=''"], 0.1),
        # DIANA's default step is the thesis' 1/(L(1 + 36(omega+1)/n)) (Theorem 3.5.4), a fifth of 1/L here
        ("diana_digits_quick", ["rounds=25", "eval_every=25"], 0.3),
        ("diana_synthetic_quick", ["rounds=3", "eval_every=3"], 0.2),
        ("diana_golub_quick", ["rounds=3", "eval_every=3"], 0.2),
        ("fedshuffle_heterogeneous_quick", ["rounds=2", "eval_every=2"], 0.2),
    ],
)
def test_quick_experiment_smoke(
    make_config: Callable[..., DictConfig],
    shared_data_root: Path,
    tmp_path: Path,
    name: str,
    shrink: list[str],
    min_acc: float,
) -> None:
    summary = run(make_config([f"+experiment={name}", f"data.root={shared_data_root}", *shrink]), tmp_path)
    assert summary["comm/uplink_bits_total"] > 0
    # Above chance: 1/47 for EMNIST balanced, 1/10 for the others.
    assert summary["test/acc"] is not None and summary["test/acc"] > min_acc
