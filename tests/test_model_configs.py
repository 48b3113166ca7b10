"""Model configs select a typed builder by ``_target_``, as every other group does, and keep their keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from fedlightning.errors import ConfigError
from fedlightning.models import presets
from fedlightning.models.presets import PRESETS, SEQUENCE_PRESETS, ModelInputs, build_model
from fedlightning.run import run

from .conftest import CONFIG_DIR

MODEL_CONFIGS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
FIXED_28 = ("small_mlp", "mnistfc")


def _inputs(name: str) -> ModelInputs:
    if name in SEQUENCE_PRESETS:
        return ModelInputs(shape=(80,), num_classes=90, token_inputs=True)
    if name == "logistic":
        return ModelInputs(shape=(1, 28, 28), num_classes=2)
    if name == "conv4" or name.startswith("fjord_") or name in FIXED_28:
        return ModelInputs(shape=(1, 28, 28), num_classes=10)
    return ModelInputs(shape=(1, 8, 8), num_classes=10)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_model_config_targets_the_builder_of_its_name_and_every_builder_has_a_config() -> None:
    assert sorted(PRESETS) == MODEL_CONFIGS
    for name in MODEL_CONFIGS:
        node = OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml")
        assert node._target_ == f"fedlightning.models.presets.{name}", name
        assert "name" not in node, name


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_a_model_config_instantiates_to_the_model_build_model_gives(make_config, name: str) -> None:
    cfg = make_config([f"model={name}"])
    inputs = _inputs(name)
    model = instantiate(cfg.model, _partial_=True)(inputs=inputs)
    same = build_model(name, input_shape=inputs.shape, num_classes=inputs.num_classes)
    assert type(model) is type(same) and _count(model) == _count(same)


def test_config_keys_reach_the_builder(make_config) -> None:
    cfg = make_config(["model=mlp", "model.hidden=[16,8]"])
    model = instantiate(cfg.model, _partial_=True)(inputs=ModelInputs(shape=(1, 8, 8), num_classes=10))
    assert [m.out_features for m in model.net if isinstance(m, nn.Linear)] == [16, 8, 10]
    cfg = make_config(["model=fjord_char_lstm", "model.hidden=32"])
    lstm = instantiate(cfg.model, _partial_=True)(inputs=_inputs("fjord_char_lstm"))
    assert lstm.lstm.hidden_size == 32 and lstm.head.out_features == 90


def test_the_thesis_configs_give_table_7_2s_full_networks(make_config) -> None:
    """fjord_char_lstm: 2 × LSTM(128) on an 8-d embedding; fjord_femnist_cnn: 20/36 channels, 62 classes."""
    rnn = instantiate(make_config(["model=fjord_char_lstm"]).model, _partial_=True)(inputs=_inputs("fjord_char_lstm"))
    assert (rnn.embedding.embedding_dim, rnn.lstm.hidden_size, rnn.lstm.num_layers) == (8, 128, 2)
    assert _count(rnn) == 90 * 8 + 4 * 128 * (8 + 128 + 2) + 4 * 128 * (128 + 128 + 2) + 128 * 90 + 90 == 215_082
    cnn = instantiate(make_config(["model=fjord_femnist_cnn"]).model, _partial_=True)(
        inputs=ModelInputs(shape=(1, 28, 28), num_classes=62)
    )
    assert [cnn.features[0].out_channels, cnn.features[3].out_channels, cnn.features[3].stride] == [20, 36, (2, 2)]
    assert _count(cnn) == 26_866


def test_builders_take_only_their_own_keys() -> None:
    inputs = ModelInputs(shape=(1, 28, 28), num_classes=10)
    with pytest.raises(TypeError, match="unexpected keyword argument 'hidden'"):
        presets.mnistfc(inputs=inputs, hidden=[5])  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"^model=mnistfc expects 784 input features but data=digits provides 64"):
        presets.mnistfc(inputs=ModelInputs(shape=(1, 8, 8), num_classes=10, data_name="digits"))


def test_the_schema_checks_model_keys_against_the_builder(make_config) -> None:
    from fedlightning.schema import validate_config

    with pytest.raises(ConfigError, match=r"^model has no key hiden \(did you mean hidden\?\); mlp takes hidden\.$"):
        validate_config(make_config(["model=mlp", "+model.hiden=[8]"]))
    with pytest.raises(ConfigError, match=r"^model\.inputs comes from the data"):
        validate_config(make_config(["model=mlp", "+model.inputs=1"]))


def test_a_run_labels_its_model_by_the_config_choice_and_without_choices_by_the_builder(
    make_config, tmp_path: Path
) -> None:
    overrides = ["model=mlp", "model.hidden=[8]", "rounds=1", "data.num_clients=3", "save_partition=false"]
    summary = run(make_config(overrides), tmp_path / "a", choices={"model": "mlp"})
    assert summary["model"] == "mlp"
    assert summary["config"]["model"] == {"_target_": "fedlightning.models.presets.mlp", "hidden": [8]}
    assert run(make_config(overrides), tmp_path / "b")["model"] == "mlp"
