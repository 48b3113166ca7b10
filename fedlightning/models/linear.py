"""Linear models."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["BinaryLogisticRegression", "LogisticRegression"]


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: flatten, then one linear layer (logits out).

    Args:
        in_features: Flattened input size.
        num_classes: Output logits.
    """

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape ``(batch, num_classes)``."""
        return self.linear(self.flatten(x))


class BinaryLogisticRegression(nn.Module):
    """Binary logistic regression with one output s = w·x + b, so |θ| = features + 1.

    The forward pass returns the two logits (0, s): softmax over them gives
    P(y = 1 | x) = sigmoid(s), so the engine's cross-entropy on (0, s) is exactly the
    logistic (binary cross-entropy) loss on s, and arg-max accuracy is [s > 0].

    Args:
        in_features: Flattened input size.

    >>> import torch
    >>> model = BinaryLogisticRegression(in_features=3)
    >>> sum(p.numel() for p in model.parameters())
    4
    >>> tuple(model(torch.zeros(2, 3)).shape)
    (2, 2)
    """

    def __init__(self, *, in_features: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(in_features, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(0, s)`` of shape ``(batch, 2)``."""
        s = self.linear(self.flatten(x))
        return torch.cat([torch.zeros_like(s), s], dim=1)
