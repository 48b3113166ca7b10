"""Character LSTM of the FedAvg and LEAF Shakespeare baselines.

McMahan et al. (2017, arXiv:1602.05629) and LEAF (Caldas et al., 2018, arXiv:1812.01097):
an 8-dimensional character embedding, two LSTM layers of 256 units, and a linear layer to
the vocabulary that predicts the character after the window.
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["CharLSTM"]


class CharLSTM(nn.Module):
    """Embedding ``vocab_size x embed_dim`` -> ``num_layers`` x LSTM(``hidden``) -> linear to ``vocab_size``.

    Args:
        vocab_size: Number of character ids (90 for TFF's vocabulary, 80 for LEAF's).
        embed_dim: Embedding width (8 in FedAvg/LEAF).
        hidden: LSTM units per layer (256).
        num_layers: Stacked LSTM layers (2).

    Example:
        >>> import torch
        >>> m = CharLSTM(vocab_size=90)
        >>> sum(p.numel() for p in m.parameters())
        822570
        >>> m(torch.zeros(3, 80, dtype=torch.uint8)).shape
        torch.Size([3, 90])
    """

    def __init__(self, *, vocab_size: int, embed_dim: int = 8, hidden: int = 256, num_layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(batch, vocab_size)`` of the next character after each window ``(batch, length)``.

        Any integer dtype is accepted (the Shakespeare data module stores ``uint8`` ids).
        """
        out, _ = self.lstm(self.embedding(x.long()))
        return self.head(out[:, -1])
