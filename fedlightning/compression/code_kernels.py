"""Compiled loops that find where each code of a Golomb–Rice or Elias-gamma array lies.

Where a code ends depends on where the one before it ended, so finding the codes of an array
is a serial walk over the stream's bits. :class:`fedlightning.compression.bitstream.BitReader`
walks here in compiled code (numba, one thread, cached on disk) and reads every value in bulk
afterwards. The kernels only locate codes; the reader checks what they report and raises the
same decode errors as its one-code-at-a-time readers (tests in
``tests/test_compression_bitstream.py`` compare the two on cut and corrupted streams).

Each kernel returns ``(codes, pos)``: how many codes were located (``count`` when all were)
and the bit where the first unread code starts.

>>> import numpy as np
>>> bits = np.array([1, 0, 1, 0, 0, 1], dtype=np.uint8)  # Rice, b = 1: "10 1" = 3, "0 0" = 0, then "1" cut
>>> stops = np.empty(3, dtype=np.int64)
>>> rice_stops(bits, 0, 3, 1, stops), stops[:2].tolist()
((2, 5), [1, 3])
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["gamma_codes", "rice_stops"]

_JIT: dict[str, Any] = {"boundscheck": False, "nogil": True, "cache": True}


@njit(**_JIT)
def rice_stops(bits: np.ndarray, pos: int, count: int, b: int, stops: np.ndarray) -> tuple[int, int]:
    """Golomb–Rice codes (quotient in unary: ones, then a zero; then ``b`` remainder bits) from bit ``pos``.

    ``stops[i]`` is the bit of code i's terminating zero. A code stops being located when its
    quotient or its remainder would run past the end of ``bits``.
    """
    end = bits.size
    for i in range(count):
        stop = pos
        while stop < end and bits[stop] != 0:
            stop += 1
        if stop + 1 + b > end:
            return i, pos
        stops[i] = stop
        pos = stop + 1 + b
    return count, pos


@njit(**_JIT)
def gamma_codes(bits: np.ndarray, pos: int, count: int, starts: np.ndarray, widths: np.ndarray) -> tuple[int, int]:
    """Elias-gamma codes (z zeros, then a value of z + 1 bits starting with a one) from bit ``pos``.

    ``starts[i]`` and ``widths[i]`` are the first bit and the width of code i's value. A code
    stops being located when it runs past the end of ``bits`` or its value would be wider
    than 64 bits.
    """
    end = bits.size
    for i in range(count):
        one = pos
        while one < end and bits[one] == 0:
            one += 1
        zeros = one - pos
        if one >= end or one + zeros >= end or zeros >= 64:
            return i, pos
        starts[i] = one
        widths[i] = zeros + 1
        pos = one + zeros + 1
    return count, pos
