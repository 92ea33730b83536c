"""Unsigned varints (multiformats unsigned-varint / protobuf base-128), sans-I/O.

Values are limited to 63 bits and 9 bytes, as the multiformats spec requires; non-minimal
encodings are rejected so that one value has exactly one encoding.
"""
from __future__ import annotations

from .errors import DecodeError

MAX_VARINT_BYTES = 9
MAX_VARINT_VALUE = (1 << 63) - 1


class VarintError(DecodeError):
    """A varint is overlong, non-minimal or out of range."""


def encode_uvarint(value: int) -> bytes:
    if value < 0 or value > MAX_VARINT_VALUE:
        raise ValueError(f"varint out of range: {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_uvarint(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """Decode the varint at ``buf[pos:]``.

    Returns ``(value, position after the varint)``, or None when ``buf`` ends before the varint
    does (feed more bytes). Raises VarintError on overlong or non-minimal encodings.
    """
    value = 0
    shift = 0
    end = len(buf)
    i = pos
    while i < end:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i - pos > 1:
                raise VarintError("non-minimal varint encoding")
            if value > MAX_VARINT_VALUE:
                raise VarintError("varint exceeds 63 bits")
            return value, i
        shift += 7
        if i - pos >= MAX_VARINT_BYTES:
            raise VarintError(f"varint longer than {MAX_VARINT_BYTES} bytes")
    return None


def decode_uvarint_complete(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Like decode_uvarint, but a truncated varint is an error (for fully received messages)."""
    result = decode_uvarint(buf, pos)
    if result is None:
        raise VarintError("truncated varint")
    return result
