"""Codecs for a list of real values inside a larger bitstream (the values of a sparse vector).

A value codec writes ``count`` values into a :class:`BitWriter` and reads them back from a
:class:`BitReader`; ``count`` is known to the reader from the surrounding message. Lossy
codecs (float16, 8-bit) decode to their quantised values; ``roundtrip(values)`` gives what
the receiver sees, so error feedback can keep the exact residual.

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
    "ValueCodec",
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

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        writer.write_array(np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16), 16)

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        return reader.read_array(count, 16).astype(np.uint16).view(np.float16).astype(np.float32)

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)


class BFloat16Values(ValueCodec):
    """bfloat16 (float32 with the low 16 mantissa bits rounded off), 16 bits per value."""

    name = "bfloat16"
    bits_per_value = 16

    @staticmethod
    def _words(values: np.ndarray) -> np.ndarray:
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        return rounded.astype(np.uint16)  # round to nearest even

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
    is representable; it reuses the layout of :mod:`fedlightning.compression.natural`.
    Values that are not powers of two are rounded down in magnitude (use after C_nat).
    """

    name = "natural"
    bits_per_value = 9

    def write(self, writer: BitWriter, values: np.ndarray) -> None:
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        writer.write_array((u >> np.uint32(23)).astype(np.uint64), 9)  # sign + exponent

    def read(self, reader: BitReader, count: int) -> np.ndarray:
        top = reader.read_array(count, 9).astype(np.uint32)
        return (top << np.uint32(23)).view(np.float32)

    def roundtrip(self, values: np.ndarray) -> np.ndarray:
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        return ((u >> np.uint32(23)) << np.uint32(23)).view(np.float32)


_VALUE_CODECS: dict[str, type[ValueCodec]] = {
    "float32": Float32Values,
    "float16": Float16Values,
    "bfloat16": BFloat16Values,
    "int8": Int8Values,
    "8bit": Int8Values,
    "natural": NaturalValues,
}


def value_codec(name: str | ValueCodec) -> ValueCodec:
    """The value codec called ``name`` (float32, float16, bfloat16, int8/8bit, natural)."""
    if isinstance(name, ValueCodec):
        return name
    try:
        return _VALUE_CODECS[name]()
    except KeyError:
        raise ValueError(f"Unknown value codec {name!r}; choose one of {sorted(_VALUE_CODECS)}.") from None
