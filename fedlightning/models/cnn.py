"""Small convolutional networks."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    """Two ``conv -> ReLU -> 2×2 max-pool`` blocks, then a hidden FC layer and the logits.

    Convolutions are "same"-padded, so any input of at least 4×4 works (28×28 gives 7×7
    feature maps, 8×8 gives 2×2). With the defaults (5×5 kernels, 32 and 64 channels, 512
    hidden units) on 1×28×28 this is the CNN of FedAvg (McMahan et al., 2017,
    arXiv:1602.05629), 1,663,370 parameters.

    Args:
        input_shape: ``(channels, height, width)`` of one input.
        num_classes: Output logits.
        channels: Output channels of the two convolutions.
        kernel_size: Odd convolution kernel size.
        hidden: Width of the hidden fully connected layer.
    """

    def __init__(
        self,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        kernel_size: int = 5,
        hidden: int = 512,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3 or min(input_shape[1:]) < 4:
            raise ValueError(f"SmallCNN needs inputs of shape (C, H, W) with H, W >= 4 (got {tuple(input_shape)}).")
        if len(channels) != 2 or kernel_size % 2 == 0:
            raise ValueError(f"SmallCNN needs two channel counts and an odd kernel (got {channels}, {kernel_size}).")
        c, h, w = input_shape
        c1, c2 = channels
        pad = kernel_size // 2
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, kernel_size, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * (h // 2 // 2) * (w // 2 // 2), hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape ``(batch, num_classes)``."""
        return self.classifier(self.features(x))
