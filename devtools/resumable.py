"""Resumable bulk transfer: a transfer cut mid-way resumes over a new stream from the receiver's offset.

Protocol ``/dekube/resumable/2.0.0``, one stream per attempt: the sender sends a length-prefixed
header ``encode({"id": 16 bytes, "size": n})``; the receiver answers its current offset (8 bytes,
big-endian: everything before it is held); the sender streams ``data[offset:]`` and half-closes.
While bytes arrive the receiver reports its offset (8 bytes): first after ``FIRST_REPORT_S``, then at
most every ``REPORT_INTERVAL_S``; it reports ``size`` once it holds everything. A new attempt for a
transfer resets the previous attempt's stream, so a stalled path never races a fresh one.
``send_resumable`` takes a callable that opens a stream over whatever path works now (the relay
client's failover picks another relay), so a transfer survives a relay's death; an attempt whose
receiver reports no progress for the ``StallTimer``'s allowance (adaptive, ``devtools/stall.py``) is
abandoned, so a relay that goes silent costs about a second on a fast link while a slow live link is
not given up.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from consensus.encoding import decode, encode
from devtools.stall import FixedStall, StallTimer
from node.p2p.errors import ProtocolError
from relay.messages import MessageReader, RelayMessageError, frame

RESUMABLE_PROTOCOL = "/dekube/resumable/2.0.0"
WRITE_CHUNK = 1 << 20
HEADER_TIMEOUT_S = 10.0    # the receiver waits this long for a transfer header
REPORT_INTERVAL_S = 0.25   # the receiver reports progress at most this often...
FIRST_REPORT_S = 0.05      # ...after a first report this soon, so the sender's stall timer learns early
log = logging.getLogger(__name__)


class TransferError(ProtocolError):
    """A resumable transfer header or answer is malformed, too large, or the transfer gave up."""


@dataclass
class IncomingTransfer:
    size: int
    data: bytearray = field(default_factory=bytearray)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    stream: object | None = None
    handler: asyncio.Task | None = None


class ResumableReceiver:
    """Receives transfers into memory; register ``serve`` as the RESUMABLE_PROTOCOL handler."""

    def __init__(self, max_size: int = 1 << 30, max_transfers: int = 64) -> None:
        self.max_size = max_size
        self.max_transfers = max_transfers
        self.transfers: dict[bytes, IncomingTransfer] = {}
        self.attempts = 0

    async def wait(self, transfer_id: bytes) -> bytes:
        """The complete data of ``transfer_id`` (waits for a transfer already announced); the
        receiver forgets the transfer once it has handed the data over."""
        transfer = self.transfers[transfer_id]
        await transfer.done.wait()
        del self.transfers[transfer_id]
        return bytes(transfer.data)

    async def serve(self, stream) -> None:
        reader = MessageReader(256)
        async with asyncio.timeout(HEADER_TIMEOUT_S):
            while True:
                chunk = await stream.read()
                if not chunk:
                    raise TransferError("stream ended before the transfer header")
                body = reader.feed(chunk)
                if body is not None:
                    break
        transfer_id, size = _decode_header(body)
        if size > self.max_size:
            raise TransferError(f"transfer of {size} bytes exceeds {self.max_size}")
        transfer = self.transfers.get(transfer_id)
        if transfer is None:
            if len(self.transfers) >= self.max_transfers:
                raise TransferError("too many transfers")
            transfer = self.transfers[transfer_id] = IncomingTransfer(size)
        elif transfer.size != size:
            raise TransferError("transfer resumed with another size")
        await self._preempt(transfer)
        transfer.stream = stream
        transfer.handler = asyncio.current_task()
        self.attempts += 1
        await stream.write(len(transfer.data).to_bytes(8, "big"))
        start = reported = len(transfer.data)
        reported_at = time.monotonic()
        rest = reader.take_rest()
        while True:
            if rest:
                if len(transfer.data) + len(rest) > size:
                    raise TransferError("sender sent more than the transfer size")
                transfer.data += rest
            if len(transfer.data) == size:
                break
            interval = REPORT_INTERVAL_S if reported > start else FIRST_REPORT_S
            if len(transfer.data) > reported and time.monotonic() - reported_at >= interval:
                reported, reported_at = len(transfer.data), time.monotonic()
                await stream.write(reported.to_bytes(8, "big"))
            rest = await stream.read()
            if not rest:
                raise TransferError(f"stream ended at {len(transfer.data)} of {size} bytes")
        transfer.done.set()
        await stream.write(size.to_bytes(8, "big"))
        await stream.close()

    @staticmethod
    async def _preempt(transfer: IncomingTransfer) -> None:
        old, handler = transfer.stream, transfer.handler
        if old is not None and handler is not None and not handler.done():
            old.reset()
            with contextlib.suppress(BaseException):
                await handler


def _decode_header(body: bytes) -> tuple[bytes, int]:
    try:
        header = decode(body, max_size=256)
    except ValueError as exc:
        raise TransferError(f"malformed transfer header: {exc}") from exc
    if (not isinstance(header, dict) or set(header) != {"id", "size"} or not isinstance(header["id"], bytes)
            or len(header["id"]) != 16 or not isinstance(header["size"], int) or header["size"] < 0):
        raise TransferError("transfer header needs a 16-byte id and a size")
    return header["id"], header["size"]


async def _read_offset(stream, timeout: float) -> int:
    async with asyncio.timeout(timeout):
        raw = await stream.readexactly(8)
    return int.from_bytes(raw, "big")


async def _write_from(stream, view: memoryview, start: int) -> None:
    for pos in range(start, len(view), WRITE_CHUNK):
        await stream.write(view[pos:pos + WRITE_CHUNK])
    await stream.close()


async def _await_completion(stream, size: int, offset: int, stall) -> None:
    """Read the receiver's progress reports until it holds ``size`` bytes; TimeoutError when none
    comes within the stall allowance, TransferError on a report that goes backwards or too far."""
    last = time.monotonic()
    while offset < size:
        try:
            reported = await _read_offset(stream, stall.timeout)
        except TimeoutError:
            raise TimeoutError(f"no progress for {stall.timeout:.2f} s at {offset} of {size} bytes") from None
        if not offset <= reported <= size:
            raise TransferError(f"receiver reported offset {reported} after {offset} (size {size})")
        now = time.monotonic()
        stall.observe(now - last)
        last, offset = now, reported


async def _attempt(stream, transfer_id: bytes, view: memoryview, starts: list[int], stall) -> None:
    """One attempt (appends the receiver's starting offset to ``starts``); raises if the path fails."""
    await stream.write(frame(encode({"id": transfer_id, "size": len(view)})))
    start = await _read_offset(stream, stall.timeout)
    starts.append(start)
    if start > len(view):
        raise TransferError(f"receiver claims offset {start} beyond {len(view)}")
    writer = asyncio.ensure_future(_write_from(stream, view, start))
    reader = asyncio.ensure_future(_await_completion(stream, len(view), start, stall))
    try:
        done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # raises the failure, if any
        await writer
        await reader  # everything written: the receiver reports when it holds it all
    finally:
        for task in (writer, reader):
            task.cancel()
        await asyncio.gather(writer, reader, return_exceptions=True)


async def send_resumable(open_stream: Callable[[], Awaitable[object]], transfer_id: bytes, data,
                         *, attempts: int = 5, retry_delay: float = 0.05,
                         stall_timeout: float | None = None) -> list[int]:
    """Send ``data`` completely, reopening a stream after each failure; returns the offsets the
    receiver reported at the start of each attempt that got that far (resumes = len - 1).

    An attempt whose receiver reports no progress for the stall allowance (a path whose packets
    vanish rather than reset) is abandoned like a failed one. The allowance adapts to the gaps
    between progress reports (``StallTimer``: 2 s until the first, then within 1-10 s) and is
    carried over to the next attempt; ``stall_timeout`` fixes it instead."""
    view = memoryview(data).cast("B")
    stall = StallTimer() if stall_timeout is None else FixedStall(stall_timeout)
    starts: list[int] = []
    last_error: BaseException | None = None
    for _ in range(attempts):
        stream = None
        try:
            stream = await open_stream()
            await _attempt(stream, transfer_id, view, starts, stall)
            return starts
        except (ConnectionError, ProtocolError, TimeoutError, OSError, asyncio.IncompleteReadError,
                RelayMessageError) as exc:
            last_error = exc
            log.info("resumable transfer attempt failed: %r; retrying", exc)
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.reset()
            await asyncio.sleep(retry_delay)
    raise TransferError(f"transfer gave up after {attempts} attempts: {last_error!r}")
