"""Compression: bitstreams, index coding, value codes and the thesis's compression operators.

Operators (each with ``compress(x, generator) -> Message``, exact codec, ω/δ metadata):
:class:`Identity`, :class:`NaturalCompression` (C_nat), :class:`DeterministicNatural`,
:class:`ExponentialRounding`, :class:`NaturalDithering`, :class:`StandardDithering`,
:class:`QSGD`, :class:`TernGrad`, :class:`RandK`, :class:`TopK`, :class:`TopKThen`,
:class:`BiasedRandomSparsification`, :class:`AdaptiveRandomSparsification`,
:class:`NURand1`, :class:`GradientSparsification`, :class:`Sign`, :class:`ScaledSign`,
:class:`InducedCompressor`, :class:`Blockwise`.

:mod:`fedlightning.compression.theory` runs distributed compressed gradient descent on the
thesis's small convex problems (Example 4.7.1, the quadratics and least squares of Figs. 4.7
and 4.8) and evaluates Theorem 4.5.3's adaptive bound.
"""

from fedlightning.compression.dithering import QSGD, Dithering, NaturalDithering, StandardDithering, TernGrad
from fedlightning.compression.error_feedback import error_feedback_step
from fedlightning.compression.index_coding import SparseCodec, decode_positions, encode_positions, log2_binomial
from fedlightning.compression.induced import InducedCompressor
from fedlightning.compression.natural import DeterministicNatural, ExponentialRounding, NaturalCompression
from fedlightning.compression.operators import Blockwise, Compressor, Identity, ScaledSign, Sign
from fedlightning.compression.sparse import (
    AdaptiveRandomSparsification,
    BiasedRandomSparsification,
    GradientSparsification,
    NURand1,
    RandK,
    TopK,
    TopKThen,
)

__all__ = [
    "QSGD",
    "AdaptiveRandomSparsification",
    "BiasedRandomSparsification",
    "Blockwise",
    "Compressor",
    "DeterministicNatural",
    "Dithering",
    "ExponentialRounding",
    "GradientSparsification",
    "Identity",
    "InducedCompressor",
    "NURand1",
    "NaturalCompression",
    "NaturalDithering",
    "RandK",
    "ScaledSign",
    "Sign",
    "SparseCodec",
    "StandardDithering",
    "TernGrad",
    "TopK",
    "TopKThen",
    "decode_positions",
    "encode_positions",
    "error_feedback_step",
    "log2_binomial",
]
