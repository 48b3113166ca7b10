"""Conv4: the four-convolution network of the lottery-ticket and supermask papers.

Frankle and Carbin (2019, arXiv:1803.03635) Conv-4; used by Zhou et al. (2019,
arXiv:1905.01067), Ramanujan et al. (2020, arXiv:1911.13299) and FedPM (Isik et al., 2023,
arXiv:2209.15328): conv64-conv64-pool-conv128-conv128-pool, then FC 256-256-classes, 3x3
"same" convolutions, ReLU, 2x2 max-pooling.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["Conv4"]


class Conv4(nn.Module):
    """Conv4 for ``(C, H, W)`` inputs with ``H, W`` divisible by 4.

    Args:
        input_shape: ``(channels, height, width)``.
        num_classes: Output logits.
        channels: The two block widths (64, 128).
        hidden: The two hidden FC widths (256, 256).
        bias: Biases in convolutions and linear layers (the supermask papers use none).

    Example:
        >>> sum(p.numel() for p in Conv4(input_shape=(3, 32, 32), num_classes=10).parameters())
        2425930
    """

    def __init__(
        self,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (64, 128),
        hidden: Sequence[int] = (256, 256),
        bias: bool = True,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3 or input_shape[1] % 4 or input_shape[2] % 4:
            raise ValueError(f"Conv4 needs (C, H, W) inputs with H and W divisible by 4 (got {tuple(input_shape)}).")
        c, h, w = input_shape
        c1, c2 = channels

        def conv(a: int, b: int) -> list[nn.Module]:
            return [nn.Conv2d(a, b, 3, padding=1, bias=bias), nn.ReLU()]

        self.features = nn.Sequential(
            *conv(c, c1), *conv(c1, c1), nn.MaxPool2d(2), *conv(c1, c2), *conv(c2, c2), nn.MaxPool2d(2)
        )
        h1, h2 = hidden
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * (h // 4) * (w // 4), h1, bias=bias),
            nn.ReLU(),
            nn.Linear(h1, h2, bias=bias),
            nn.ReLU(),
            nn.Linear(h2, num_classes, bias=bias),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(batch, num_classes)``."""
        return self.classifier(self.features(x))
