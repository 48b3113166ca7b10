"""Model presets: parameter counts, output shapes, shape-mismatch errors."""

from __future__ import annotations

import pytest
import torch

from fedlightning.models import MLP, PRESETS, LogisticRegression, SmallCNN, build_model
from fedlightning.models.presets import IMAGE_PRESETS, SEQUENCE_PRESETS


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_mnistfc_has_266610_parameters() -> None:
    assert n_params(build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)) == 266_610


def test_small_mlp_parameters() -> None:
    expected = 784 * 20 + 20 + 20 * 20 + 20 + 20 * 10 + 10
    assert expected == 16_330
    assert n_params(build_model("small_mlp", input_shape=(1, 28, 28), num_classes=10)) == expected


def test_cnn_is_fedavg_cnn() -> None:
    assert n_params(build_model("cnn", input_shape=(1, 28, 28), num_classes=10)) == 1_663_370


@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8)])
@pytest.mark.parametrize(
    "name", [p for p in PRESETS if p not in ("small_mlp", "mnistfc", "digits_mlp", "logistic", *SEQUENCE_PRESETS)]
)
def test_adaptive_presets_forward(name: str, shape: tuple[int, ...]) -> None:
    out = build_model(name, input_shape=shape, num_classes=7)(torch.zeros(3, *shape))
    assert out.shape == (3, 7)


@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8)])
def test_logistic_preset_gives_two_logits_and_refuses_more_than_two_classes(shape: tuple[int, ...]) -> None:
    assert build_model("logistic", input_shape=shape, num_classes=2)(torch.zeros(3, *shape)).shape == (3, 2)
    with pytest.raises(ValueError, match="one-output binary model; the data has 7 classes"):
        build_model("logistic", input_shape=shape, num_classes=7)


@pytest.mark.parametrize("name", IMAGE_PRESETS)
def test_convolutional_presets_refuse_flat_features_naming_the_flat_models(name: str) -> None:
    with pytest.raises(ValueError) as err:
        build_model(name, input_shape=(3571,), num_classes=2, data_name="golub")
    assert str(err.value) == (
        f"model={name} is a convolutional network for images (C, H, W) but data=golub gives flat features "
        "(shape (3571,)); choose model=mlp, model=logreg or model=logistic."
    )
    with pytest.raises(ValueError, match=r"\(shape \(500,\)\); choose model=mlp or model=logreg\.$"):
        build_model(name, input_shape=(500,), num_classes=1, data_name="synthetic_regression")


def test_logistic_preset_on_a_regression_target_says_so() -> None:
    with pytest.raises(ValueError, match=r"the data has one regression output \(use model=logreg\)"):
        build_model("logistic", input_shape=(500,), num_classes=1)


def test_shape_mismatch_message() -> None:
    msg = (
        "model=mnistfc expects 784 input features but data=digits provides 64 (shape (1, 8, 8)); "
        "choose model=digits_mlp or model=mlp."
    )
    with pytest.raises(ValueError) as err:
        build_model("mnistfc", input_shape=(1, 8, 8), num_classes=10, data_name="digits")
    assert str(err.value) == msg


def test_unknown_and_misused_options() -> None:
    with pytest.raises(ValueError, match=r"model=resnet is unknown"):
        build_model("resnet", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match=r"model\.hidden only applies to model=mlp"):
        build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10, hidden=[5])


def test_building_blocks() -> None:
    mlp = MLP(in_features=64, hidden=[32, 16], num_classes=10)
    assert [type(m).__name__ for m in mlp.net] == [
        "Flatten",
        "Linear",
        "ReLU",
        "Linear",
        "ReLU",
        "Linear",
    ]
    assert n_params(build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[32, 16])) == n_params(mlp)
    assert n_params(LogisticRegression(in_features=64, num_classes=10)) == 650
    assert SmallCNN(input_shape=(1, 8, 8), num_classes=10)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
