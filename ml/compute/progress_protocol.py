"""`/dekube/task-progress/1.0.0`: a task's owner (or anyone) follows a worker's share of it live.

The asker opens a stream to a worker and sends one frame {"task_id": hex}; the worker answers with
a frame per change of its job (coalesced, at most ~4 a second, and one at least every 15 s),
{"state", "step", "steps", "loss", "metrics", "bytes_sent", "eta_s", ...}, the first one also with
"history" (the job's recent per-step loss/eval list), and closes the stream after the frame with a
terminal state ("committed", "failed", "rejected"). A request it cannot serve (malformed, unknown
task after `JOB_WAIT_S`, too many watchers) gets one {"error": text} frame (no "state": a failed
job's snapshot has both).

Framing is sans-I/O: a frame is a 4-byte big-endian length and UTF-8 JSON object of at most
`MAX_FRAME` bytes (`encode_frame`, `FrameDecoder`); `make_handler` and `follow_progress` are the
thin stream drivers. Bad input raises ProgressError at the asker and is answered, never raised, at
the worker.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator

from ml.compute.job_board import TERMINAL, JobBoard
from node.p2p.errors import ProtocolError

PROTOCOL = "/dekube/task-progress/1.0.0"
MAX_FRAME = 64 * 1024
MAX_WATCHERS = 32
REQUEST_TIMEOUT_S = 10.0
JOB_WAIT_S = 15.0      # a watcher may ask just before the worker starts its share
IDLE_TIMEOUT_S = 60.0  # the worker sends at least every KEEPALIVE_S (15 s)
OPEN_TIMEOUT_S = 15.0
LENGTH = struct.Struct(">I")


class ProgressError(ValueError):
    """A malformed or oversized frame, an error answer, or a stream that ended before the job."""


def encode_frame(doc: dict) -> bytes:
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise ProgressError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return LENGTH.pack(len(body)) + body


class FrameDecoder:
    """Feed bytes, get the complete frames (JSON objects) they finish."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[dict]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buffer)
            if length > self._max:
                raise ProgressError(f"frame of {length} bytes exceeds {self._max}")
            if len(self._buffer) < LENGTH.size + length:
                break
            body = bytes(self._buffer[LENGTH.size:LENGTH.size + length])
            del self._buffer[:LENGTH.size + length]
            try:
                doc = json.loads(body)
            except (UnicodeDecodeError, ValueError):
                raise ProgressError("frame is not JSON") from None
            if not isinstance(doc, dict):
                raise ProgressError("frame is not a JSON object")
            frames.append(doc)
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)


def parse_request(doc: dict) -> bytes:
    """The task id a request frame asks about."""
    task_id = doc.get("task_id")
    if not isinstance(task_id, str) or len(task_id) != 64:
        raise ProgressError("request needs task_id: 32 bytes as hex")
    try:
        return bytes.fromhex(task_id)
    except ValueError:
        raise ProgressError("task_id is not hex") from None


def check_update(doc: dict) -> dict:
    """A progress frame as the asker accepts it (an error frame raises ProgressError)."""
    if "error" in doc and "state" not in doc:   # a job's own "error" comes with its state
        raise ProgressError(f"worker answered: {str(doc['error'])[:200]}")
    if not isinstance(doc.get("state"), str):
        raise ProgressError("progress frame lacks a state")
    for name in ("step", "steps", "bytes_sent"):
        if not isinstance(doc.get(name, 0), int) or isinstance(doc.get(name, 0), bool):
            raise ProgressError(f"progress frame field {name} is not an integer")
    if not isinstance(doc.get("metrics", {}), dict) or not isinstance(doc.get("history", []), list):
        raise ProgressError("progress frame metrics/history have the wrong type")
    return doc


def first_frame(snapshot: dict, history: list[dict]) -> bytes:
    """The first answer: the snapshot with as much recent history as fits in one frame."""
    while True:
        try:
            return encode_frame({**snapshot, "history": history})
        except ProgressError:
            if not history:
                raise
            history = history[len(history) // 2 + 1:]


def make_handler(board: JobBoard):
    """The worker's stream handler serving `board`'s jobs."""
    watchers = 0

    async def serve_progress(stream) -> None:
        nonlocal watchers
        decoder = FrameDecoder(max_frame=1024)
        try:
            frames: list[dict] = []
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                while not frames:
                    data = await stream.read(1024)
                    if not data:
                        raise ProgressError("stream closed before a request")
                    frames = decoder.feed(data)
            key = parse_request(frames[0]).hex()
        except (ProgressError, TimeoutError, ProtocolError, OSError) as exc:
            await _answer_error(stream, f"bad request: {exc}")
            return
        if watchers >= MAX_WATCHERS:
            await _answer_error(stream, "too many watchers, try later")
            return
        watchers += 1
        try:
            if not await board.wait_for(key, JOB_WAIT_S):
                await _answer_error(stream, f"this node has no job for task {key}")
                return
            first = True
            async for snapshot in board.watch(key):
                frame = first_frame(snapshot, board.history(key)) if first else encode_frame(snapshot)
                first = False
                await stream.write(frame)
            await stream.close()
        except (ProtocolError, OSError, ProgressError):  # the watcher went away, or a frame too big
            stream.reset()
        finally:
            watchers -= 1

    return serve_progress


async def _answer_error(stream, message: str) -> None:
    try:
        await stream.write(encode_frame({"error": message[:500]}))
        await stream.close()
    except (ProtocolError, OSError):
        stream.reset()


async def follow_progress(host, peer_id: str, task_id: bytes) -> AsyncIterator[dict]:
    """Progress of `peer_id`'s share of `task_id`, one dict per change, until its job ends (the last
    dict has a terminal state). ProgressError when the worker refuses, answers junk, goes silent
    for IDLE_TIMEOUT_S or the stream ends before the job did."""
    if len(task_id) != 32:
        raise ValueError("a task id is 32 bytes")
    try:
        stream = await asyncio.wait_for(host.open_stream(peer_id, PROTOCOL), OPEN_TIMEOUT_S)
        await stream.write(encode_frame({"task_id": task_id.hex()}))
    except (TimeoutError, ProtocolError, OSError) as exc:
        raise ProgressError(f"cannot reach {peer_id}: {exc!r}") from None
    decoder = FrameDecoder()
    try:
        while True:
            try:
                data = await asyncio.wait_for(stream.read(MAX_FRAME), IDLE_TIMEOUT_S)
            except TimeoutError:
                raise ProgressError(f"no progress from {peer_id} for {IDLE_TIMEOUT_S:g} s") from None
            except (ProtocolError, OSError) as exc:
                raise ProgressError(f"stream from {peer_id} broke: {exc!r}") from None
            if not data:
                raise ProgressError(f"{peer_id} closed the stream before the job ended")
            for doc in decoder.feed(data):
                update = check_update(doc)
                yield update
                if update["state"] in TERMINAL:
                    return
    finally:
        with contextlib.suppress(Exception):
            await stream.close()
