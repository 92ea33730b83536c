"""Messages of ``/dekube/artifact/1.0.0`` and their codec (pure; no I/O).

Every message is a frame: u32 big-endian length of what follows, one type byte, the body.
  GET_MANIFEST  id (32 bytes)                       -> MANIFEST or ERROR
  MANIFEST      the encoded manifest (manifest.py)
  GET_CHUNKS    id (32) start (u32) count (u32)     -> for each index in order: CHUNK or NO_CHUNK
  CHUNK         index (u32) then the chunk's bytes
  NO_CHUNK      index (u32): the holder lacks that chunk (a partial holder, or one found corrupt)
  ERROR         code (u8) then UTF-8 text (at most 512 bytes): not found, busy, bad request
A requester may send several GET_CHUNKS before the answers come (pipelining); the holder answers
them in order. A frame longer than the reader's limit, an unknown type or a body of the wrong
shape is a ``ProtocolViolation``: the reader closes the stream (a holder that sent it is dropped).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .merkle import CHUNK_SIZE, HASH_BYTES

PROTOCOL = "/dekube/artifact/1.0.0"
HEADER_BYTES = 5
GET_MANIFEST, MANIFEST, GET_CHUNKS, CHUNK, NO_CHUNK, ERROR = range(1, 7)
NOT_FOUND, BUSY, BAD_REQUEST = 1, 2, 3
MAX_ERROR_TEXT = 512
MAX_REQUEST_BYTES = HEADER_BYTES + HASH_BYTES + 8   # the largest message a holder accepts
_U32 = struct.Struct(">I")
_RANGE = struct.Struct(">32sII")


class ProtocolViolation(ValueError):
    """A frame that breaks the protocol (oversized, unknown type, malformed body)."""


@dataclass(frozen=True)
class GetManifest:
    artifact: str


@dataclass(frozen=True)
class ManifestMsg:
    data: bytes


@dataclass(frozen=True)
class GetChunks:
    artifact: str
    start: int
    count: int


@dataclass(frozen=True)
class Chunk:
    index: int
    data: bytes


@dataclass(frozen=True)
class NoChunk:
    index: int


@dataclass(frozen=True)
class Error:
    code: int
    text: str


Message = GetManifest | ManifestMsg | GetChunks | Chunk | NoChunk | Error


def max_response_bytes(max_manifest: int) -> int:
    """The largest frame a requester accepts: a whole chunk or the largest allowed manifest."""
    return HEADER_BYTES + max(4 + CHUNK_SIZE, max_manifest)


def _frame(kind: int, body: bytes) -> bytes:
    return _U32.pack(len(body) + 1) + bytes([kind]) + body


def encode(message: Message) -> bytes:
    match message:
        case GetManifest(artifact):
            return _frame(GET_MANIFEST, bytes.fromhex(artifact))
        case ManifestMsg(data):
            return _frame(MANIFEST, data)
        case GetChunks(artifact, start, count):
            return _frame(GET_CHUNKS, _RANGE.pack(bytes.fromhex(artifact), start, count))
        case Chunk(index, data):
            return _frame(CHUNK, _U32.pack(index) + data)
        case NoChunk(index):
            return _frame(NO_CHUNK, _U32.pack(index))
        case Error(code, text):
            return _frame(ERROR, bytes([code]) + text.encode()[:MAX_ERROR_TEXT])
    raise TypeError(f"not an artifact protocol message: {message!r}")


def chunk_header(index: int, length: int) -> bytes:
    """The frame header and index of a CHUNK message of ``length`` data bytes (to write the data
    after it without copying)."""
    return _U32.pack(length + 5) + bytes([CHUNK]) + _U32.pack(index)


def decode_header(header: bytes, max_frame: int) -> tuple[int, int]:
    """(type, body length) from a frame's first 5 bytes; ProtocolViolation if over ``max_frame``."""
    if len(header) != HEADER_BYTES:
        raise ProtocolViolation("short frame header")
    (length,) = _U32.unpack_from(header)
    if length < 1:
        raise ProtocolViolation("empty frame")
    if length + 4 > max_frame:
        raise ProtocolViolation(f"frame of {length + 4} bytes exceeds the limit of {max_frame}")
    kind = header[4]
    if not GET_MANIFEST <= kind <= ERROR:
        raise ProtocolViolation(f"unknown message type {kind}")
    return kind, length - 1


def decode_body(kind: int, body: bytes) -> Message:
    """The message of type ``kind`` with ``body``; ProtocolViolation if its shape is wrong."""
    if kind == GET_MANIFEST:
        if len(body) != HASH_BYTES:
            raise ProtocolViolation("GET_MANIFEST needs a 32-byte id")
        return GetManifest(body.hex())
    if kind == MANIFEST:
        return ManifestMsg(bytes(body))
    if kind == GET_CHUNKS:
        if len(body) != _RANGE.size:
            raise ProtocolViolation("GET_CHUNKS needs an id, a start and a count")
        raw, start, count = _RANGE.unpack(body)
        return GetChunks(raw.hex(), start, count)
    if kind == CHUNK:
        if len(body) < 4:
            raise ProtocolViolation("CHUNK without an index")
        return Chunk(_U32.unpack_from(body)[0], bytes(body[4:]))
    if kind == NO_CHUNK:
        if len(body) != 4:
            raise ProtocolViolation("NO_CHUNK needs exactly an index")
        return NoChunk(_U32.unpack(body)[0])
    if kind == ERROR:
        if not 1 <= len(body) <= 1 + MAX_ERROR_TEXT:
            raise ProtocolViolation("ERROR needs a code and at most 512 bytes of text")
        return Error(body[0], bytes(body[1:]).decode("utf-8", "replace"))
    raise ProtocolViolation(f"unknown message type {kind}")


def decode(frame: bytes, max_frame: int) -> Message:
    """One whole frame (header and body) decoded; ProtocolViolation if it is not exactly one."""
    kind, length = decode_header(frame[:HEADER_BYTES], max_frame)
    if len(frame) != HEADER_BYTES + length:
        raise ProtocolViolation("frame length does not match its header")
    return decode_body(kind, frame[HEADER_BYTES:])
