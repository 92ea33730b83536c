"""Property/fuzz tests: any bytes into the yamux core or driver give our own protocol error, never a crash."""
import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.p2p import yamux as y
from node.p2p.muxer import MuxedConnection
from node.p2p.yamux import DataReceived, YamuxError, YamuxSession
from test_muxer import echo, memory_pipe, muxed_pair

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
        for _ in range(200):
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
