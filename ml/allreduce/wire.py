"""All-reduce frames on the wire: a fixed header, a small JSON meta block, then the payload.

Header (big-endian, 30 bytes): version u8, kind u8, round u64, attempt u32, slot u32, chunk u32,
meta length u32, payload length u32. `slot` names the shard (butterfly) or the ring step; `chunk`
the piece of it. An outgoing payload may be a tuple of buffers (e.g. a codec header and a view of a tensor), written
in order without being joined. Parsing is pure (no I/O) and strict: unknown versions or kinds, oversized meta or
payload, and undecodable meta raise `FrameError`; `read_frame` applies it to a stream.
"""
from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .transport import Stream

VERSION = 1
HEADER = struct.Struct(">BBQIIIII")
HEADER_SIZE = HEADER.size
MAX_META_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024


class Kind(enum.IntEnum):
    PART = 1       # a contribution chunk, sent to the reducer of its shard (or the next ring peer)
    RESULT = 2     # a reduced chunk, sent by its reducer to everyone (or forwarded along the ring)
    VIEW = 3       # "this attempt failed for me; these are the members I still consider alive"
    COMMITTED = 4  # the final result of a round, pushed to a peer that is still trying it
    PING = 5       # "still alive in this attempt", sent to members this peer has no data for now


class FrameError(ValueError):
    """A frame that breaks the wire format: the sender is faulty and its stream is dropped."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    round_id: int
    attempt: int
    slot: int
    chunk: int
    meta: dict[str, Any] = field(default_factory=dict)
    payload: bytes | memoryview | tuple[Any, ...] = b""  # received: bytes; outgoing: also byte views, in parts
    received_at: float = 0.0  # loop time the frame arrived (set by the inbox)


@dataclass(frozen=True)
class Header:
    kind: Kind
    round_id: int
    attempt: int
    slot: int
    chunk: int
    meta_len: int
    payload_len: int


def received_bytes(frame: Frame) -> bytes | memoryview:
    """The payload of a frame read from the wire (one buffer: never the tuple an outgoing frame may hold)."""
    assert not isinstance(frame.payload, tuple)
    return frame.payload


def payload_parts(payload: bytes | memoryview | tuple[Any, ...]) -> list[bytes | memoryview]:
    """A payload as its non-empty byte buffers (one-byte items, so len() is the size)."""
    parts = payload if isinstance(payload, tuple) else (payload,)
    return [p for p in parts if len(p)]


def encode_frame(frame: Frame) -> list[bytes | memoryview]:
    """The frame as buffers to write in order (the payload is not copied)."""
    meta = json.dumps(frame.meta, separators=(",", ":")).encode() if frame.meta else b""
    if len(meta) > MAX_META_BYTES:
        raise FrameError(f"meta of {len(meta)} bytes exceeds {MAX_META_BYTES}")
    parts = payload_parts(frame.payload)
    header = HEADER.pack(VERSION, int(frame.kind), frame.round_id, frame.attempt, frame.slot,
                         frame.chunk, len(meta), sum(len(p) for p in parts))
    return [header + meta, *parts]


def parse_header(data: bytes | memoryview, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Header:
    if len(data) != HEADER_SIZE:
        raise FrameError(f"header is {len(data)} bytes, expected {HEADER_SIZE}")
    version, kind, round_id, attempt, slot, chunk, meta_len, payload_len = HEADER.unpack(data)
    if version != VERSION:
        raise FrameError(f"unknown frame version {version}")
    try:
        kind = Kind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind}") from None
    if meta_len > MAX_META_BYTES:
        raise FrameError(f"meta of {meta_len} bytes exceeds {MAX_META_BYTES}")
    if payload_len > max_payload:
        raise FrameError(f"oversized payload: {payload_len} bytes exceeds {max_payload}")
    return Header(kind, round_id, attempt, slot, chunk, meta_len, payload_len)


def parse_meta(data: bytes | memoryview) -> dict[str, Any]:
    if not data:
        return {}
    try:
        meta = json.loads(bytes(data))   # a bytes object as is; the transports return meta as bytes
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"undecodable meta: {exc}") from None
    except RecursionError:  # "[[[[..." within MAX_META_BYTES
        raise FrameError("meta nested too deeply") from None
    if not isinstance(meta, dict):
        raise FrameError("meta must be a JSON object")
    return meta


async def read_frame(stream: Stream, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """Read one frame; IncompleteReadError at a clean end of stream, FrameError on bad input."""
    header = parse_header(await stream.readexactly(HEADER_SIZE), max_payload)
    meta = parse_meta(await stream.readexactly(header.meta_len)) if header.meta_len else {}
    payload = await stream.readexactly(header.payload_len) if header.payload_len else b""
    return Frame(header.kind, header.round_id, header.attempt, header.slot, header.chunk, meta, payload)


def members_mask(members: list[str], universe: list[str]) -> list[int]:
    """Members as sorted indices into the group's peer list (compact and order-free)."""
    index = {peer: i for i, peer in enumerate(universe)}
    return sorted(index[m] for m in members)


def members_from_mask(mask: object, universe: list[str]) -> list[str]:
    """Inverse of `members_mask`; FrameError for anything that is not a list of valid indices."""
    if not isinstance(mask, list) or not all(isinstance(i, int) and 0 <= i < len(universe) for i in mask):
        raise FrameError("bad member list in meta")
    return sorted({universe[i] for i in mask})
