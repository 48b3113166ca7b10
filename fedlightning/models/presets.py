"""Named model presets, checked against the data's input shape.

Example:
    >>> model = build_model("digits_mlp", input_shape=(1, 8, 8), num_classes=10)
    >>> sum(p.numel() for p in model.parameters())
    4810
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from fedlightning.models.char_lstm import CharLSTM
from fedlightning.models.cnn import SmallCNN
from fedlightning.models.conv4 import Conv4
from fedlightning.models.linear import BinaryLogisticRegression, LogisticRegression
from fedlightning.models.mlp import MLP
from fedlightning.models.resnet import ResNet18GN

__all__ = ["FIXED_INPUT", "IMAGE_PRESETS", "PRESETS", "SEQUENCE_PRESETS", "build_model"]

#: Presets whose input width is part of their definition.
FIXED_INPUT: dict[str, int] = {"small_mlp": 784, "mnistfc": 784, "digits_mlp": 64}

_MLP_HIDDEN: dict[str, tuple[int, ...]] = {
    "small_mlp": (20, 20),
    "mnistfc": (300, 100),  # LeCun et al. (1998) 300-100, 266,610 parameters
    "digits_mlp": (64,),
}


def _cnn(shape: tuple[int, ...], k: int) -> nn.Module:
    return SmallCNN(input_shape=shape, num_classes=k)  # FedAvg CNN, arXiv:1602.05629


def _digits_cnn(shape: tuple[int, ...], k: int) -> nn.Module:
    return SmallCNN(input_shape=shape, num_classes=k, channels=(16, 32), kernel_size=3, hidden=64)


def _logreg(shape: tuple[int, ...], k: int) -> nn.Module:
    return LogisticRegression(in_features=math.prod(shape), num_classes=k)


def _logistic(shape: tuple[int, ...], k: int) -> nn.Module:
    if k != 2:
        target = "one regression output" if k == 1 else f"{k} classes"
        raise ValueError(f"model=logistic is the one-output binary model; the data has {target} (use model=logreg).")
    return BinaryLogisticRegression(in_features=math.prod(shape))


_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "logistic": _logistic,
    "cnn": _cnn,
    "digits_cnn": _digits_cnn,
    "logreg": _logreg,
    "digits_logreg": _logreg,
}


def _char_lstm(shape: tuple[int, ...], k: int, **options: Any) -> nn.Module:
    if len(shape) != 1:
        raise ValueError(f"model=char_lstm expects windows of shape (length,) (got {shape}); use data=shakespeare.")
    return CharLSTM(vocab_size=k, **options)  # FedAvg/LEAF Shakespeare LSTM, arXiv:1602.05629


#: Presets that take extra keyword options (``model.width=...``), checked by their class.
_OPTION_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "fedavg_cnn": lambda shape, k, **o: SmallCNN(input_shape=shape, num_classes=k, **o),  # arXiv:1602.05629
    "conv4": lambda shape, k, **o: Conv4(input_shape=shape, num_classes=k, **o),  # arXiv:1803.03635
    "resnet18_gn": lambda shape, k, **o: ResNet18GN(input_shape=shape, num_classes=k, **o),  # arXiv:1910.00189
    "char_lstm": _char_lstm,
}

#: Presets for character sequences ``(length,)`` rather than images (not image-adaptive).
SEQUENCE_PRESETS: tuple[str, ...] = ("char_lstm",)

#: Convolutional presets: they take images ``(C, H, W)``, never flat feature vectors.
IMAGE_PRESETS: tuple[str, ...] = ("cnn", "digits_cnn", "fedavg_cnn", "conv4", "resnet18_gn")

#: Every accepted preset name.
PRESETS: tuple[str, ...] = (*_MLP_HIDDEN, "mlp", *_BUILDERS, *_OPTION_BUILDERS)


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] | None = None,
    data_name: str | None = None,
    token_inputs: bool | None = None,
    **options: Any,
) -> nn.Module:
    """Build a preset model for inputs of ``input_shape`` and ``num_classes`` classes.

    Presets: ``small_mlp`` (784-20-20-C), ``mnistfc`` (784-300-100-C), ``digits_mlp``
    (64-64-C), ``mlp`` (any input, ``hidden`` widths, default the FedAvg 2NN's 200-200),
    ``cnn`` (FedAvg's CNN), ``digits_cnn`` (a 3×3, 16/32-channel CNN), ``logreg`` and
    ``digits_logreg`` (flatten + linear), ``logistic`` (one-output binary logistic
    regression). The CNNs and linear models adapt to the input.
    ``fedavg_cnn`` (FedAvg's CNN; options ``channels``, ``kernel_size``, ``hidden``),
    ``conv4`` (Conv-4; ``channels``, ``hidden``, ``bias``), ``resnet18_gn`` (ResNet-18 with
    GroupNorm; ``width``, ``groups``) and ``char_lstm`` (the Shakespeare LSTM; ``embed_dim``,
    ``hidden``, ``num_layers``) take those keyword ``options``.

    Args:
        name: Preset name (``model=...``).
        input_shape: Shape of one input, e.g. ``(1, 28, 28)``.
        num_classes: Output logits.
        hidden: Hidden widths, only for ``mlp``.
        data_name: Data set name, used in error messages.
        token_inputs: Whether the inputs are windows of token ids (character ids), which only
            the presets of :data:`SEQUENCE_PRESETS` embed, or features, which every other preset
            takes; a preset that does not fit is refused (``None``: not checked).
        **options: Keyword options of the presets that take them (``model.width=32``).

    Returns:
        The freshly initialised module.

    Raises:
        ValueError: For an unknown name, ``hidden`` given to a fixed preset, a preset
            whose fixed input width does not match ``input_shape``, a convolutional preset
            on flat features, or a preset for the other kind of input (``token_inputs``).
    """
    shape = tuple(int(s) for s in input_shape)
    features = math.prod(shape)
    if name not in PRESETS:
        raise ValueError(f"model={name} is unknown; choose one of {', '.join(PRESETS)}.")
    data = f"data={data_name}" if data_name else "the data"
    if token_inputs is not None and token_inputs != (name in SEQUENCE_PRESETS):
        if token_inputs:
            raise ValueError(
                f"model={name} takes features but {data} gives windows of token ids (shape {shape}); "
                f"choose {' or '.join(f'model={p}' for p in SEQUENCE_PRESETS)}."
            )
        raise ValueError(
            f"model={name} embeds token ids but {data} gives features (shape {shape}); use data=shakespeare."
        )
    if name in IMAGE_PRESETS and len(shape) != 3:
        flat = ["model=mlp", "model=logreg"] + (["model=logistic"] if num_classes == 2 else [])
        raise ValueError(
            f"model={name} is a convolutional network for images (C, H, W) but {data} gives "
            f"flat features (shape {shape}); choose {', '.join(flat[:-1])} or {flat[-1]}."
        )
    if name in _OPTION_BUILDERS:
        if hidden is not None:
            options["hidden"] = hidden
        try:
            return _OPTION_BUILDERS[name](shape, num_classes, **options)
        except TypeError as exc:
            raise ValueError(f"model={name} got an unknown option ({exc}); remove it from the model config.") from None
    if options:
        raise ValueError(f"model={name} takes no options {sorted(options)}; remove them from the model config.")
    if hidden is not None and name != "mlp":
        raise ValueError(f"model.hidden only applies to model=mlp (got model={name}); remove model.hidden.")
    expected = FIXED_INPUT.get(name)
    if expected is not None and expected != features:
        fits = [f"model={p}" for p, n in FIXED_INPUT.items() if n == features] + ["model=mlp"]
        raise ValueError(
            f"model={name} expects {expected} input features but {data} provides {features} "
            f"(shape {shape}); choose {' or '.join(fits)}."
        )
    if name in _MLP_HIDDEN:
        return MLP(in_features=features, hidden=_MLP_HIDDEN[name], num_classes=num_classes)
    if name == "mlp":
        return MLP(
            in_features=features,
            hidden=tuple(hidden) if hidden is not None else (200, 200),
            num_classes=num_classes,
        )
    return _BUILDERS[name](shape, num_classes)
