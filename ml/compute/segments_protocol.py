"""The verifiers' requests to a worker for what stands behind its commitment.

`/dekube/task-segments/3` (docs/adr/0167, 0230): request = the 32-byte task id, a 4-byte big-endian
segment index and a 4-byte big-endian segment count: the commitment the proof is asked under (an
epoch's progress commitment covers the records up to it, the result all of them); response = a 4-byte
big-endian length, then UTF-8 JSON {"record": SegmentRecord, "proof": [hex, ...], "count": n} (the
record, its Merkle audit path and the worker's leaf count under that commitment) or {"error": text}.
Responses over MAX_RESPONSE bytes, malformed ones, or a record for another index raise SegmentsError;
`check_answer` verifies the proof against the worker's on-chain segments_root and segment count.
`make_record_handler`/`fetch_record` are the thin stream drivers.
"""
from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ml.compute.segment_record import MAX_PROOF, MAX_SEGMENTS, BadRecord, SegmentRecord, leaf, verify_proof
from node.p2p.errors import ProtocolError

TASK_ID_BYTES = 32
TIMEOUT_S = 10.0


class SegmentsError(ValueError):
    """A malformed, oversized or negative answer to a segments request."""


PROTOCOL = "/dekube/task-segments/3"
REQUEST_BYTES = TASK_ID_BYTES + 8
MAX_RESPONSE = 8 << 20


@dataclass(frozen=True)
class SegmentAnswer:
    record: SegmentRecord
    proof: list[bytes]
    count: int


def encode_request(task_id: bytes, index: int, segments: int) -> bytes:
    if len(task_id) != TASK_ID_BYTES or not 0 <= index < segments <= MAX_SEGMENTS:
        raise ValueError("a request names a 32-byte task id, a segment index and a count above it, at most 2^20")
    return task_id + struct.pack(">II", index, segments)


def decode_request(data: bytes) -> tuple[bytes, int, int]:
    """(task id, segment index, segment count of the commitment asked under)."""
    if len(data) != REQUEST_BYTES:
        raise SegmentsError(f"a segment request is {REQUEST_BYTES} bytes")
    index, segments = struct.unpack(">II", data[TASK_ID_BYTES:])
    if not index < segments <= MAX_SEGMENTS:
        raise SegmentsError("a segment request's index must lie below its count, at most 2^20")
    return data[:TASK_ID_BYTES], index, segments


def encode_answer(answer: SegmentAnswer | None, error: str = "") -> bytes:
    doc = ({"error": error[:500] or "no such segment"} if answer is None else
           {"record": answer.record.to_obj(), "proof": [p.hex() for p in answer.proof], "count": answer.count})
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    if len(body) > MAX_RESPONSE:
        raise SegmentsError(f"response of {len(body)} bytes exceeds {MAX_RESPONSE}")
    return struct.pack(">I", len(body)) + body


def decode_answer(body: bytes, index: int) -> SegmentAnswer:
    """The worker's answer for segment `index` from a response body; SegmentsError if malformed."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SegmentsError("response is not JSON") from None
    if not isinstance(doc, dict):
        raise SegmentsError("response is not a JSON object")
    if "error" in doc:
        raise SegmentsError(f"worker answered: {str(doc['error'])[:200]}")
    if set(doc) != {"record", "proof", "count"}:
        raise SegmentsError("response must hold exactly record, proof and count")
    count, proof = doc["count"], doc["proof"]
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SEGMENTS:
        raise SegmentsError("count must be an integer in [1, 2^20]")
    if not isinstance(proof, list) or len(proof) > MAX_PROOF or not all(
            isinstance(p, str) and len(p) == 64 for p in proof):
        raise SegmentsError(f"proof must be at most {MAX_PROOF} 32-byte hex hashes")
    try:
        path = [bytes.fromhex(p) for p in proof]
        record = SegmentRecord.from_obj(doc["record"])
    except (ValueError, BadRecord) as exc:
        raise SegmentsError(f"bad record or proof: {exc}") from None
    if record.index != index:
        raise SegmentsError(f"asked for segment {index}, got a record of segment {record.index}")
    return SegmentAnswer(record, path, count)


def check_answer(answer: SegmentAnswer, task_id: bytes, worker: str, segments_root: bytes, segments: int,
                 first: int = 0) -> None:
    """BadRecord unless `answer` is `worker`'s record under its committed `segments_root`, which covers its
    segments `first` (0, or a joiner's first, docs/adr/0226) up to `segments`."""
    if answer.count != segments - first:
        raise BadRecord(f"the worker answers with {answer.count} segments, it committed {segments - first}")
    if not first <= answer.record.index < segments:
        raise BadRecord(f"segment {answer.record.index} is not one the worker committed ({first} to {segments - 1})")
    if not verify_proof(segments_root, leaf(task_id, worker, answer.record), answer.record.index - first,
                        answer.count, answer.proof):
        raise BadRecord("the record's Merkle proof does not lead to the committed segments_root")


def make_record_handler(lookup: Callable[[bytes, int, int], SegmentAnswer | None]):
    """A Host stream handler for PROTOCOL answering from `lookup(task_id, index, segments)`."""

    async def serve_record(stream) -> None:
        try:
            task_id, index, segments = decode_request(await asyncio.wait_for(stream.readexactly(REQUEST_BYTES),
                                                                             TIMEOUT_S))
        except (TimeoutError, asyncio.IncompleteReadError, SegmentsError):
            stream.reset()
            return
        answer = lookup(task_id, index, segments)
        error = "" if answer is not None else f"no record of segment {index} of task {task_id.hex()}"
        await stream.write(encode_answer(answer, error))
        await stream.close()

    return serve_record


async def fetch_record(host, peer_id: str, task_id: bytes, index: int, segments: int,
                       timeout_s: float = TIMEOUT_S) -> SegmentAnswer:
    """Ask `peer_id` for its record of segment `index` of `task_id` under its commitment of `segments`
    segments (check it with `check_answer`)."""
    request = encode_request(task_id, index, segments)

    async def exchange():
        stream = await host.open_stream(peer_id, PROTOCOL)
        try:
            await stream.write(request)
            (length,) = struct.unpack(">I", await stream.readexactly(4))
            if length > MAX_RESPONSE:
                raise SegmentsError(f"response of {length} bytes exceeds {MAX_RESPONSE}")
            return decode_answer(await stream.readexactly(length), index)
        finally:
            await stream.close()

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError) as exc:
        raise SegmentsError(f"no answer from {peer_id}: {exc!r}") from None
