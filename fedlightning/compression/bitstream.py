"""Bit-level writer and reader with the universal integer codes the compressors use.

Bits are written most-significant first into a stream that is padded with zeros to whole
bytes only at the end; :meth:`BitWriter.getvalue` returns ``(payload, num_bits)`` where
``num_bits`` is the exact number of bits written. Every code has a scalar method and a
vectorised ``*_array`` method (NumPy), so a message of 10^5–10^6 symbols encodes in
milliseconds. The array and scalar forms write identical bits.

Codes (``n`` is the integer written):

* fixed width: ``write_bits(n, w)`` — ``w`` bits;
* Elias gamma (``n >= 1``): ``2⌊log2 n⌋ + 1`` bits;
* Elias delta (``n >= 1``): ``⌊log2 n⌋ + 2⌊log2(⌊log2 n⌋ + 1)⌋ + 1`` bits;
* Golomb–Rice with parameter ``b`` (``n >= 0``): unary quotient ``n >> b`` (that many ones,
  then a zero) followed by the ``b`` low bits: ``(n >> b) + 1 + b`` bits.

>>> w = BitWriter()
>>> w.write_bits(5, 3); w.write_elias_gamma(9); w.write_rice(13, 2)
>>> payload, n = w.getvalue()
>>> n == 3 + elias_gamma_length(9) + rice_length(13, 2)
True
>>> r = BitReader(payload, n)
>>> (r.read_bits(3), r.read_elias_gamma(), r.read_rice(2))
(5, 9, 13)
>>> r.remaining
0
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from fedlightning.errors import MessageDecodeError
from fedlightning.federated.message import Bitstream

__all__ = [
    "BitReader",
    "BitWriter",
    "elias_delta_length",
    "elias_gamma_length",
    "rice_length",
]


def _as_u64(values: np.ndarray | list[int]) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind in "iu" and arr.min() < 0:
        raise ValueError("Bit codes write non-negative integers only.")
    return arr.astype(np.uint64, copy=False).reshape(-1)


def _bit_length(values: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of each uint64 (0 for 0), exact for all 64-bit values.

    ``frexp`` of the value as a float64 gives it, except where rounding to 53 bits carried the
    value up to the next power of two (values of 54 bits or more): those step back by one.
    """
    v = values.astype(np.uint64, copy=False)
    length = np.minimum(np.frexp(v.astype(np.float64))[1], 64).astype(np.int64)
    top = np.left_shift(np.uint64(1), np.maximum(length - 1, 0).astype(np.uint64))
    return length - ((length > 0) & (top > v))


def elias_gamma_length(n: int) -> int:
    """Bits of the Elias-gamma code of ``n >= 1``."""
    if n < 1:
        raise ValueError(f"Elias gamma codes integers >= 1 (got {n}).")
    return 2 * (n.bit_length() - 1) + 1


def elias_delta_length(n: int) -> int:
    """Bits of the Elias-delta code of ``n >= 1``."""
    if n < 1:
        raise ValueError(f"Elias delta codes integers >= 1 (got {n}).")
    nb = n.bit_length()
    return (nb - 1) + elias_gamma_length(nb)


def rice_length(n: int, b: int) -> int:
    """Bits of the Golomb–Rice code of ``n >= 0`` with parameter ``b`` (divisor ``2**b``)."""
    return (n >> b) + 1 + b


def _expand_fixed(values: np.ndarray, width: int) -> np.ndarray:
    """Bits (uint8, MSB first) of each value in ``width`` (<= 64) bits, concatenated."""
    if width == 0 or values.size == 0:
        return np.zeros(0, dtype=np.uint8)
    nbytes = (width + 7) // 8
    be = values.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - nbytes :]  # the big-endian bytes that hold it
    bits = np.unpackbits(be, axis=1)  # (n, 8·nbytes), MSB first
    return np.ascontiguousarray(bits[:, 8 * nbytes - width :]).reshape(-1)


def _expand(values: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Bits (uint8, MSB first) of each ``values[i]`` in ``widths[i]`` bits, concatenated."""
    widths = widths.astype(np.int64, copy=False)
    if widths.size and widths.min() == widths.max():
        return _expand_fixed(values, int(widths[0]))
    total = int(widths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint8)
    owner = np.repeat(np.arange(values.size), widths)
    starts = np.cumsum(widths) - widths
    offset = np.arange(total, dtype=np.int64) - starts[owner]
    shift = (widths[owner] - 1 - offset).astype(np.uint64)
    return ((values[owner] >> shift) & np.uint64(1)).astype(np.uint8)


class BitWriter:
    """Append-only bitstream (MSB first within each code)."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._num_bits = 0

    @property
    def num_bits(self) -> int:
        """Bits written so far (exact, no padding)."""
        return self._num_bits

    def _push(self, bits: np.ndarray) -> None:
        if bits.size:
            self._chunks.append(bits)
            self._num_bits += int(bits.size)

    # ---------------------------------------------------------------- fixed width
    def write_bits(self, value: int, nbits: int) -> None:
        """``value`` in exactly ``nbits`` bits (``0 <= value < 2**nbits``)."""
        if nbits < 0 or value < 0 or (nbits < 64 and value >> nbits):
            raise ValueError(f"{value} does not fit in {nbits} bits.")
        if nbits == 0:
            return
        if nbits > 64:
            self.write_bits(value >> 64, nbits - 64)
            self.write_bits(value & ((1 << 64) - 1), 64)
            return
        self._push(_expand(np.array([value], dtype=np.uint64), np.array([nbits])))

    def write_array(self, values: np.ndarray, nbits: int | np.ndarray) -> None:
        """Each of ``values`` in ``nbits`` bits (a width, or one width per value; <= 64)."""
        v = _as_u64(values)
        widths = np.broadcast_to(np.asarray(nbits, dtype=np.int64), v.shape)
        if widths.size and (widths.max() > 64 or widths.min() < 0):
            raise ValueError("write_array widths must lie in [0, 64].")
        # v fits in w bits when v >> w is 0, shifted in two steps (a shift by 64 is undefined; 64 bits hold any value)
        if v.size and np.any(v >> np.minimum(widths, 63).astype(np.uint64) >> (widths == 64).astype(np.uint64)):
            raise ValueError("A value does not fit in its bit width.")
        self._push(_expand(v, widths))

    def write_bitarray(self, bits: np.ndarray) -> None:
        """Raw bits (an array of 0/1)."""
        self._push(np.asarray(bits, dtype=np.uint8).reshape(-1) & 1)

    def write_payload(self, payload: bytes, num_bits: int) -> None:
        """The first ``num_bits`` bits of another stream (e.g. a byte-aligned codec's payload)."""
        bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=num_bits)
        self._push(bits)

    # ---------------------------------------------------------------- universal codes
    def write_unary(self, n: int) -> None:
        """``n`` ones followed by a zero."""
        self._push(np.concatenate([np.ones(n, dtype=np.uint8), np.zeros(1, dtype=np.uint8)]))

    def write_elias_gamma(self, n: int) -> None:
        """Elias gamma of ``n >= 1``: ``⌊log2 n⌋`` zeros, then ``n`` in binary."""
        self.write_elias_gamma_array(np.array([n]))

    def write_elias_gamma_array(self, values: np.ndarray) -> None:
        """Elias gamma of each ``values[i] >= 1``."""
        v = _as_u64(values)
        if v.size and v.min() < 1:
            raise ValueError("Elias gamma codes integers >= 1.")
        nb = _bit_length(v)
        if not nb.size or nb.max() <= 32:
            self._push(_expand(v, 2 * nb - 1))  # the leading zeros are the high bits of a 2nb-1 wide field
            return
        # A value of 33 to 64 bits has a code wider than 64 bits: its zeros, then its bits.
        zeros = np.zeros(int((nb - 1).sum()), dtype=np.uint8)
        self._push(_interleave(zeros, nb - 1, _expand(v, nb), nb))

    def write_elias_delta(self, n: int) -> None:
        """Elias delta of ``n >= 1``: gamma of its bit length, then its bits below the top one."""
        self.write_elias_delta_array(np.array([n]))

    def write_elias_delta_array(self, values: np.ndarray) -> None:
        """Elias delta of each ``values[i] >= 1``."""
        v = _as_u64(values)
        if v.size and v.min() < 1:
            raise ValueError("Elias delta codes integers >= 1.")
        nb = _bit_length(v)
        gamma_bits = _expand(nb.astype(np.uint64), 2 * _bit_length(nb.astype(np.uint64)) - 1)
        low = v & ((np.uint64(1) << (nb - 1).astype(np.uint64)) - np.uint64(1))
        low_bits = _expand(low, nb - 1)
        # interleave per symbol: gamma(nb_i) then low_i
        gl = 2 * _bit_length(nb.astype(np.uint64)) - 1
        ll = nb - 1
        self._push(_interleave(gamma_bits, gl, low_bits, ll))

    def write_rice(self, n: int, b: int) -> None:
        """Golomb–Rice code of ``n >= 0`` with divisor ``2**b``."""
        self.write_rice_array(np.array([n]), b)

    def write_rice_array(self, values: np.ndarray, b: int) -> None:
        """Golomb–Rice code of each ``values[i] >= 0`` with divisor ``2**b``."""
        v = _as_u64(values)
        if v.size == 0:
            return
        q = (v >> np.uint64(b)).astype(np.int64)
        ends = np.cumsum(q + (1 + b))
        rem_starts = ends - b
        # the quotients in unary: +1 where a code's ones begin, −1 at its stop (a zero), summed along
        edges = np.zeros(int(ends[-1]) + 1, dtype=np.int8)
        edges[rem_starts - 1 - q] = 1
        edges[rem_starts - 1] -= 1
        bits = np.cumsum(edges[:-1], dtype=np.int8).view(np.uint8)
        if b:
            low = v & np.uint64((1 << b) - 1)
            bits[rem_starts[:, None] + np.arange(b)] = _expand_fixed(low, b).reshape(-1, b)
        self._push(bits)

    # ---------------------------------------------------------------- output
    def getvalue(self) -> tuple[bytes, int]:
        """``(payload, num_bits)``: the stream padded with zeros to whole bytes, and its exact length."""
        if not self._chunks:
            return b"", 0
        bits = np.concatenate(self._chunks)
        self._chunks = [bits]
        return np.packbits(bits).tobytes(), self._num_bits


def _interleave(a: np.ndarray, la: np.ndarray, b: np.ndarray, lb: np.ndarray) -> np.ndarray:
    """Concatenate per symbol ``a_i`` (``la[i]`` bits) then ``b_i`` (``lb[i]`` bits)."""
    n = la.size
    widths = np.stack([la, lb], axis=1).reshape(-1)
    src_is_b = np.tile(np.array([False, True]), n)
    out = np.empty(int(widths.sum()), dtype=np.uint8)
    seg = np.repeat(np.arange(2 * n), widths)
    mask_b = src_is_b[seg]
    out[~mask_b] = a
    out[mask_b] = b
    return out


class BitReader:
    """Reads a stream written by :class:`BitWriter`; refuses to read past ``num_bits``.

    Every malformed read (past the end, an unterminated code, a value wider than 64 bits)
    raises :class:`~fedlightning.errors.MessageDecodeError` naming ``codec``, the codec whose
    message is being read.
    """

    def __init__(self, payload: Bitstream, num_bits: int, *, codec: str = "bitstream") -> None:
        self.codec = codec
        if num_bits < 0 or len(payload) * 8 < num_bits:
            raise self.error(f"a payload of {len(payload)} bytes cannot hold {num_bits} bits")
        self._bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=num_bits)
        self._pos = 0
        self._num_bits = num_bits

    def error(self, what: str) -> MessageDecodeError:
        """The decode error ``"<codec>: <what>."`` (``what`` says what is wrong with the stream)."""
        return MessageDecodeError(f"{self.codec}: {what}.")

    @property
    def position(self) -> int:
        """Bits consumed so far."""
        return self._pos

    @property
    def remaining(self) -> int:
        """Bits not yet read."""
        return self._num_bits - self._pos

    def _take(self, n: int) -> np.ndarray:
        if n < 0 or self._pos + n > self._num_bits:
            raise self.error(f"a read of {n} bits at bit {self._pos} runs past the end ({self._num_bits} bits)")
        out = self._bits[self._pos : self._pos + n]
        self._pos += n
        return out

    def read_bits(self, nbits: int) -> int:
        """An unsigned integer of ``nbits`` bits."""
        value = 0
        for bit in self._take(nbits).tolist():
            value = (value << 1) | bit
        return value

    def read_array(self, count: int, nbits: int) -> np.ndarray:
        """``count`` unsigned integers of ``nbits`` (<= 64) bits each, as uint64."""
        if not 0 <= nbits <= 64 or count < 0:
            raise self.error(f"cannot read {count} fields of {nbits} bits (fields hold 0 to 64 bits)")
        if count == 0 or nbits == 0:
            self._take(0)
            return np.zeros(count, dtype=np.uint64)
        bits = self._take(count * nbits).reshape(count, nbits)
        field = 8 if nbits <= 8 else 16 if nbits <= 16 else 32 if nbits <= 32 else 64  # the narrowest that holds one
        padded = np.zeros((count, field), dtype=np.uint8)
        padded[:, field - nbits :] = bits
        return np.packbits(padded).view(f">u{field // 8}").astype(np.uint64)

    def read_bitarray(self, count: int) -> np.ndarray:
        """``count`` raw bits (uint8)."""
        return self._take(count).copy()

    def read_payload(self, num_bits: int) -> bytes:
        """The next ``num_bits`` bits repacked as a byte-aligned payload."""
        return np.packbits(self._take(num_bits)).tobytes()

    # ---------------------------------------------------------------- universal codes
    def _first(self, target: int) -> int:
        """The first position, at or after the reader's, that holds bit ``target`` (``num_bits`` if none).

        Scans windows that double in size, so a code costs about its own length.
        """
        pos, window = self._pos, 64
        while pos < self._num_bits:
            hits = np.flatnonzero(self._bits[pos : pos + window] == target)
            if hits.size:
                return pos + int(hits[0])
            pos, window = pos + window, window * 2
        return self._num_bits

    def read_unary(self) -> int:
        """Count of ones before the next zero (the zero is consumed)."""
        stop = self._first(0)
        if stop >= self._num_bits:
            raise self.error("a unary code runs past the end of the stream")
        n = stop - self._pos
        self._pos = stop + 1
        return n

    def read_elias_gamma(self) -> int:
        """One Elias-gamma integer."""
        one = self._first(1)
        if one >= self._num_bits:
            raise self.error("an Elias gamma code runs past the end of the stream")
        zeros = one - self._pos
        if zeros >= 64:
            raise self.error(f"an Elias gamma code of {zeros + 1} bits holds a value wider than 64 bits")
        self._pos = one
        return self.read_bits(zeros + 1)

    def read_elias_gamma_array(self, count: int) -> np.ndarray:
        """``count`` Elias-gamma integers: the codes located by a compiled walk, then every value in bulk."""
        if count > self.remaining:
            raise self.error(f"{count} Elias gamma codes need at least {count} bits, {self.remaining} remain")
        value_starts = np.empty(count, dtype=np.int64)  # each code: z zeros, then its value's z + 1 bits
        widths = np.empty(count, dtype=np.int64)
        located, pos = _code_kernels().gamma_codes(self._bits, self._pos, count, value_starts, widths)
        self._pos = pos
        if located < count:
            self.read_elias_gamma()  # the scalar reader's error for this code
            raise self.error("an Elias gamma code runs past the end of the stream")
        return self._gather(value_starts, widths)

    def read_elias_delta(self) -> int:
        """One Elias-delta integer."""
        nb = self.read_elias_gamma()
        if nb > 64:
            raise self.error(f"an Elias delta code claims a {nb}-bit value (at most 64)")
        return (1 << (nb - 1)) | self.read_bits(nb - 1)

    def read_elias_delta_array(self, count: int) -> np.ndarray:
        """``count`` Elias-delta integers."""
        if count > self.remaining:
            raise self.error(f"{count} Elias delta codes need at least {count} bits, {self.remaining} remain")
        return np.array([self.read_elias_delta() for _ in range(count)], dtype=np.uint64)

    def read_rice(self, b: int) -> int:
        """One Golomb–Rice integer with divisor ``2**b``."""
        q = self.read_unary()
        return (q << b) | self.read_bits(b)

    def read_rice_array(self, count: int, b: int) -> np.ndarray:
        """``count`` Golomb–Rice integers with divisor ``2**b``: the codes located by a compiled walk, then in bulk."""
        if count == 0:
            return np.zeros(0, dtype=np.uint64)
        if count * (1 + b) > self.remaining:
            raise self.error(f"{count} Golomb-Rice codes need at least {count * (1 + b)} bits, {self.remaining} remain")
        stops = np.empty(count, dtype=np.int64)  # each code: its quotient's ones, a zero (its stop), b bits
        located, pos = _code_kernels().rice_stops(self._bits, self._pos, count, b, stops)
        if located < count:
            zeros = np.flatnonzero(self._bits[pos:] == 0)
            part = "remainder" if zeros.size else "code"
            raise self.error(f"a Golomb-Rice {part} runs past the end of the stream")
        rem_starts = stops + 1
        quotients = stops - np.concatenate([[self._pos], rem_starts[:-1] + b])
        if not 0 <= b < 64:
            raise self.error(f"a Golomb-Rice parameter of {b} leaves no room in 64 bits")
        if b and int(quotients.max()) >> (64 - b):
            raise self.error(f"a Golomb-Rice quotient of {int(quotients.max())} overflows 64 bits with parameter {b}")
        self._pos = pos
        return (quotients.astype(np.uint64) << np.uint64(b)) | self._gather(rem_starts, np.full(count, b))

    def _gather(self, starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """The unsigned integers of ``widths[i]`` (at most 64) bits at bit ``starts[i]``, one gather per width."""
        values = np.zeros(starts.size, dtype=np.uint64)
        if not starts.size:
            return values
        same = int(widths[0]) == int(widths.min()) == int(widths.max())
        for width in [int(widths[0])] if same else np.unique(widths).tolist():
            if width == 0:
                continue
            rows = slice(None) if same else np.flatnonzero(widths == width)
            bits = self._bits[starts[rows][:, None] + np.arange(width)].astype(np.uint64)
            values[rows] = (bits << np.arange(width - 1, -1, -1, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
        return values


def _code_kernels() -> ModuleType:
    """The compiled code walks, imported on first use (numba's import and compilation are not free)."""
    from fedlightning.compression import code_kernels

    return code_kernels
