"""Named model presets, checked against the data's input shape.

Example:
    >>> model = build_model("digits_mlp", input_shape=(1, 8, 8), num_classes=10)
    >>> sum(p.numel() for p in model.parameters())
    4810
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import nn

from fedlightning.models.cnn import SmallCNN
from fedlightning.models.linear import LogisticRegression
from fedlightning.models.mlp import MLP

__all__ = ["FIXED_INPUT", "PRESETS", "build_model"]

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


_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "cnn": _cnn,
    "digits_cnn": _digits_cnn,
    "logreg": _logreg,
    "digits_logreg": _logreg,
}

#: Every accepted preset name.
PRESETS: tuple[str, ...] = (*_MLP_HIDDEN, "mlp", *_BUILDERS)


def build_model(
    name: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] | None = None,
    data_name: str | None = None,
) -> nn.Module:
    """Build a preset model for inputs of ``input_shape`` and ``num_classes`` classes.

    Presets: ``small_mlp`` (784-20-20-C), ``mnistfc`` (784-300-100-C), ``digits_mlp``
    (64-64-C), ``mlp`` (any input, ``hidden`` widths, default the FedAvg 2NN's 200-200),
    ``cnn`` (FedAvg's CNN), ``digits_cnn`` (a 3×3, 16/32-channel CNN), ``logreg`` and
    ``digits_logreg`` (flatten + linear). The CNNs and linear models adapt to the input.

    Args:
        name: Preset name (``model=...``).
        input_shape: Shape of one input, e.g. ``(1, 28, 28)``.
        num_classes: Output logits.
        hidden: Hidden widths, only for ``mlp``.
        data_name: Data set name, used in error messages.

    Returns:
        The freshly initialised module.

    Raises:
        ValueError: For an unknown name, ``hidden`` given to a fixed preset, or a preset
            whose fixed input width does not match ``input_shape``.
    """
    shape = tuple(int(s) for s in input_shape)
    features = math.prod(shape)
    if name not in PRESETS:
        raise ValueError(f"model={name} is unknown; choose one of {', '.join(PRESETS)}.")
    if hidden is not None and name != "mlp":
        raise ValueError(f"model.hidden only applies to model=mlp (got model={name}); remove model.hidden.")
    expected = FIXED_INPUT.get(name)
    if expected is not None and expected != features:
        data = f"data={data_name}" if data_name else "the data"
        fits = [f"model={p}" for p, n in FIXED_INPUT.items() if n == features] + ["model=mlp"]
        raise ValueError(
            f"model={name} expects {expected} input features but {data} provides {features} "
            f"(shape {shape}); choose {' or '.join(fits)}"
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
