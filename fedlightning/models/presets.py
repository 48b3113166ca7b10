"""Model builders, one per ``configs/model/<name>.yaml`` (its ``_target_``), checked against the data.

Each builder is a typed, keyword-only function named like its config. It takes what the data
gives a model as one :class:`ModelInputs` (the input shape, the number of classes, the data's
name for messages, and whether the inputs are token ids), plus the config's own keys, and refuses
inputs of the wrong kind in one sentence that names the models that fit. ``run`` instantiates the
config node and calls it with the data's :class:`ModelInputs`; :func:`build_model` does the same
from a builder's name, without Hydra.

Example:
    >>> model = digits_mlp(inputs=ModelInputs(shape=(1, 8, 8), num_classes=10))
    >>> sum(p.numel() for p in model.parameters())
    4810
    >>> build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[32]).net[1].out_features
    32
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fedlightning.models.char_lstm import CharLSTM
from fedlightning.models.cnn import FemnistCNN, SmallCNN
from fedlightning.models.conv4 import Conv4
from fedlightning.models.linear import BinaryLogisticRegression, LogisticRegression
from fedlightning.models.mlp import MLP
from fedlightning.models.resnet import ResNet18GN

__all__ = [
    "FIXED_INPUT",
    "IMAGE_PRESETS",
    "PRESETS",
    "SEQUENCE_PRESETS",
    "ModelInputs",
    "build_model",
    "char_lstm",
    "cnn",
    "conv4",
    "digits_cnn",
    "digits_logreg",
    "digits_mlp",
    "fedavg_cnn",
    "fjord_char_lstm",
    "fjord_femnist_cnn",
    "logistic",
    "logreg",
    "mlp",
    "mnistfc",
    "resnet18_gn",
    "small_mlp",
]


@dataclass(frozen=True)
class ModelInputs:
    """What the data gives a model.

    Args:
        shape: Shape of one input, e.g. ``(1, 28, 28)`` or ``(80,)`` for a window of characters.
        num_classes: Output logits.
        data_name: The data set's name, used in messages (``data=digits``).
        token_inputs: Whether the inputs are windows of token ids (character ids), which only
            the :data:`SEQUENCE_PRESETS` embed, or features, which every other builder takes
            (``None``: not checked).
    """

    shape: tuple[int, ...]
    num_classes: int
    data_name: str | None = None
    token_inputs: bool | None = None

    @property
    def features(self) -> int:
        """Input features once flattened."""
        return math.prod(self.shape)

    @property
    def data(self) -> str:
        """``data=<name>`` for messages, or "the data"."""
        return f"data={self.data_name}" if self.data_name else "the data"


#: Builders whose input width is part of their definition.
FIXED_INPUT: dict[str, int] = {"small_mlp": 784, "mnistfc": 784, "digits_mlp": 64}

#: Builders for character sequences ``(length,)`` rather than images or features.
SEQUENCE_PRESETS: tuple[str, ...] = ("char_lstm", "fjord_char_lstm")

#: Convolutional builders: they take images ``(C, H, W)``, never flat feature vectors.
IMAGE_PRESETS: tuple[str, ...] = ("cnn", "digits_cnn", "fedavg_cnn", "fjord_femnist_cnn", "conv4", "resnet18_gn")


def _features(name: str, inputs: ModelInputs) -> None:
    """Refuse token ids for the feature model ``name``."""
    if inputs.token_inputs:
        raise ValueError(
            f"model={name} takes features but {inputs.data} gives windows of token ids (shape {inputs.shape}); "
            f"choose {' or '.join(f'model={p}' for p in SEQUENCE_PRESETS)}."
        )


def _image(name: str, inputs: ModelInputs) -> tuple[int, ...]:
    """Refuse token ids and flat features for the convolutional model ``name``; the image shape."""
    _features(name, inputs)
    if len(inputs.shape) != 3:
        flat = ["model=mlp", "model=logreg"] + (["model=logistic"] if inputs.num_classes == 2 else [])
        raise ValueError(
            f"model={name} is a convolutional network for images (C, H, W) but {inputs.data} gives "
            f"flat features (shape {inputs.shape}); choose {', '.join(flat[:-1])} or {flat[-1]}."
        )
    return inputs.shape


def _fixed(name: str, inputs: ModelInputs) -> int:
    """Refuse inputs whose width is not the fixed input width of ``name``; that width."""
    _features(name, inputs)
    expected = FIXED_INPUT[name]
    if expected != inputs.features:
        fits = [f"model={p}" for p, n in FIXED_INPUT.items() if n == inputs.features] + ["model=mlp"]
        raise ValueError(
            f"model={name} expects {expected} input features but {inputs.data} provides {inputs.features} "
            f"(shape {inputs.shape}); choose {' or '.join(fits)}."
        )
    return expected


def _tokens(name: str, inputs: ModelInputs) -> None:
    """Refuse features (or a shape other than ``(length,)``) for the sequence model ``name``."""
    if inputs.token_inputs is False:
        raise ValueError(
            f"model={name} embeds token ids but {inputs.data} gives features (shape {inputs.shape}); "
            "use data=shakespeare."
        )
    if len(inputs.shape) != 1:
        raise ValueError(f"model={name} expects windows of shape (length,) (got {inputs.shape}); use data=shakespeare.")


def mlp(*, inputs: ModelInputs, hidden: Sequence[int] = (200, 200)) -> MLP:
    """An MLP on any input with ``hidden`` widths (default: FedAvg's 2NN, arXiv 1602.05629)."""
    _features("mlp", inputs)
    return MLP(in_features=inputs.features, hidden=tuple(hidden), num_classes=inputs.num_classes)


def small_mlp(*, inputs: ModelInputs) -> MLP:
    """784-20-20-C."""
    return MLP(in_features=_fixed("small_mlp", inputs), hidden=(20, 20), num_classes=inputs.num_classes)


def mnistfc(*, inputs: ModelInputs) -> MLP:
    """LeCun et al. (1998)'s 784-300-100-10: 266,610 parameters."""
    return MLP(in_features=_fixed("mnistfc", inputs), hidden=(300, 100), num_classes=inputs.num_classes)


def digits_mlp(*, inputs: ModelInputs) -> MLP:
    """64-64-C for the 8×8 digits."""
    return MLP(in_features=_fixed("digits_mlp", inputs), hidden=(64,), num_classes=inputs.num_classes)


def cnn(*, inputs: ModelInputs) -> SmallCNN:
    """FedAvg's CNN (arXiv 1602.05629), fixed: 5×5 convolutions of 32 and 64 channels, 512 hidden units."""
    return SmallCNN(input_shape=_image("cnn", inputs), num_classes=inputs.num_classes)


def digits_cnn(*, inputs: ModelInputs) -> SmallCNN:
    """A 3×3 CNN of 16 and 32 channels and 64 hidden units."""
    shape = _image("digits_cnn", inputs)
    return SmallCNN(input_shape=shape, num_classes=inputs.num_classes, channels=(16, 32), kernel_size=3, hidden=64)


def fedavg_cnn(
    *, inputs: ModelInputs, channels: Sequence[int] = (32, 64), kernel_size: int = 5, hidden: int = 512
) -> SmallCNN:
    """FedAvg's CNN (arXiv 1602.05629) with its widths as options (:class:`SmallCNN`)."""
    shape = _image("fedavg_cnn", inputs)
    return SmallCNN(
        input_shape=shape,
        num_classes=inputs.num_classes,
        channels=tuple(channels),
        kernel_size=kernel_size,
        hidden=hidden,
    )


def fjord_femnist_cnn(
    *,
    inputs: ModelInputs,
    channels: Sequence[int] = (20, 36),
    kernel_size: int = 3,
    strides: Sequence[int] = (1, 2),
) -> FemnistCNN:
    """FjORD's FEMNIST CNN (arXiv 2207.00392, Table 7.2; arXiv 2102.13451): see :class:`FemnistCNN`."""
    shape = _image("fjord_femnist_cnn", inputs)
    return FemnistCNN(
        input_shape=shape,
        num_classes=inputs.num_classes,
        channels=tuple(channels),
        kernel_size=kernel_size,
        strides=tuple(strides),
    )


def conv4(
    *, inputs: ModelInputs, channels: Sequence[int] = (64, 128), hidden: Sequence[int] = (256, 256), bias: bool = True
) -> Conv4:
    """Conv-4 of the lottery-ticket and supermask papers (arXiv 1803.03635, arXiv 2209.15328)."""
    shape = _image("conv4", inputs)
    return Conv4(
        input_shape=shape, num_classes=inputs.num_classes, channels=tuple(channels), hidden=tuple(hidden), bias=bias
    )


def resnet18_gn(*, inputs: ModelInputs, width: int = 64, groups: int = 2) -> ResNet18GN:
    """ResNet-18 (CIFAR stem) with GroupNorm (arXiv 1910.00189)."""
    shape = _image("resnet18_gn", inputs)
    return ResNet18GN(input_shape=shape, num_classes=inputs.num_classes, width=width, groups=groups)


def char_lstm(*, inputs: ModelInputs, embed_dim: int = 8, hidden: int = 256, num_layers: int = 2) -> CharLSTM:
    """The FedAvg/LEAF Shakespeare LSTM (arXiv 1602.05629, arXiv 1812.01097): 2 × LSTM(256) on an 8-d embedding."""
    _tokens("char_lstm", inputs)
    return CharLSTM(vocab_size=inputs.num_classes, embed_dim=embed_dim, hidden=hidden, num_layers=num_layers)


def fjord_char_lstm(*, inputs: ModelInputs, embed_dim: int = 8, hidden: int = 128, num_layers: int = 2) -> CharLSTM:
    """FjORD's Shakespeare RNN (arXiv 2207.00392, §7.6.1 and Table 7.2): 2 × LSTM(128) on an 8-d embedding.

    The thesis gives "an embedding layer followed by two LSTM layers and a softmax layer"; the
    widths are those whose sub-models have Table 7.2's parameters (:class:`CharLSTM`).
    """
    _tokens("fjord_char_lstm", inputs)
    return CharLSTM(vocab_size=inputs.num_classes, embed_dim=embed_dim, hidden=hidden, num_layers=num_layers)


def logreg(*, inputs: ModelInputs) -> LogisticRegression:
    """Multinomial logistic regression: flatten + linear."""
    _features("logreg", inputs)
    return LogisticRegression(in_features=inputs.features, num_classes=inputs.num_classes)


def digits_logreg(*, inputs: ModelInputs) -> LogisticRegression:
    """:func:`logreg` under the digits experiments' name."""
    _features("digits_logreg", inputs)
    return LogisticRegression(in_features=inputs.features, num_classes=inputs.num_classes)


def logistic(*, inputs: ModelInputs) -> BinaryLogisticRegression:
    """One-output binary logistic regression (two logits, the first fixed at 0)."""
    _features("logistic", inputs)
    if inputs.num_classes != 2:
        k = inputs.num_classes
        target = "one regression output" if k == 1 else f"{k} classes"
        raise ValueError(f"model=logistic is the one-output binary model; the data has {target} (use model=logreg).")
    return BinaryLogisticRegression(in_features=inputs.features)


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "small_mlp": small_mlp,
    "mnistfc": mnistfc,
    "digits_mlp": digits_mlp,
    "mlp": mlp,
    "logistic": logistic,
    "cnn": cnn,
    "digits_cnn": digits_cnn,
    "logreg": logreg,
    "digits_logreg": digits_logreg,
    "fedavg_cnn": fedavg_cnn,
    "fjord_femnist_cnn": fjord_femnist_cnn,
    "conv4": conv4,
    "resnet18_gn": resnet18_gn,
    "char_lstm": char_lstm,
    "fjord_char_lstm": fjord_char_lstm,
}

#: Every builder's name (= its config's name under ``configs/model/``).
PRESETS: tuple[str, ...] = tuple(_BUILDERS)


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    data_name: str | None = None,
    token_inputs: bool | None = None,
    **options: Any,
) -> nn.Module:
    """The model of builder ``name`` for inputs of ``input_shape`` and ``num_classes`` classes.

    Args:
        name: A builder of this module (:data:`PRESETS`).
        input_shape: Shape of one input, e.g. ``(1, 28, 28)``.
        num_classes: Output logits.
        data_name: Data set name, used in error messages.
        token_inputs: See :class:`ModelInputs`.
        **options: The builder's own keys (``hidden=[32]`` for ``mlp``, ``width=32`` for ``resnet18_gn``).

    Raises:
        ValueError: For an unknown name, an option the builder does not take, or inputs it refuses.
    """
    if name not in _BUILDERS:
        raise ValueError(f"model={name} is unknown; choose one of {', '.join(PRESETS)}.")
    inputs = ModelInputs(
        shape=tuple(int(s) for s in input_shape),
        num_classes=int(num_classes),
        data_name=data_name,
        token_inputs=token_inputs,
    )
    builder = _BUILDERS[name]
    try:
        return builder(inputs=inputs, **options)
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc):
            raise
        if "hidden" in options and name in FIXED_INPUT:
            raise ValueError(
                f"model.hidden only applies to model=mlp (got model={name}); remove model.hidden."
            ) from None
        raise ValueError(f"model={name} got an unknown option ({exc}); remove it from the model config.") from None
