"""Models: MLPs, small CNNs, logistic regression, and named presets."""

from fedlightning.models.cnn import SmallCNN
from fedlightning.models.linear import LogisticRegression
from fedlightning.models.mlp import MLP
from fedlightning.models.presets import FIXED_INPUT, PRESETS, build_model

__all__ = [
    "FIXED_INPUT",
    "MLP",
    "PRESETS",
    "LogisticRegression",
    "SmallCNN",
    "build_model",
]
