"""Codecs for a list of real values inside a larger bitstream (the values of a sparse vector).

A value codec writes ``count`` values into a :class:`BitWriter` and reads them back from a
:class:`BitReader`; ``count`` is known to the reader from the surrounding message. Lossy
codecs (float16, bfloat16, 8-bit) decode to their quantised values; ``roundtrip(values)``
gives what the receiver sees, so error feedback can keep the exact residual.

Each codec declares ``relative_error(count)``, an ε with ``‖Q(v) − v‖² ≤ ε‖v‖²`` for the
``count`` values it sends (0 for the lossless float32 and natural codes); operators built on
a lossy code are biased and derive δ from ε, and :func:`check_value_loss` refuses, in one
sentence, values a code cannot carry within its ε (float16 beyond 65504, bfloat16 or 8-bit
codes of subnormal magnitudes).

>>> import numpy as np
>>> codec = value_codec("int8")
>>> codec.bits(5)   # 32-bit float scale + 8 bits per value
72
"""

from __future__ import annotations

import numpy as np

from fedlightning.compression.bitstream import BitReader, BitWriter

__all__ = [
    "BFloat16Values",
    "Float16Values",
    "Float32Values",
    "Int8Values",
    "NaturalValues",
    "ScaledFloat16Values",
    "ValueCodec",
    "check_value_loss",
    "value_codec",
]


class ValueCodec:
    """Base: fixed ``bits_per_value`` bits per value plus ``header_bits`` once per message."""

    name = "values"
    bits_per_value = 32
    header_bits = 0

    def bits(self, count: int) -> int:
        """Exact bits of ``count`` values (header included, 0 when count is 0)."""
        return 0 if count == 0 else self.header_bits + self.bits_per_value * count

    def relative_error(self, count: int) -> float:
        """ε with ``‖Q(v) − v‖² ≤ ε‖v‖²`` for ``count`` values (0: lossless)."""
        return 0.0

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        raise NotImplementedError

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        raise NotImplementedError

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        """The values the receiver decodes."""
        w = BitWriter()
        self.write(w, values)
        payload, n = w.getvalue()
        return self.read(BitReader(payload, n), values.size)


class Float32Values(ValueCodec):
    """IEEE float32, 32 bits per value (lossless for float32)."""

    name = "float32"
    bits_per_value = 32

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        writer.write_array(np.ascontiguousarray(values, dtype=np.float32).view(np.uint32), 32)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        return reader.read_array(count, 32).astype(np.uint32).view(np.float32)

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float32)


class Float16Values(ValueCodec):
    """IEEE half precision, 16 bits per value (round to nearest)."""

    name = "float16"
    bits_per_value = 16

    def relative_error(self, count: int) -> float:
        return 2.0**-20  # round to nearest, 11-bit significand; underflow is refused by check_value_loss

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float32)
        if v.size and float(np.abs(v).max()) > 65504.0:
            raise ValueError(
                f"float16 values overflow at |v| = {float(np.abs(v).max()):.4g} (float16's largest is 65504); "
                "use values=bfloat16 or float32."
            )
        writer.write_array(v.astype(np.float16).view(np.uint16), 16)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        return reader.read_array(count, 16).astype(np.uint16).view(np.float16).astype(np.float32)

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)


class ScaledFloat16Values(ValueCodec):
    """float16 of ``v / max|v|`` after a float32 scale ``max|v|``: 32 + 16 bits per value.

    The scale keeps every value in float16's range whatever the magnitude of ``v`` (what the
    sparsifiers send with ``values=float16``): each value keeps an 11-bit significand down to
    ``2^−14·max|v|`` and an absolute error below ``2^−25·max|v|`` beneath it.
    """

    name = "float16"
    bits_per_value = 16
    header_bits = 32

    def relative_error(self, count: int) -> float:
        return 2.0**-20 + count * 2.0**-48

    def _scale(self, v: np.ndarray) -> np.float32:
        return np.float32(np.abs(v).max()) if v.size else np.float32(0)

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float32)
        if v.size == 0:
            return
        scale = self._scale(v)
        writer.write_array(np.array([scale], dtype=np.float32).view(np.uint32), 32)
        w = v.astype(np.float64) / float(scale) if scale > 0 else np.zeros(v.shape)
        writer.write_array(w.astype(np.float16).view(np.uint16), 16)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=np.float32)
        scale = reader.read_array(1, 32).astype(np.uint32).view(np.float32)[0]
        if not np.isfinite(scale) or scale < 0:
            raise reader.error(f"the float16 value scale is {scale}; the encoder sends a finite max|v|")
        w = reader.read_array(count, 16).astype(np.uint16).view(np.float16).astype(np.float64)
        if count and float(np.abs(w).max()) > 1.0:
            raise reader.error("a scaled float16 value decodes above 1 in magnitude, which the encoder never sends")
        return (w * float(scale)).astype(np.float32)


class BFloat16Values(ValueCodec):
    """bfloat16 (float32 with the low 16 mantissa bits rounded off), 16 bits per value.

    Round to nearest even, except that a value which would round up to infinity (within half
    a bfloat16 step of float32's maximum) is rounded down to the largest finite bfloat16.
    """

    name = "bfloat16"
    bits_per_value = 16

    def relative_error(self, count: int) -> float:
        return 2.0**-14  # 8-bit significand (2^-16) with room for the top-of-range rounding down

    @staticmethod
    def _words(values: np.ndarray) -> np.ndarray:
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        to_inf = ((rounded & np.uint64(0x7F80)) == np.uint64(0x7F80)) & ((u & np.uint64(0x7F800000)) != 0x7F800000)
        rounded = np.where(to_inf, u >> np.uint64(16), rounded)  # finite input: truncate instead of overflowing
        return rounded.astype(np.uint16)

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        writer.write_array(self._words(values), 16)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        words = reader.read_array(count, 16).astype(np.uint32) << np.uint32(16)
        return words.view(np.float32)

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        return (self._words(values).astype(np.uint32) << np.uint32(16)).view(np.float32)


class Int8Values(ValueCodec):
    """8-bit symmetric linear quantisation: float32 scale ``max|v|`` + ``round(127 v / scale)``.

    Deterministic round-to-nearest (biased; pair it with error feedback). The relative error
    of each value is at most ``1/254`` of the largest magnitude.
    """

    name = "int8"
    bits_per_value = 8
    header_bits = 32

    def relative_error(self, count: int) -> float:
        return count / 250.0**2  # each error <= max|v|/254 <= ‖v‖/254, with room for float32 rounding

    def _quantise(self, values: np.ndarray) -> tuple[np.float32, np.ndarray]:
        v = np.asarray(values, dtype=np.float32)
        scale = np.float32(np.abs(v).max()) if v.size else np.float32(0)
        if scale == 0 or not np.isfinite(scale):
            return np.float32(scale), np.zeros(v.shape, dtype=np.int64)
        q = np.clip(np.rint(v / scale * 127.0), -127, 127).astype(np.int64)
        return scale, q

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        if values.size == 0:
            return
        scale, q = self._quantise(values)
        writer.write_array(np.array([scale], dtype=np.float32).view(np.uint32), 32)
        writer.write_array((q + 128).astype(np.uint64), 8)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=np.float32)
        scale = reader.read_array(1, 32).astype(np.uint32).view(np.float32)[0]
        if scale < 0:
            raise reader.error(f"the 8-bit value scale is negative ({scale})")
        q = reader.read_array(count, 8).astype(np.int64) - 128
        if count and int(q.min()) < -127:
            raise reader.error("an 8-bit value code is 0, outside the symmetric range 1..255 the encoder writes")
        with np.errstate(invalid="ignore"):  # a NaN scale (from a NaN input) stays NaN, quietly
            return (q.astype(np.float32) * (scale / np.float32(127.0))).astype(np.float32)


class NaturalValues(ValueCodec):
    """Powers of two ``±2^e`` (what natural compression outputs): sign bit + 8-bit exponent.

    The exponent field is the float32 biased exponent, so every normal float32 power of two
    is representable, and a subnormal power of two takes 5 more bits (the layout of
    :mod:`fedlightning.compression.natural`; ``bits`` counts 9 per value, the normal case).
    Values that are not powers of two are rounded down in magnitude (use after C_nat).
    """

    name = "natural"
    bits_per_value = 9

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        from fedlightning.compression.natural import write_natural_codes

        write_natural_codes(writer, values)  # sign + exponent (+ 5 bits for a subnormal power)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        from fedlightning.compression.natural import read_natural_codes

        return read_natural_codes(reader, count)


_VALUE_CODECS: dict[str, type[ValueCodec]] = {
    "float32": Float32Values,
    "float16": Float16Values,
    "bfloat16": BFloat16Values,
    "int8": Int8Values,
    "8bit": Int8Values,
    "natural": NaturalValues,
}


def check_value_loss(codec: ValueCodec, values: np.ndarray, who: str) -> None:
    """Refuse ``values`` that ``codec`` cannot carry within its declared ε (one sentence)."""
    if codec.relative_error(values.size) == 0 or values.size == 0:
        return
    v = np.asarray(values, dtype=np.float32)
    energy = float(np.square(v.astype(np.float64)).sum())
    err = float(np.square(codec.roundtrip(v).astype(np.float64) - v).sum())
    if err > codec.relative_error(values.size) * energy:
        raise ValueError(
            f"{who}: the {codec.name} value code loses {err / energy:.3g} of the values' energy at magnitudes near "
            f"{float(np.abs(v).max()):.3g}, more than the {codec.relative_error(values.size):.3g} its δ assumes; "
            "use values=float32."
        )


def value_codec(name: str | ValueCodec) -> ValueCodec:
    """The value codec called ``name`` (float32, float16, bfloat16, int8/8bit, natural)."""
    if isinstance(name, ValueCodec):
        return name
    try:
        return _VALUE_CODECS[name]()
    except KeyError:
        raise ValueError(f"Unknown value codec {name!r}; choose one of {sorted(_VALUE_CODECS)}.") from None
