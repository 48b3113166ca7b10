"""Entropy coding of Bernoulli masks and the lossless codec for averaged bits.

Used by Zampling (arXiv 2503.14246) and FedPM (Isik et al., arXiv 2209.15328), whose
clients upload a binary mask z. Both sides know a probability vector p (the broadcast), so
the mask is range-coded with Bernoulli(p_j) as the model of coordinate j using the
``constriction`` library (Bamler, arXiv 2201.01741). The expected length is the cross
entropy Σ_j −log2 P_{p_j}(z_j) plus at most a few 32-bit words of coder state.

After the server averages K bits, every coordinate of p lies in {0, 1/K, …, 1}, so
:class:`LatticeCodec` sends p losslessly with ⌈log2(K+1)⌉ bits per coordinate (and K in a
32-bit header) instead of 32.

Example:
    >>> import torch
    >>> p = torch.tensor([0.9, 0.1, 0.5, 0.5])
    >>> codec = BernoulliRangeCodec(model_p=p)
    >>> z = torch.tensor([1.0, 0.0, 1.0, 0.0])
    >>> torch.equal(codec.encode(z).decode(), z)
    True
    >>> msg = LatticeCodec(levels=10).encode(torch.tensor([0.0, 0.3, 1.0]))
    >>> msg.num_bits, msg.decode().tolist() == [0.0, 0.30000001192092896, 1.0]
    (44, True)
"""

from __future__ import annotations

import math

import constriction
import numpy as np
import torch
from torch import Tensor

from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Message

__all__ = ["BernoulliRangeCodec", "LatticeCodec", "bernoulli_cross_entropy_bits", "lattice_bits_per_coordinate"]


def bernoulli_cross_entropy_bits(z: Tensor, p: Tensor) -> float:
    """Σ_j −log2 P(z_j | p_j): the ideal code length of mask z under Bernoulli(p) (bits).

    >>> bernoulli_cross_entropy_bits(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.75]))
    3.0
    """
    z64, p64 = z.detach().double().reshape(-1), p.detach().double().reshape(-1)
    prob = torch.where(z64 > 0.5, p64, 1.0 - p64)
    return float(-torch.log2(prob).sum())


def lattice_bits_per_coordinate(levels: int) -> int:
    """⌈log2(K+1)⌉: bits to send one value of {0, 1/K, …, 1}.

    >>> [lattice_bits_per_coordinate(k) for k in (1, 2, 3, 10, 15, 16)]
    [1, 2, 2, 4, 4, 5]
    """
    return max(1, math.ceil(math.log2(levels + 1)))


class BernoulliRangeCodec:
    """Range coding of a binary mask with Bernoulli(``model_p``) as the shared model.

    ``constriction``'s Bernoulli model keeps a tiny probability for the impossible outcome when
    p_j is 0 or 1, so every mask can be coded (an unlikely bit costs many bits, never an error).

    The encoder is deterministic, so a valid payload is exactly the code of the mask it decodes
    to: :meth:`decode` re-encodes its result and raises
    :class:`~fedlightning.errors.MessageDecodeError` unless the words match (a truncated or
    corrupted stream otherwise decodes to a wrong mask without complaint).

    Args:
        model_p: the probabilities both sides know (the broadcast p), one per coordinate;
            NaN is refused with ``ValueError``.
    """

    name = "bernoulli_range"

    def __init__(self, *, model_p: Tensor) -> None:
        p = model_p.detach().reshape(-1).to("cpu", torch.float64)
        if bool(torch.isnan(p).any()):
            raise ValueError(
                f"BernoulliRangeCodec received a model p with {int(torch.isnan(p).sum())} NaN entries; "
                "the probabilities diverged, lower the learning rate."
            )
        self.model_p = p.clamp(0.0, 1.0).numpy()
        self._family = constriction.stream.model.Bernoulli(perfect=False)

    def _words(self, symbols: np.ndarray) -> np.ndarray:
        encoder = constriction.stream.queue.RangeEncoder()
        encoder.encode(symbols, self._family, self.model_p)
        return np.asarray(encoder.get_compressed(), dtype=np.uint32)

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).cpu()
        if flat.numel() != self.model_p.size:
            raise ValueError(f"The mask has {flat.numel()} entries but the model p has {self.model_p.size}.")
        symbols = flat.to(torch.int32)
        if not torch.equal(symbols.to(flat.dtype), flat) or bool(((symbols < 0) | (symbols > 1)).any()):
            raise ValueError("BernoulliRangeCodec received values other than 0 and 1; it encodes binary masks only.")
        payload = self._words(symbols.numpy()).astype("<u4").tobytes()
        return Message(payload=payload, num_bits=8 * len(payload), codec=self, shape=tuple(x.shape))

    def decode(self, message: Message) -> Tensor:
        numel = math.prod(message.shape)
        if numel != self.model_p.size:
            raise MessageDecodeError(
                f"{self.name}: the message shape {message.shape} has {numel} entries but the model p has "
                f"{self.model_p.size}."
            )
        if message.num_bits % 32:
            raise MessageDecodeError(f"{self.name}: the stream is whole 32-bit words, not {message.num_bits} bits.")
        words = np.frombuffer(message.payload, dtype="<u4").astype(np.uint32)
        try:
            symbols = np.asarray(
                constriction.stream.queue.RangeDecoder(words).decode(self._family, self.model_p), dtype=np.int32
            )
        except AssertionError:  # constriction's report of data the model cannot have produced
            raise MessageDecodeError(f"{self.name}: the stream is not a valid code under the model p.") from None
        if not np.array_equal(self._words(symbols), words):
            raise MessageDecodeError(
                f"{self.name}: the {words.size}-word stream is not the code of the mask it decodes to "
                "(truncated or corrupted)."
            )
        return torch.from_numpy(symbols.astype(np.float32)).reshape(message.shape)


class LatticeCodec:
    """Lossless codec for p ∈ {0, 1/K, …, 1}: a 32-bit K, then ⌈log2(K+1)⌉ bits per coordinate.

    Raises ``ValueError`` if a value is not (within 1e-6) a multiple of 1/K in [0, 1]: this
    codec must never round silently. Decoding returns float32(k/K); a message whose length,
    header K (it must equal ``levels``) or a k above K cannot be right raises
    :class:`~fedlightning.errors.MessageDecodeError`.

    Args:
        levels: K, the number of averaged bits (the previous round's cohort size).
    """

    name = "lattice"
    header_bits = 32

    def __init__(self, *, levels: int) -> None:
        if levels < 1:
            raise ValueError(f"LatticeCodec needs at least one level (got {levels}).")
        self.levels = int(levels)

    def encode(self, x: Tensor) -> Message:
        flat = x.detach().reshape(-1).to("cpu", torch.float64)
        scaled = flat * self.levels
        k = torch.round(scaled)
        if bool(((scaled - k).abs() > 1e-6 * self.levels).any()) or bool(((k < 0) | (k > self.levels)).any()):
            raise ValueError(
                f"LatticeCodec(levels={self.levels}) received values that are not multiples of 1/{self.levels} "
                "in [0, 1]; use the float32 downlink for this state."
            )
        width = lattice_bits_per_coordinate(self.levels)
        ints = k.to(torch.int64).numpy().astype(np.uint64)
        shifts = np.arange(width, dtype=np.uint64)
        bits = ((ints[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8).reshape(-1)
        header = np.unpackbits(np.array([self.levels], dtype="<u4").view(np.uint8), bitorder="little")
        stream = np.concatenate([header, bits])
        payload = np.packbits(stream, bitorder="little").tobytes()
        return Message(
            payload=payload, num_bits=int(stream.size), codec=self, shape=tuple(x.shape), header_bits=self.header_bits
        )

    def decode(self, message: Message) -> Tensor:
        numel = math.prod(message.shape)
        width = lattice_bits_per_coordinate(self.levels)
        expected = self.header_bits + width * numel
        if message.num_bits != expected:
            raise MessageDecodeError(
                f"{self.name}: {numel} coordinates with K={self.levels} take {expected} bits, "
                f"this message has {message.num_bits}."
            )
        stream = np.unpackbits(
            np.frombuffer(message.payload, dtype=np.uint8), count=message.num_bits, bitorder="little"
        )
        levels = int(np.packbits(stream[:32], bitorder="little").view("<u4")[0])
        if levels != self.levels:
            raise MessageDecodeError(f"{self.name}: the header says K={levels} but this codec has K={self.levels}.")
        bits = stream[32:].reshape(numel, width).astype(np.int64)
        ints = (bits << np.arange(width, dtype=np.int64)[None, :]).sum(axis=1)
        if numel and int(ints.max()) > levels:
            raise MessageDecodeError(f"{self.name}: a coordinate decodes to {int(ints.max())}/{levels}, above 1.")
        values = torch.from_numpy(ints).to(torch.float64) / levels
        return values.to(torch.float32).reshape(message.shape)
