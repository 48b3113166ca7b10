"""The config schema: every shipped config passes it, and its type and key rules hold."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedlightning.errors import ConfigError
from fedlightning.schema import GROUPS, _locate, check_target_node, close_match, validate_config

from .conftest import CONFIG_DIR

OPTION_GROUPS = (*GROUPS, "model", "logger")
OPTIONS = {group: sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")) for group in OPTION_GROUPS}


def test_every_group_option_composes_and_passes_the_schema() -> None:
    # validate_config checks each group node on its own, so one composition can carry one
    # option of every group: max(len(options)) compositions cover every option of every group.
    width = max(len(options) for options in OPTIONS.values())
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for i in range(width):
            overrides = [f"{group}={options[i % len(options)]}" for group, options in OPTIONS.items()]
            validate_config(compose(config_name="train", overrides=overrides))
    assert sum(len(options) for options in OPTIONS.values()) > 80  # all of configs/<group>/ were found


def test_schema_takes_ints_for_floats_but_not_bools_or_floats_for_ints() -> None:
    node = OmegaConf.create(
        {"_target_": "fedlightning.datamodules.DigitsDataModule", "val_fraction": 0, "num_clients": 4}
    )
    check_target_node(node, "data")  # an int where a float is annotated is a number
    node.num_clients = True
    with pytest.raises(
        ConfigError, match=r"^data\.num_clients must be an integer \(got true\); its default is data\.num_clients=10\.$"
    ):
        check_target_node(node, "data")
    node.num_clients = 4.0
    with pytest.raises(ConfigError, match=r"data\.num_clients must be an integer \(got 4\.0\)"):
        check_target_node(node, "data")


def _literal_target(*, mode: Literal["a", "b"] = "a", size: int | None = None) -> None:
    """A target with a Literal and an Optional annotation."""


def test_literal_and_optional_annotations() -> None:
    target = f"{__name__}._literal_target"
    check_target_node(OmegaConf.create({"_target_": target, "mode": "b", "size": None}), "x")
    with pytest.raises(ConfigError, match=r"^x\.mode must be one of 'a', 'b' \(got 'c'\); its default is x\.mode=a\.$"):
        check_target_node(OmegaConf.create({"_target_": target, "mode": "c"}), "x")
    with pytest.raises(ConfigError, match=r"^x\.size must be an integer or null \(got 'big'\)\.$"):
        check_target_node(OmegaConf.create({"_target_": target, "size": "big"}), "x")


def test_keys_forwarded_through_kwargs_to_the_base_class_are_valid() -> None:
    # DIANA(**kwargs) passes batch_size to FederatedModule; a misspelling is still caught.
    node = OmegaConf.create({"_target_": "fedlightning.methods.diana.DIANA", "batch_size": 8, "alpha": "auto"})
    check_target_node(node, "method")
    node.batchsize = 8
    with pytest.raises(ConfigError, match=r"method has no key batchsize \(did you mean batch_size\?\)"):
        check_target_node(node, "method")


def test_close_match() -> None:
    assert close_match("rouds", ["rounds", "seed"]) == "rounds"
    assert close_match("zzz", ["rounds", "seed"]) is None


def test_a_target_whose_module_fails_to_import_names_the_missing_module_not_the_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_method_pkg.py").write_text("import no_such_dependency_xyz\n\nclass Method: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        _locate("broken_method_pkg.Method", "method")
    assert str(info.value) == (
        "method._target_=broken_method_pkg.Method: importing broken_method_pkg failed "
        "(No module named 'no_such_dependency_xyz'); install what it needs, "
        "or reinstall fedlightning if the missing module is its own."
    )


@pytest.mark.parametrize("path", ["fedlightning.methds.FedAvg", "fedlightning.methods.FedAvgg", "torchh.nn.Linear"])
def test_a_misspelt_target_is_blamed_on_its_spelling(path: str) -> None:
    with pytest.raises(ConfigError, match=r"cannot be imported; check its spelling\.$"):
        _locate(path, "method")


def test_a_target_whose_module_raises_an_import_error_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "half_installed_pkg.py").write_text("from json import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"^model._target_=half_installed_pkg.Net: importing half_installed_pkg failed"
    ):
        _locate("half_installed_pkg.Net", "model")
