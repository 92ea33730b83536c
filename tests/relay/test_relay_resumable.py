"""Resumable transfers without a network: header validation, resume from the receiver's offset,
preemption of a stalled attempt, adaptive stall detection (a silent path is left within 3 s, a slow
live one is kept), progress reports that go backwards, and fuzzed headers."""
import asyncio
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.encoding import encode
from devtools.resumable import ResumableReceiver, TransferError, _decode_header, send_resumable
from devtools.stall import StallTimer
from relay.messages import frame


class MemoryStream:
    """One direction of an in-memory stream pair with the HostStream read/write/close/reset API."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.peer: MemoryStream | None = None
        self.reset_called = False
        self.cut_after: int | None = None  # bytes this side may still write before the "link" dies
        self.silent = False  # the dead link swallows writes (blocks) instead of resetting

    async def read(self, n: int = -1) -> bytes:
        item = await self.queue.get()
        if isinstance(item, Exception):
            raise item
        return item

    async def readexactly(self, n: int) -> bytes:
        data = await self.read()
        if len(data) != n:
            raise asyncio.IncompleteReadError(data, n)
        return data

    async def write(self, data) -> None:
        data = bytes(data)
        if self.cut_after is not None:
            if len(data) > self.cut_after:
                self.peer.queue.put_nowait(data[:self.cut_after])
                if self.silent:
                    await asyncio.Event().wait()
                self.peer.queue.put_nowait(ConnectionResetError("link cut"))
                raise ConnectionResetError("link cut")
            self.cut_after -= len(data)
        self.peer.queue.put_nowait(data)

    async def close(self) -> None:
        self.peer.queue.put_nowait(b"")

    def reset(self) -> None:
        self.reset_called = True
        self.queue.put_nowait(ConnectionResetError("reset"))  # like yamux: pending reads fail
        self.peer.queue.put_nowait(ConnectionResetError("reset"))


def pair():
    a, b = MemoryStream(), MemoryStream()
    a.peer, b.peer = b, a
    return a, b


def test_resumes_from_receiver_offset_after_a_cut():
    async def main():
        receiver = ResumableReceiver()
        data = os.urandom(5 << 20)
        handlers = []
        cuts = [3 << 20, None]

        async def open_stream():
            ours, theirs = pair()
            ours.cut_after = cuts.pop(0)
            handlers.append(asyncio.ensure_future(receiver.serve(theirs)))
            return ours

        transfer_id = os.urandom(16)
        starts = await send_resumable(open_stream, transfer_id, data, retry_delay=0)
        assert await receiver.wait(transfer_id) == data
        assert starts[0] == 0 and 0 < starts[1] <= 3 << 20
        assert receiver.attempts == 2 and transfer_id not in receiver.transfers
        await asyncio.gather(*handlers, return_exceptions=True)
    asyncio.run(main())


def test_silent_path_abandoned_after_stall_timeout():
    async def main():
        receiver = ResumableReceiver()
        data = os.urandom(4 << 20)
        plans = [(2 << 20, True), (None, False)]
        handlers = []

        async def open_stream():
            ours, theirs = pair()
            ours.cut_after, ours.silent = plans.pop(0)
            handlers.append(asyncio.ensure_future(receiver.serve(theirs)))
            return ours

        transfer_id = os.urandom(16)
        starts = await asyncio.wait_for(send_resumable(open_stream, transfer_id, data, stall_timeout=0.3), 10)
        assert await receiver.wait(transfer_id) == data
        assert starts[0] == 0 and (2 << 20) - 64 < starts[1] <= 2 << 20  # the cut point, less the header
        await asyncio.gather(*handlers, return_exceptions=True)
    asyncio.run(main())


class ThrottledStream(MemoryStream):
    """A sender side whose link delivers ``piece`` bytes every ``period`` seconds, and after
    ``silent_after`` bytes (if set) delivers nothing more, without an error (a relay gone quiet)."""

    def __init__(self, piece: int, period: float, silent_after: int | None = None) -> None:
        super().__init__()
        self.piece, self.period, self.silent_after = piece, period, silent_after
        self.delivered = 0
        self.silent_since: float | None = None
        self._link = asyncio.Lock()

    async def write(self, data) -> None:
        data = bytes(data)
        async with self._link:  # back-pressure: a write returns once the link carried it
            for pos in range(0, len(data), self.piece):
                if self.silent_after is not None and self.delivered >= self.silent_after:
                    self.silent_since = self.silent_since or time.monotonic()
                    await asyncio.Event().wait()
                await asyncio.sleep(self.period)
                part = data[pos:pos + self.piece]
                self.peer.queue.put_nowait(part)
                self.delivered += len(part)


def _throttled_pair(piece: int, period: float, silent_after: int | None = None):
    ours, theirs = ThrottledStream(piece, period, silent_after), MemoryStream()
    ours.peer, theirs.peer = theirs, ours
    return ours, theirs


def test_stall_timer_adapts_between_floor_and_cap():
    timer = StallTimer()
    assert timer.timeout == 2.0  # nothing seen yet
    for _ in range(30):
        timer.observe(0.25)
    assert timer.timeout == pytest.approx(1.0, abs=0.01)  # steady quarter-second reports: the floor
    for _ in range(30):
        timer.observe(1.5)
    assert 5.5 < timer.timeout < 6.5  # reports 1.5 s apart: about four gaps
    timer.observe(60.0)
    assert timer.timeout == 10.0  # the cap


def test_silent_relay_detected_within_3s_by_default():
    """A fast path that goes silent mid-transfer is abandoned within 3 s (default settings) and the
    transfer resumes on a new path from the receiver's offset."""
    async def main():
        receiver = ResumableReceiver()
        data = os.urandom(4 << 20)
        streams = []

        async def open_stream():
            ours, theirs = _throttled_pair(64 << 10, 0.01, silent_after=(2 << 20) if not streams else None)
            streams.append((ours, time.monotonic()))
            asyncio.ensure_future(receiver.serve(theirs))
            return ours

        transfer_id = os.urandom(16)
        starts = await asyncio.wait_for(send_resumable(open_stream, transfer_id, data, retry_delay=0), 20)
        assert await receiver.wait(transfer_id) == data
        silent_since = streams[0][0].silent_since
        assert silent_since is not None and len(streams) == 2
        assert streams[1][1] - silent_since < 3.0  # detected and a new path opened
        assert starts[0] == 0 and (2 << 20) - (64 << 10) <= starts[1] <= 2 << 20
    asyncio.run(main())


def test_slow_live_link_not_declared_dead():
    """A link delivering 8 KiB every 1.3 s (longer than the 1 s floor, reports that far apart) makes
    progress: no attempt is abandoned."""
    async def main():
        receiver = ResumableReceiver()
        data = os.urandom(16 << 10)
        opened = []

        async def open_stream():
            ours, theirs = _throttled_pair(8 << 10, 1.3)
            opened.append(ours)
            asyncio.ensure_future(receiver.serve(theirs))
            return ours

        transfer_id = os.urandom(16)
        starts = await asyncio.wait_for(send_resumable(open_stream, transfer_id, data), 20)
        assert await receiver.wait(transfer_id) == data
        assert starts == [0] and len(opened) == 1
    asyncio.run(main())


def test_progress_report_going_backwards_abandons_the_attempt():
    async def main():
        async def open_stream():
            ours, theirs = pair()

            async def lying_receiver():
                await theirs.read()  # the header
                await theirs.write((0).to_bytes(8, "big"))
                await theirs.write((100).to_bytes(8, "big"))
                await theirs.write((50).to_bytes(8, "big"))
            asyncio.ensure_future(lying_receiver())
            return ours

        with pytest.raises(TransferError, match="reported offset 50 after 100"):
            await send_resumable(open_stream, os.urandom(16), bytes(1000), attempts=1)
    asyncio.run(main())


def test_new_attempt_preempts_a_stalled_one():
    async def main():
        receiver = ResumableReceiver()
        header = frame(encode({"id": b"t" * 16, "size": 3 << 20}))
        stalled_ours, stalled_theirs = pair()
        await stalled_ours.write(header + bytes(1 << 20))
        stalled = asyncio.ensure_future(receiver.serve(stalled_theirs))
        assert await stalled_ours.read() == (0).to_bytes(8, "big")
        await asyncio.sleep(0.01)  # the stalled attempt holds 1 MiB and waits for more
        fresh_ours, fresh_theirs = pair()
        await fresh_ours.write(header)
        fresh = asyncio.ensure_future(receiver.serve(fresh_theirs))
        assert await fresh_ours.read() == (1 << 20).to_bytes(8, "big")
        assert stalled_theirs.reset_called
        with pytest.raises(ConnectionResetError):
            await stalled
        await fresh_ours.write(bytes(2 << 20))
        await fresh
        assert await receiver.wait(b"t" * 16) == bytes(3 << 20)
    asyncio.run(main())


@pytest.mark.parametrize("header, reason", [
    ({"id": b"x" * 15, "size": 1}, "16-byte id"),
    ({"id": b"x" * 16, "size": -1}, "16-byte id"),
    ({"id": b"x" * 16}, "16-byte id"),
    ({"id": b"x" * 16, "size": 1 << 40}, "exceeds"),
])
def test_bad_headers_rejected(header, reason):
    async def main():
        receiver = ResumableReceiver(max_size=1 << 30)
        ours, theirs = pair()
        await ours.write(frame(encode(header)))
        with pytest.raises(TransferError, match=reason):
            await receiver.serve(theirs)
        assert not receiver.transfers
    asyncio.run(main())


def test_more_bytes_than_announced_rejected():
    async def main():
        receiver = ResumableReceiver()
        ours, theirs = pair()
        await ours.write(frame(encode({"id": b"i" * 16, "size": 4})) + b"12345")
        with pytest.raises(TransferError, match="more than the transfer size"):
            await receiver.serve(theirs)
    asyncio.run(main())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_header(data):
    try:
        _decode_header(data)
    except TransferError:
        pass
