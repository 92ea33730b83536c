"""The uplink takes turns: one frame at a time over the destinations, a stuck destination loses its
turn after the hold limit, and each peer's queue serves parts before results (docs/adr/0097)."""
import asyncio
import socket

from ml.allreduce import uplink as uplink_module
from ml.allreduce.links import PeerLinks, _pieces
from ml.allreduce.transport import UNSENT_LOWAT_BYTES, TcpTransport
from ml.allreduce.wire import HEADER_SIZE, Frame, Kind, parse_header


class _Wire:
    """Every stream's writes, in the order they happened, as (event, peer, kind, round, chunk)."""

    def __init__(self, write_s: float = 0.005, stuck: str | None = None):
        self.events = []
        self.write_s = write_s
        self.stuck = stuck
        self.gate = asyncio.Event()
        self.gate.set()

    def transport(self):
        wire = self

        class Transport:
            async def open_stream(self, peer, protocol):
                return _Stream(wire, peer)

        return Transport()


class _Stream:
    def __init__(self, wire: _Wire, peer: str):
        self.wire = wire
        self.peer = peer
        self.header = None
        self.remaining = 0

    async def write(self, data):
        await self.wire.gate.wait()
        if self.peer == self.wire.stuck:
            await asyncio.Event().wait()  # a destination that never reads again
        if self.header is None:  # a frame's first buffer: header + meta
            self.header = parse_header(bytes(data[:HEADER_SIZE]))
            self.remaining = self.header.payload_len
            self.wire.events.append(("start", self.peer, self.header.kind, self.header.round_id, self.header.chunk))
        else:
            self.remaining -= len(data)
        if self.remaining == 0:
            await asyncio.sleep(self.wire.write_s)
            h, self.header = self.header, None
            self.wire.events.append(("end", self.peer, h.kind, h.round_id, h.chunk))

    async def close(self):
        pass

    def reset(self):
        pass


def _frames(n_chunks, kind=Kind.PART, round_id=1):
    return [Frame(kind, round_id, 0, 0, c, {}, b"x" * 64) for c in range(n_chunks)]


async def _send_all(links, plan):
    async def one(peer, frames):
        for frame in frames:
            await links.send(peer, frame)
    await asyncio.gather(*(one(peer, frames) for peer, frames in plan.items()))


def test_frames_to_several_peers_go_out_one_at_a_time_in_rotation():
    async def main():
        wire = _Wire()
        links = PeerLinks(wire.transport(), "/t", lambda peer, reason: None)
        await _send_all(links, {p: _frames(4) for p in ("a", "b", "c")})
        await links.flush(5.0)
        await links.close()
        return wire.events

    events = asyncio.run(main())
    assert len(events) == 24
    # never two frames on the wire at once: every start is followed by its own end
    for start, end in zip(events[0::2], events[1::2]):
        assert start[0] == "start" and end[0] == "end" and start[1:] == end[1:]
    order = [e[1] for e in events[0::2]]
    # each destination gets one frame per rotation
    for i in range(0, 12, 3):
        assert sorted(order[i:i + 3]) == ["a", "b", "c"], order


def test_a_destination_that_stops_reading_loses_its_turn_and_the_others_finish():
    async def main():
        wire = _Wire(stuck="b")
        links = PeerLinks(wire.transport(), "/t", lambda peer, reason: None)
        sends = asyncio.ensure_future(_send_all(links, {"a": _frames(6), "c": _frames(6)}))
        await links.send("b", _frames(1)[0])  # b's writer takes a turn and never returns
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.wait_for(sends, 10.0)
        while sum(1 for e in wire.events if e[0] == "end") < 12:
            assert loop.time() - start < 10.0, wire.events
            await asyncio.sleep(0.01)
        expired = links.uplink.expired_turns
        await links.close(grace_s=0.1)
        return expired, wire.events

    expired, events = asyncio.run(main())
    assert expired == 1
    assert sorted({e[1] for e in events}) == ["a", "c"]


def test_the_hold_limit_follows_the_observed_write_times():
    turn = uplink_module.UplinkTurn()
    assert turn.hold_s == uplink_module.HOLD_INITIAL_S

    async def write_taking(seconds):
        await turn.write(lambda: asyncio.sleep(seconds))

    async def main():
        for _ in range(3):
            await write_taking(0.01)
        short = turn.hold_s
        for _ in range(4):
            await write_taking(0.1)
        return short

    assert asyncio.run(main()) == uplink_module.HOLD_FLOOR_S
    assert 0.75 <= turn.hold_s <= 1.0  # 8x a ~100 ms median
    turn._recent.extend([10.0] * uplink_module.RECENT_WRITES)
    assert turn.hold_s == uplink_module.HOLD_CEIL_S


def test_a_peers_queue_sends_parts_before_results_and_earlier_rounds_first():
    async def main():
        wire = _Wire()
        wire.gate.clear()  # hold the writer until everything is queued
        links = PeerLinks(wire.transport(), "/t", lambda peer, reason: None)
        await links.send("a", Frame(Kind.PING, 1, 0, 0, 9))  # the writer takes this one first
        await asyncio.sleep(0)
        for frame in [Frame(Kind.RESULT, 1, 0, 0, 0), Frame(Kind.PART, 2, 0, 0, 0),
                      Frame(Kind.PART, 1, 0, 0, 1), Frame(Kind.RESULT, 1, 0, 0, 2), Frame(Kind.PART, 1, 0, 0, 3)]:
            await links.send("a", frame)
        wire.gate.set()
        await links.flush(5.0)
        await links.close()
        return [(e[2], e[3], e[4]) for e in wire.events if e[0] == "start"]

    assert asyncio.run(main()) == [(Kind.PING, 1, 9), (Kind.PART, 1, 1), (Kind.PART, 1, 3),
                                   (Kind.RESULT, 1, 0), (Kind.RESULT, 1, 2), (Kind.PART, 2, 0)]


def test_tcp_transport_sockets_keep_little_unsent_data():
    async def main():
        server = TcpTransport("b", "127.0.0.1", 0, {})
        seen = asyncio.get_running_loop().create_future()
        done = asyncio.Event()

        async def handler(stream, peer):
            seen.set_result(stream)
            await done.wait()

        server.set_handler("/t", handler)
        await server.start()
        client = TcpTransport("a", "127.0.0.1", 0, {"b": server.listen_address})
        await client.start()
        stream = await client.open_stream("b", "/t")
        await stream.write(b"x")
        remote = await asyncio.wait_for(seen, 5.0)
        values = [s._transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT)
                  for s in (stream, remote)]
        done.set()
        stream.reset()
        await client.close()
        await server.close()
        return values

    assert asyncio.run(main()) == [UNSENT_LOWAT_BYTES, UNSENT_LOWAT_BYTES]


def test_a_frame_is_cut_into_pieces_of_at_most_turn_bytes_without_copying_its_bytes():
    buffers = [b"h" * 40, memoryview(bytearray(range(256)) * 5), b"", b"t" * 3]
    pieces = _pieces(buffers, 100)
    sizes = [sum(len(b) for b in piece) for piece in pieces]
    assert sizes == [100] * 13 + [23]
    assert b"".join(bytes(b) for piece in pieces for b in piece) == b"".join(bytes(b) for b in buffers)


def test_large_frames_to_two_peers_take_turns_piece_by_piece():
    async def main():
        writes = []

        class Stream:
            def __init__(self, peer):
                self.peer = peer

            async def write(self, data):
                writes.append((self.peer, len(data)))
                await asyncio.sleep(0.002)

            async def close(self):
                pass

            def reset(self):
                pass

        class Transport:
            async def open_stream(self, peer, protocol):
                return Stream(peer)

        links = PeerLinks(Transport(), "/t", lambda peer, reason: None)
        payload = b"x" * (3 * (256 << 10))
        await asyncio.gather(links.send("a", Frame(Kind.PART, 1, 0, 0, 0, {}, payload)),
                             links.send("b", Frame(Kind.PART, 1, 0, 0, 0, {}, payload)))
        await links.flush(5.0)
        await links.close()
        return writes

    peers = [peer for peer, size in asyncio.run(main()) if size > 1000]
    # no peer gets two large pieces in a row while the other still has some queued
    assert peers[:6] in (["a", "b"] * 3, ["b", "a"] * 3), peers
