"""Linear models."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["LogisticRegression"]


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
