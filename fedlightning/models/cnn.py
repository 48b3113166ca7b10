"""Small convolutional networks: FedAvg's CNN and FjORD's FEMNIST CNN."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

__all__ = ["FemnistCNN", "SmallCNN"]


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


def _conv_out(size: int, kernel_size: int, stride: int) -> int:
    """Output size of a "same"-padded (``kernel_size // 2``) convolution with ``stride``."""
    return (size + 2 * (kernel_size // 2) - kernel_size) // stride + 1


class FemnistCNN(nn.Module):
    """FjORD's FEMNIST CNN: two ``conv -> ReLU -> 2×2 max-pool`` blocks and a softmax (linear) layer.

    Horváth's thesis (arXiv 2207.00392, §7.6.1; FjORD, arXiv 2102.13451) describes it only as "a CNN
    with two convolutional layers followed by a softmax layer" and gives, in Table 7.2, the
    parameters and MACs of its ordered-dropout sub-models F_p at p = 0.2, …, 1.0. The shape here is
    recovered from those ten numbers: among two-convolution networks on 1×28×28 with 62 classes
    (kernels 3/5/7, strides 1/2, "same" or "valid" padding, pooling 1/2/3, up to 64 channels each,
    ⌈p·K⌉ channels at width p), this is one of the few whose sub-models come within 5 % of every
    entry of both rows:

    * conv 3×3, 20 channels, stride 1 (28×28), ReLU, max-pool (14×14);
    * conv 3×3, 36 channels, stride 2 (7×7), ReLU, max-pool (3×3);
    * linear 36·3·3 = 324 → 62 (the logits; the softmax is in the loss).

    On 1×28×28 with 62 classes: 26,866 parameters and 478,728 MACs (convolutions and the linear
    layer; :func:`fedlightning.models.ordered_dropout.sub_model_macs`). How close its sub-models come to
    Table 7.2: ``benchmarks/results/fjord.md``.

    Args:
        input_shape: ``(channels, height, width)`` of one input.
        num_classes: Output logits.
        channels: Output channels of the two convolutions.
        kernel_size: Odd kernel size of both convolutions ("same" padding).
        strides: Strides of the two convolutions.

    Example:
        >>> import torch
        >>> m = FemnistCNN(input_shape=(1, 28, 28), num_classes=62)
        >>> sum(p.numel() for p in m.parameters())
        26866
        >>> m(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 62])
    """

    def __init__(
        self,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (20, 36),
        kernel_size: int = 3,
        strides: Sequence[int] = (1, 2),
    ) -> None:
        super().__init__()
        if len(input_shape) != 3 or len(channels) != 2 or len(strides) != 2 or kernel_size % 2 == 0:
            raise ValueError(
                "FemnistCNN needs (C, H, W) inputs, two channel counts, two strides and an odd kernel "
                f"(got {tuple(input_shape)}, {tuple(channels)}, {tuple(strides)}, {kernel_size})."
            )
        c, h, w = input_shape
        c1, c2 = channels
        s1, s2 = strides
        sizes = [_conv_out(_conv_out(n, kernel_size, s1) // 2, kernel_size, s2) // 2 for n in (h, w)]
        if min(sizes) < 1:
            raise ValueError(f"FemnistCNN's feature maps vanish on inputs of shape {tuple(input_shape)}.")
        pad = kernel_size // 2
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, kernel_size, stride=s1, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size, stride=s2, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * sizes[0] * sizes[1], num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape ``(batch, num_classes)``."""
        return self.classifier(self.features(x))
