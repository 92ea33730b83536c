"""A link moves off a connection going away (links.py, docs/adr/0233): the writer opens the next stream, ends
the old one and writes on the new one only once the peer has read the old one to its end, busy or idle, so
every frame arrives once and in order; the receiver closes its side at that end and counts no fault while
the peer's next stream is open."""
import asyncio

import pytest

from ml.allreduce import AllReduceGroup
from ml.allreduce.links import PeerLinks
from ml.allreduce.wire import HEADER_SIZE, Frame, Kind, parse_header


class _MovableStream:
    """A stream on a connection that can go away; the peer's end of it comes when the test says so."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log
        self.going_away = asyncio.Event()
        self.peer_end = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()
        self.writing = asyncio.Event()   # set when a write starts
        self.ended = False

    async def write(self, data):
        self.writing.set()
        await self.gate.wait()
        assert not self.ended, "written after its end"
        if len(data) >= HEADER_SIZE:
            self.log.append((self.name, parse_header(bytes(data[:HEADER_SIZE])).chunk))

    async def close(self):
        self.ended = True
        self.log.append((self.name, "end"))

    async def read(self, n=-1):
        await self.peer_end.wait()
        return b""

    def reset(self):
        self.log.append((self.name, "reset"))


def test_a_link_moves_between_frames_and_writes_on_the_new_stream_only_after_the_old_one_was_read():
    async def main():
        log: list = []
        streams = [_MovableStream(f"s{i}", log) for i in (1, 2, 3)]
        opened = iter(streams)
        broken: list = []

        class Transport:
            async def open_stream(self, peer, protocol):
                stream = next(opened)
                log.append((stream.name, "open"))
                return stream

        s1, s2, s3 = streams
        links = PeerLinks(Transport(), "/test", lambda peer, reason: broken.append(reason))
        for chunk in (0, 1):
            await links.send("b", Frame(Kind.PART, 1, 0, 0, chunk))
        await links.flush(5.0)
        s1.going_away.set()   # idle: the writer moves at once
        await links.send("b", Frame(Kind.PART, 1, 0, 0, 2))
        for _ in range(20):
            await asyncio.sleep(0)
        assert log[-2:] == [("s2", "open"), ("s1", "end")]  # the next stream is open before the old one ends
        s1.peer_end.set()     # the peer read s1 to its end: only now does chunk 2 go out, on s2
        await links.flush(5.0)
        assert log[-1] == ("s2", 2)
        s2.gate.clear()       # busy: chunk 3 is being written when s2's connection starts going away
        s2.writing.clear()
        await links.send("b", Frame(Kind.PART, 1, 0, 0, 3))
        await links.send("b", Frame(Kind.PART, 1, 0, 0, 4))
        await s2.writing.wait()
        s2.going_away.set()
        s2.peer_end.set()
        s2.gate.set()
        await links.flush(5.0)
        await links.close()
        return log, broken

    log, broken = asyncio.run(asyncio.wait_for(main(), 10))
    assert broken == []
    assert [entry for entry in log if isinstance(entry[1], int)] == [
        ("s1", 0), ("s1", 1), ("s2", 2), ("s2", 3), ("s3", 4)]   # each frame once, in order
    assert log.index(("s3", "open")) < log.index(("s2", "end")) < log.index(("s3", 4))
    assert not any(entry[1] == "reset" for entry in log)


def test_a_link_whose_old_stream_is_reset_before_its_end_was_read_is_broken():
    """Frames on the old stream may be lost: the peer is marked faulty, as before (never a silent gap)."""
    async def main():
        log: list = []
        old, new = _MovableStream("s1", log), _MovableStream("s2", log)
        opened = iter((old, new))
        broken: list = []

        class Transport:
            async def open_stream(self, peer, protocol):
                return next(opened)

        async def reset_read(n=-1):
            raise ConnectionResetError("yamux stream 1 was reset")

        old.read = reset_read
        links = PeerLinks(Transport(), "/test", lambda peer, reason: broken.append(reason))
        await links.send("b", Frame(Kind.PART, 1, 0, 0, 0))
        await links.flush(5.0)
        old.going_away.set()
        for _ in range(20):
            await asyncio.sleep(0)
        await links.close()
        return log, broken

    log, broken = asyncio.run(asyncio.wait_for(main(), 10))
    assert len(broken) == 1 and "was reset" in broken[0]
    assert ("s2", "reset") in log   # the new stream is given up too: the next send opens a fresh link


class _EndedStream:
    """A stream at its clean end (between frames)."""

    def __init__(self):
        self.closed = False

    async def readexactly(self, n):
        raise asyncio.IncompleteReadError(b"", n)

    async def close(self):
        self.closed = True

    def reset(self):
        pass


class _OpenStream:
    """A stream with nothing to read yet."""

    def __init__(self):
        self.never = asyncio.Event()

    async def readexactly(self, n):
        await self.never.wait()

    def reset(self):
        pass


@pytest.mark.parametrize("next_stream_open", [True, False])
def test_a_stream_ended_between_frames_is_a_fault_in_a_round_unless_the_peers_next_stream_is_open(next_stream_open):
    async def main():
        class Transport:
            def set_handler(self, protocol, handler):
                pass

        group = AllReduceGroup(Transport(), "a", ["a", "b"])
        await group.start()
        group._round_active = True
        reader = None
        if next_stream_open:
            reader = asyncio.create_task(group._on_stream(_OpenStream(), "b"))
            await asyncio.sleep(0)
        ended = _EndedStream()
        await group._on_stream(ended, "b")
        fault = group._io.inbox.fault("b", group._fault_round())
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await group.close(linger_s=0)
        return fault, ended.closed

    fault, closed = asyncio.run(main())
    assert closed   # our side closed: the writer learns every frame on it was read
    assert fault == (None if next_stream_open else "connection closed")
