"""`/dekube/task-segments/1`: a verifier asks a worker for the segment hashes behind its commitment.

Request: the 32-byte task id. Response: a 4-byte big-endian length, then UTF-8 JSON
{"segments": [hex, ...], "params_hash": hex, "short_rounds": [[round, [peer, ...]], ...]} (rounds
whose mean lacked some workers, so the verifier replays those departures), or {"error": text} when
the worker has no result for that task. Frames over MAX_RESPONSE bytes or anything malformed raise
SegmentsError; the verifier checks the list against the Merkle root on chain itself, so a worker
cannot answer with hashes other than the ones it committed to. Encoding/decoding is pure;
`serve_segments`/`fetch_segments` are the thin stream drivers.
"""
from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from node.p2p.errors import ProtocolError

PROTOCOL = "/dekube/task-segments/1"
TASK_ID_BYTES = 32
MAX_RESPONSE = 1 << 20
TIMEOUT_S = 10.0


class SegmentsError(ValueError):
    """A malformed, oversized or negative answer to a segments request."""


@dataclass(frozen=True)
class SegmentReport:
    segments: list[str]
    params_hash: str
    short_rounds: list = field(default_factory=list)   # [[round, [participant, ...]], ...]


def encode_response(doc: dict) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_RESPONSE:
        raise SegmentsError(f"response of {len(body)} bytes exceeds {MAX_RESPONSE}")
    return struct.pack(">I", len(body)) + body


def decode_response_length(header: bytes) -> int:
    (length,) = struct.unpack(">I", header)
    if length > MAX_RESPONSE:
        raise SegmentsError(f"response of {length} bytes exceeds {MAX_RESPONSE}")
    return length


def decode_response(body: bytes) -> SegmentReport:
    """The worker's report from a response body; SegmentsError if malformed or an error."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deeply
        raise SegmentsError("response is not JSON") from None
    if not isinstance(doc, dict):
        raise SegmentsError("response is not a JSON object")
    if "error" in doc:
        raise SegmentsError(f"worker answered: {str(doc['error'])[:200]}")
    segments, params_hash, short_rounds = doc.get("segments"), doc.get("params_hash"), doc.get("short_rounds", [])
    if (not isinstance(segments, list) or not all(isinstance(s, str) for s in segments)
            or not isinstance(params_hash, str)):
        raise SegmentsError("response lacks segments (list of text) or params_hash (text)")
    if not isinstance(short_rounds, list) or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], int) and isinstance(r[1], list)
            and all(isinstance(p, str) for p in r[1]) for r in short_rounds):
        raise SegmentsError("short_rounds must be a list of [round, [peer id, ...]]")
    return SegmentReport(segments, params_hash, short_rounds)


def make_handler(lookup: Callable[[bytes], dict | None]):
    """A Host stream handler answering from `lookup(task_id) -> {"segments", "params_hash",
    "short_rounds"} | None`."""

    async def serve_segments(stream) -> None:
        try:
            task_id = await asyncio.wait_for(stream.readexactly(TASK_ID_BYTES), TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            stream.reset()
            return
        result = lookup(task_id)
        doc = ({"error": f"no result for task {task_id.hex()}"} if result is None else
               {"segments": result["segments"], "params_hash": result["params_hash"],
                "short_rounds": result.get("short_rounds", [])})
        await stream.write(encode_response(doc))
        await stream.close()

    return serve_segments


async def fetch_segments(host, peer_id: str, task_id: bytes) -> SegmentReport:
    """Ask `peer_id` for its segment hashes of `task_id` over the Host."""
    if len(task_id) != TASK_ID_BYTES:
        raise ValueError("a task id is 32 bytes")

    async def exchange():
        stream = await host.open_stream(peer_id, PROTOCOL)
        try:
            await stream.write(task_id)
            length = decode_response_length(await stream.readexactly(4))
            return decode_response(await stream.readexactly(length))
        finally:
            await stream.close()

    try:
        return await asyncio.wait_for(exchange(), TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError) as exc:
        raise SegmentsError(f"no answer from {peer_id}: {exc!r}") from None
