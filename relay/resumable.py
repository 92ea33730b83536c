"""Resumable bulk transfer: a transfer cut mid-way resumes over a new stream from the receiver's offset.

Protocol ``/dekube/resumable/1.0.0``, one stream per attempt: the sender sends a length-prefixed
header ``encode({"id": 16 bytes, "size": n})``; the receiver answers its current offset (8 bytes,
big-endian: everything before it is held); the sender streams ``data[offset:]`` and half-closes;
the receiver answers the final offset (8 bytes) once it holds all ``size`` bytes. A new attempt
for a transfer resets the previous attempt's stream, so a stalled path never races a fresh one.
``send_resumable`` takes a callable that opens a stream over whatever path works now (the relay
client's failover picks another relay), so a transfer survives a relay's death.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from consensus.encoding import decode, encode
from node.p2p.errors import ProtocolError

from .messages import MessageReader, RelayMessageError, frame

RESUMABLE_PROTOCOL = "/dekube/resumable/1.0.0"
WRITE_CHUNK = 1 << 20
STALL_TIMEOUT = 10.0  # seconds without progress before an attempt is abandoned
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
        async with asyncio.timeout(STALL_TIMEOUT):
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
        rest = reader.take_rest()
        while True:
            if rest:
                if len(transfer.data) + len(rest) > size:
                    raise TransferError("sender sent more than the transfer size")
                transfer.data += rest
            if len(transfer.data) == size:
                break
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


async def _read_offset(stream, stall_timeout: float) -> int:
    async with asyncio.timeout(stall_timeout):
        raw = await stream.readexactly(8)
    return int.from_bytes(raw, "big")


async def _attempt(stream, transfer_id: bytes, view: memoryview, starts: list[int], stall_timeout: float) -> None:
    """One attempt (appends the receiver's starting offset to ``starts``); raises if the path fails."""
    await stream.write(frame(encode({"id": transfer_id, "size": len(view)})))
    start = await _read_offset(stream, stall_timeout)
    starts.append(start)
    if start > len(view):
        raise TransferError(f"receiver claims offset {start} beyond {len(view)}")
    for pos in range(start, len(view), WRITE_CHUNK):
        async with asyncio.timeout(stall_timeout):
            await stream.write(view[pos:pos + WRITE_CHUNK])
    await stream.close()
    final = await _read_offset(stream, stall_timeout)
    if final != len(view):
        raise TransferError(f"receiver acknowledged {final} of {len(view)} bytes")


async def send_resumable(open_stream: Callable[[], Awaitable[object]], transfer_id: bytes, data,
                         *, attempts: int = 5, retry_delay: float = 0.05,
                         stall_timeout: float = STALL_TIMEOUT) -> list[int]:
    """Send ``data`` completely, reopening a stream after each failure; returns the offsets the
    receiver reported at the start of each attempt that got that far (resumes = len - 1).

    An attempt that makes no progress for ``stall_timeout`` seconds (a path whose packets vanish
    rather than reset) is abandoned like a failed one."""
    view = memoryview(data).cast("B")
    starts: list[int] = []
    last_error: BaseException | None = None
    for _ in range(attempts):
        stream = None
        try:
            stream = await open_stream()
            await _attempt(stream, transfer_id, view, starts, stall_timeout)
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
