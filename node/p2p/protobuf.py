"""Minimal protobuf wire-format helpers for the few libp2p messages we speak.

Encodes varint and length-delimited fields and decodes a message into a list of
``(field_number, wire_type, value)``; malformed input raises ``ProtobufError``. Messages are
small (identify, noise payloads), so this favours strictness over speed.
"""
from __future__ import annotations

from collections.abc import Iterable

from .errors import DecodeError
from .varint import VarintError, decode_uvarint_complete, encode_uvarint

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_FIXED32 = 5


class ProtobufError(DecodeError):
    """Bytes are not a well-formed protobuf message."""


def field_varint(number: int, value: int) -> bytes:
    return encode_uvarint(number << 3 | WIRE_VARINT) + encode_uvarint(value)


def field_bytes(number: int, value: bytes) -> bytes:
    return encode_uvarint(number << 3 | WIRE_LEN) + encode_uvarint(len(value)) + value


def field_strings(number: int, values: Iterable[str]) -> bytes:
    return b"".join(field_bytes(number, v.encode()) for v in values)


def decode_fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """Split a message into its fields; unknown field numbers are kept for the caller to ignore."""
    fields: list[tuple[int, int, int | bytes]] = []
    pos = 0
    end = len(data)
    try:
        while pos < end:
            key, pos = decode_uvarint_complete(data, pos)
            number, wire_type = key >> 3, key & 7
            if number == 0:
                raise ProtobufError("field number 0")
            if wire_type == WIRE_VARINT:
                value, pos = decode_uvarint_complete(data, pos)
                fields.append((number, wire_type, value))
            elif wire_type == WIRE_LEN:
                length, pos = decode_uvarint_complete(data, pos)
                if pos + length > end:
                    raise ProtobufError("length-delimited field runs past the end")
                fields.append((number, wire_type, bytes(data[pos:pos + length])))
                pos += length
            elif wire_type in (WIRE_FIXED64, WIRE_FIXED32):
                size = 8 if wire_type == WIRE_FIXED64 else 4
                if pos + size > end:
                    raise ProtobufError("fixed-size field runs past the end")
                fields.append((number, wire_type, int.from_bytes(data[pos:pos + size], "little")))
                pos += size
            else:
                raise ProtobufError(f"unsupported wire type {wire_type}")
    except VarintError as exc:
        raise ProtobufError(f"bad varint: {exc}") from exc
    return fields


def bytes_fields(fields: list[tuple[int, int, int | bytes]], number: int) -> list[bytes]:
    """All values of a length-delimited field (repeated fields keep their order)."""
    out: list[bytes] = []
    for num, wire_type, value in fields:
        if num == number:
            if wire_type != WIRE_LEN or not isinstance(value, bytes):
                raise ProtobufError(f"field {number} has wire type {wire_type}, expected bytes")
            out.append(value)
    return out


def single_bytes_field(fields: list[tuple[int, int, int | bytes]], number: int) -> bytes | None:
    """The last value of a singular bytes field (protobuf's last-one-wins rule), or None."""
    values = bytes_fields(fields, number)
    return values[-1] if values else None
