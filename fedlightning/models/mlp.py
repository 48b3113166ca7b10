"""Fully connected networks."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from torch import Tensor, nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """Flatten, then linear layers with ReLU between them.

    Args:
        in_features: Flattened input size.
        hidden: Widths of the hidden layers (may be empty: logistic regression).
        num_classes: Output logits.

    Example:
        >>> sum(p.numel() for p in MLP(in_features=784, hidden=[300, 100], num_classes=10).parameters())
        266610
    """

    def __init__(self, *, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        widths = [in_features, *hidden, num_classes]
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(pairwise(widths)):
            if i:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(a, b))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape ``(batch, num_classes)``."""
        return self.net(x)
