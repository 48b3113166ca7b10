"""Models: MLPs, small CNNs, logistic regression, and the builders the model configs name."""

from fedlightning.models.cnn import FemnistCNN, SmallCNN
from fedlightning.models.linear import LogisticRegression
from fedlightning.models.mlp import MLP
from fedlightning.models.presets import FIXED_INPUT, PRESETS, ModelInputs, build_model

__all__ = [
    "FIXED_INPUT",
    "MLP",
    "PRESETS",
    "FemnistCNN",
    "LogisticRegression",
    "ModelInputs",
    "SmallCNN",
    "build_model",
]
