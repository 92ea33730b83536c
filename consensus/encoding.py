"""Canonical deterministic binary encoding for ledger and consensus data.

Every value has exactly one encoding, and the decoder accepts only that one: it rejects
trailing bytes, non-minimal integers, unsorted or duplicate map keys, unknown tags,
invalid UTF-8, nesting deeper than ``MAX_DEPTH`` and input over the caller's size limit.

Wire format (one tag byte, then the body; ``uvarint`` is minimal unsigned LEB128):

    0x00 null    0x01 false    0x02 true
    0x03 uint    uvarint(n)                  n >= 0
    0x04 negint  uvarint(-1 - n)             n < 0
    0x05 bytes   uvarint(len) raw
    0x06 text    uvarint(len) utf-8
    0x07 list    uvarint(count) item*
    0x08 map     uvarint(count) (uvarint(len) utf-8 key, value)*   keys: text, sorted by
                                                                   their UTF-8 bytes, unique

Integers are limited to magnitudes below 2**256. Python ``tuple`` encodes as a list and
decodes as a ``list``; ``bytearray``/``memoryview`` encode as bytes.
"""
from __future__ import annotations

from typing import Any

MAX_DEPTH = 24
MAX_INT_BITS = 256
DEFAULT_MAX_SIZE = 4 * 1024 * 1024

T_NULL, T_FALSE, T_TRUE, T_UINT, T_NEGINT, T_BYTES, T_TEXT, T_LIST, T_MAP = range(9)

_SMALL_UVARINT = [bytes([i]) for i in range(128)]


class EncodingError(ValueError):
    """Input is not the canonical encoding of a value, or a value cannot be encoded."""


def encode_uvarint(n: int) -> bytes:
    if n < 128:
        return _SMALL_UVARINT[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(value: Any) -> bytes:
    """The canonical encoding of ``value`` (None, bool, int, bytes, str, list/tuple, dict[str, ...])."""
    out = bytearray()
    _encode_into(out, value, 0)
    return bytes(out)


def _encode_into(out: bytearray, value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise EncodingError("value nested too deeply")
    kind = type(value)
    if kind is str:
        raw = value.encode("utf-8")
        out.append(T_TEXT)
        out += encode_uvarint(len(raw))
        out += raw
    elif kind is int:
        if value >= 0:
            if value.bit_length() > MAX_INT_BITS:
                raise EncodingError("integer too large")
            out.append(T_UINT)
            out += encode_uvarint(value)
        else:
            if (-1 - value).bit_length() > MAX_INT_BITS:
                raise EncodingError("integer too large")
            out.append(T_NEGINT)
            out += encode_uvarint(-1 - value)
    elif kind is bytes or kind is bytearray or kind is memoryview:
        out.append(T_BYTES)
        out += encode_uvarint(len(value))
        out += value
    elif kind is dict:
        out.append(T_MAP)
        out += encode_uvarint(len(value))
        items: list[tuple[bytes, Any]] = []
        for key, item in value.items():
            if type(key) is not str:
                raise EncodingError(f"map keys must be str, got {type(key).__name__}")
            items.append((key.encode("utf-8"), item))
        items.sort(key=lambda pair: pair[0])
        for raw_key, item in items:
            out += encode_uvarint(len(raw_key))
            out += raw_key
            _encode_item(out, item, depth + 1)
    elif kind is list or kind is tuple:
        out.append(T_LIST)
        out += encode_uvarint(len(value))
        for item in value:
            _encode_item(out, item, depth + 1)
    elif value is None:
        out.append(T_NULL)
    elif value is True:
        out.append(T_TRUE)
    elif value is False:
        out.append(T_FALSE)
    else:
        raise EncodingError(f"cannot encode {type(value).__name__}")


def _encode_item(out: bytearray, item: Any, depth: int) -> None:
    """Container element: short text/bytes and small ints inline (the hot path), else recurse."""
    kind = type(item)
    if kind is str:
        raw = item.encode("utf-8")
        if len(raw) < 128:
            out.append(T_TEXT)
            out.append(len(raw))
            out += raw
            return
    elif kind is bytes:
        if len(item) < 128:
            out.append(T_BYTES)
            out.append(len(item))
            out += item
            return
    elif kind is int:
        if 0 <= item < 128:
            out.append(T_UINT)
            out.append(item)
            return
    _encode_into(out, item, depth)


def decode(data: bytes | bytearray | memoryview, max_size: int = DEFAULT_MAX_SIZE) -> Any:
    """Decode one value that must span all of ``data``; raises EncodingError otherwise."""
    if type(data) is not bytes:
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        else:
            raise EncodingError("input must be bytes")
    if len(data) > max_size:
        raise EncodingError(f"input of {len(data)} bytes exceeds the limit of {max_size}")
    try:
        value, pos = _decode_at(data, 0, 0)
    except IndexError:
        raise EncodingError("input truncated") from None
    if pos != len(data):
        raise EncodingError(f"{len(data) - pos} trailing bytes")
    return value


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0:
                raise EncodingError("non-minimal varint")
            return result, pos
        shift += 7
        if shift > MAX_INT_BITS + 7:
            raise EncodingError("varint too long")


def _read_length(data: bytes, pos: int) -> tuple[int, int]:
    length, pos = _read_uvarint(data, pos)
    if pos + length > len(data):
        raise EncodingError("length runs past the end of input")
    return length, pos


def _decode_at(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    tag = data[pos]
    pos += 1
    if tag == T_UINT:
        value, pos = _read_uvarint(data, pos)
        if value.bit_length() > MAX_INT_BITS:
            raise EncodingError("integer too large")
        return value, pos
    if tag == T_TEXT:
        length, pos = _read_length(data, pos)
        end = pos + length
        try:
            return data[pos:end].decode("utf-8"), end
        except UnicodeDecodeError:
            raise EncodingError("invalid utf-8 text") from None
    if tag == T_BYTES:
        length, pos = _read_length(data, pos)
        end = pos + length
        return data[pos:end], end
    if tag == T_MAP or tag == T_LIST:
        if depth >= MAX_DEPTH:
            raise EncodingError("value nested too deeply")
        count, pos = _read_uvarint(data, pos)
        if count > len(data) - pos:
            raise EncodingError("element count exceeds input size")
        end_of_data = len(data)
        if tag == T_LIST:
            items: list[Any] = []
            for _ in range(count):
                item_tag = data[pos]
                if item_tag == T_BYTES or item_tag == T_TEXT:  # inline fast path: short text/bytes
                    length = data[pos + 1]
                    end = pos + 2 + length
                    if length < 0x80 and end <= end_of_data:
                        if item_tag == T_BYTES:
                            items.append(data[pos + 2:end])
                            pos = end
                            continue
                        try:
                            items.append(data[pos + 2:end].decode("utf-8"))
                        except UnicodeDecodeError:
                            raise EncodingError("invalid utf-8 text") from None
                        pos = end
                        continue
                elif item_tag == T_UINT and data[pos + 1] < 0x80:
                    items.append(data[pos + 1])
                    pos += 2
                    continue
                item, pos = _decode_at(data, pos, depth + 1)
                items.append(item)
            return items, pos
        mapping: dict[str, Any] = {}
        previous = None
        for _ in range(count):
            length, pos = _read_length(data, pos)
            end = pos + length
            raw_key = data[pos:end]
            if previous is not None and raw_key <= previous:
                raise EncodingError("map keys not strictly sorted")
            previous = raw_key
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                raise EncodingError("invalid utf-8 map key") from None
            mapping[key], pos = _decode_at(data, end, depth + 1)
        return mapping, pos
    if tag == T_NEGINT:
        value, pos = _read_uvarint(data, pos)
        if value.bit_length() > MAX_INT_BITS:
            raise EncodingError("integer too large")
        return -1 - value, pos
    if tag == T_NULL:
        return None, pos
    if tag == T_FALSE:
        return False, pos
    if tag == T_TRUE:
        return True, pos
    raise EncodingError(f"unknown tag 0x{tag:02x}")
