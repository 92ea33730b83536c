"""Property/fuzz tests: any bytes into the yamux core or driver give our own protocol error, never a crash."""
import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_muxer import echo, memory_pipe, muxed_pair

from node.p2p import yamux as y
from node.p2p.muxer import MuxedConnection
from node.p2p.yamux import DataReceived, StreamOpened, YamuxError, YamuxSession

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def feed(session: YamuxSession, data: bytes, cuts: list[int]) -> list:
    """Feed `data` split at `cuts`; return events; only YamuxError may escape."""
    events, pos = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        events += session.receive_data(data[pos:cut], 0.0)
        pos = max(pos, cut)
    return events


def valid_transcript() -> bytes:
    """Bytes an initiator sends in a busy session: opens, data, updates, pings, FIN, RST, GoAway."""
    a, b = YamuxSession(True), YamuxSession(False)
    s1, s3, s5 = a.open_stream(), a.open_stream(), a.open_stream()
    a.send_data(s1, b"hello" * 100)
    a.send_data(s3, bytes(3000))
    a.send_ping(0.0)
    out = [a.data_to_send()]
    b.receive_data(out[0], 0.0)
    for _ in range(2):
        a.send_data(s1, b"x" * 1000)
        out.append(a.data_to_send())
    a.end_stream(s3)
    a.reset_stream(s5)
    b.acknowledge_received(s1, 200_000, 0.0)
    a.receive_data(b.data_to_send(), 0.0)
    a.end_stream(s1)
    a.go_away()
    return b"".join(out) + a.data_to_send()


TRANSCRIPT = valid_transcript()


@FUZZ
@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 2000), max_size=8),
       initiator=st.booleans())
def test_random_bytes_give_only_yamux_errors(data, cuts, initiator):
    try:
        feed(YamuxSession(initiator), data, cuts)
    except YamuxError:
        pass


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(TRANSCRIPT) - 1), st.integers(0, 255),
                                st.sampled_from(["flip", "insert", "delete"])), min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, len(TRANSCRIPT)), max_size=6),
       truncate=st.integers(0, len(TRANSCRIPT)))
def test_mutated_transcripts_give_only_yamux_errors(edits, cuts, truncate):
    data = bytearray(TRANSCRIPT)
    for pos, value, kind in edits:
        pos %= len(data) or 1
        if kind == "flip" and data:
            data[pos] = value
        elif kind == "insert":
            data.insert(pos, value)
        elif data:
            del data[pos]
    try:
        feed(YamuxSession(False), bytes(data[:truncate or None]), cuts)
    except YamuxError:
        pass


frame = st.tuples(
    st.sampled_from([y.TYPE_DATA, y.TYPE_WINDOW_UPDATE, y.TYPE_PING, y.TYPE_GO_AWAY]),
    st.integers(0, 15),  # flags
    st.integers(0, 8),  # stream id
    st.one_of(st.integers(0, 300), st.sampled_from([y.INITIAL_WINDOW, y.MAX_WINDOW + 1, y.MAX_UINT32])),
    st.integers(0, 400),  # bytes the caller consumes after this frame
)


@FUZZ
@given(frames=st.lists(frame, max_size=40))
def test_structured_frames_keep_buffered_data_within_the_window(frames):
    """Well-formed headers with random flags/ids/lengths: errors are ours and the unread data the
    caller would buffer per stream never exceeds the window we advertise."""
    session = YamuxSession(False, max_streams=4)
    unread: dict[int, int] = {}
    try:
        for frame_type, flags, stream_id, length, consume in frames:
            body = bytes(min(length, 300)) if frame_type == y.TYPE_DATA else b""
            wire = y.encode_header(frame_type, flags, stream_id, length) + body
            for event in session.receive_data(wire, 0.0):
                if type(event) is DataReceived:
                    unread[event.stream_id] = unread.get(event.stream_id, 0) + len(event.data)
            for sid, size in unread.items():
                if session.has_stream(sid):
                    assert size <= session.receive_window(sid)
                    take = min(size, consume)
                    session.acknowledge_received(sid, take, 0.0)
                    unread[sid] = size - take
            session.data_to_send()
    except YamuxError:
        assert session.terminated


@settings(max_examples=25, deadline=None)
@given(junk=st.binary(min_size=1, max_size=500))
def test_driver_survives_garbage_and_keeps_other_connections(junk):
    async def main():
        good_a, good_b = await muxed_pair()
        near, far = memory_pipe()
        victim = MuxedConnection(near, False, echo)
        await victim.start()
        await far.write(junk)
        await far.close()
        for _ in range(1000):
            if victim.closed:
                break
            await asyncio.sleep(0.005)
        assert victim.closed  # either protocol error or EOF: only this connection
        stream = await good_a.open_stream()
        await stream.write(b"ok")
        assert await stream.readexactly(2) == b"ok"
        await good_a.close()
        await good_b.close()
    asyncio.run(asyncio.wait_for(main(), 10))


class TwoHonestPeers(RuleBasedStateMachine):
    """Random operations on two sessions with bytes delivered in random pieces: honest peers never
    trigger a protocol error, every stream delivers a prefix of what was sent, in order, and unread
    data stays within the advertised window."""

    def __init__(self) -> None:
        super().__init__()
        self.peers = (YamuxSession(True, max_streams=6), YamuxSession(False, max_streams=6))
        self.in_flight = [b"", b""]  # bytes on the wire towards peer 0 / peer 1
        self.sent: dict[tuple[int, int], bytearray] = {}  # (sender, stream id) -> bytes sent
        self.got: dict[tuple[int, int], bytearray] = {}  # (receiver, stream id) -> bytes received
        self.unread: dict[tuple[int, int], int] = {}
        self.fin_sent: set[tuple[int, int]] = set()
        self.now = 0.0

    def _writable(self, side: int) -> list[int]:
        return [sid for (s, sid) in self.sent
                if s == side and self.peers[side].has_stream(sid) and (s, sid) not in self.fin_sent]

    def _queue(self, side: int) -> None:
        self.in_flight[1 - side] += self.peers[side].data_to_send()

    @rule(side=st.integers(0, 1))
    def open_stream(self, side):
        peer = self.peers[side]
        if peer.remote_go_away is None and not peer.local_go_away and peer.num_streams < 6:
            self.sent[(side, peer.open_stream())] = bytearray()
            self._queue(side)

    @rule(side=st.integers(0, 1), pick=st.integers(0, 100),
          size=st.one_of(st.sampled_from([1, 65_536, 200_000, 300_000]), st.integers(1, 300_000)))
    def send(self, side, pick, size):
        streams = self._writable(side)
        if streams:
            sid = streams[pick % len(streams)]
            data = bytes([sid % 251]) * size
            sent = self.peers[side].send_data(sid, data)
            self.sent[(side, sid)] += data[:sent]
            self._queue(side)

    @rule(side=st.integers(0, 1), pick=st.integers(0, 100), reset=st.booleans())
    def finish(self, side, pick, reset):
        streams = self._writable(side)
        if streams:
            sid = streams[pick % len(streams)]
            if reset:
                self.peers[side].reset_stream(sid)
            else:
                self.peers[side].end_stream(sid)
                self.fin_sent.add((side, sid))
            self._queue(side)

    @rule(side=st.integers(0, 1), fraction=st.floats(0, 1), elapsed=st.sampled_from([0.0001, 0.5]))
    def consume(self, side, fraction, elapsed):
        self.now += elapsed
        for (receiver, sid), size in self.unread.items():
            if receiver == side and size:
                take = int(size * fraction)
                self.peers[side].acknowledge_received(sid, take, self.now)
                self.unread[(receiver, sid)] = size - take
        self._queue(side)

    @rule(side=st.integers(0, 1))
    def ping_or_go_away(self, side):
        peer = self.peers[side]
        if self.now > 3 and not peer.local_go_away:
            peer.go_away()
        else:
            peer.send_ping(self.now)
        self._queue(side)

    @rule(side=st.integers(0, 1), fraction=st.one_of(st.just(1.0), st.floats(0, 1)))
    def deliver(self, side, fraction):
        wire = self.in_flight[side]
        cut = int(len(wire) * fraction)
        self.in_flight[side] = wire[cut:]
        for event in self.peers[side].receive_data(wire[:cut], self.now):
            if type(event) is DataReceived:
                key = (side, event.stream_id)
                self.got.setdefault(key, bytearray()).extend(event.data)
                self.unread[key] = self.unread.get(key, 0) + len(event.data)
            elif type(event) is StreamOpened:  # the accepting side may send on it too
                self.sent[(side, event.stream_id)] = bytearray()
        self._queue(side)

    @invariant()
    def streams_deliver_prefixes_within_windows(self):
        for (receiver, sid), data in self.got.items():
            assert self.sent[(1 - receiver, sid)].startswith(data)
            if self.peers[receiver].has_stream(sid):
                assert self.unread[(receiver, sid)] <= self.peers[receiver].receive_window(sid)


TwoHonestPeers.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_two_honest_peers = TwoHonestPeers.TestCase
