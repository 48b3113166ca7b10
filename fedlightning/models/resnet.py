"""ResNet-18 for 32x32 images with GroupNorm and a width multiplier.

He et al. (2016, arXiv:1512.03385), CIFAR variant (3x3 stem, no max-pool). BatchNorm is
replaced by GroupNorm as in Hsieh et al. (2020, arXiv:1910.00189) and Reddi et al. (2021,
arXiv:2003.00295), so the model has no buffers and every state is a parameter that
federated averaging aggregates.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["BasicBlock", "ResNet18GN"]


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and an identity or 1x1 projection shortcut."""

    def __init__(self, *, in_channels: int, channels: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(channels, groups)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = _norm(channels, groups)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), _norm(channels, groups)
            )

    def forward(self, x: Tensor) -> Tensor:
        """``relu(F(x) + shortcut(x))``."""
        out = self.relu(self.norm1(self.conv1(x)))
        return self.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 (2-2-2-2 basic blocks) with GroupNorm; widths ``width * (1, 2, 4, 8)``.

    Args:
        input_shape: ``(channels, height, width)``.
        num_classes: Output logits.
        width: Channels of the first stage (64 is the standard ResNet-18, 11.2M parameters).
        groups: GroupNorm groups (2, as in Hsieh et al.).

    Example:
        >>> sum(p.numel() for p in ResNet18GN(input_shape=(3, 32, 32), num_classes=10).parameters())
        11173962
        >>> sum(p.numel() for p in ResNet18GN(input_shape=(3, 32, 32), num_classes=10, width=16).parameters())
        701466
    """

    def __init__(self, *, input_shape: Sequence[int], num_classes: int, width: int = 64, groups: int = 2) -> None:
        super().__init__()
        if len(input_shape) != 3 or width < 1 or groups < 1:
            raise ValueError(
                f"resnet18_gn needs (C, H, W) inputs, model.width >= 1 and model.groups >= 1 "
                f"(got {tuple(input_shape)}, {width}, {groups})."
            )
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], width, 3, padding=1, bias=False), _norm(width, groups), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        in_ch = width
        for stage, mult in enumerate((1, 2, 4, 8)):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(in_channels=in_ch, channels=width * mult, stride=stride, groups=groups))
                in_ch = width * mult
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(batch, num_classes)``."""
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))
