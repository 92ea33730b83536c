"""Unit tests of the sans-I/O yamux core: frame codec, stream states, flow control, limits."""
import os

import pytest

from node.p2p import yamux as y
from node.p2p.yamux import (
    DataReceived,
    GoAwayReceived,
    PongReceived,
    SendWindowOpened,
    StreamEnded,
    StreamOpened,
    StreamReset,
    YamuxProtocolError,
    YamuxSession,
    YamuxSessionClosed,
    YamuxStreamError,
    YamuxStreamLimitError,
)


def frames(data: bytes) -> list[tuple]:
    """Split queued bytes into (type, flags, stream_id, length, payload) tuples."""
    out, pos = [], 0
    while pos < len(data):
        h = y.decode_header(data, pos)
        pos += y.HEADER_SIZE
        body = b""
        if h.frame_type == y.TYPE_DATA:
            body, pos = data[pos:pos + h.length], pos + h.length
        out.append((h.frame_type, h.flags, h.stream_id, h.length, body))
    return out


def pump(src: YamuxSession, dst: YamuxSession, now: float = 0.0) -> list:
    return dst.receive_data(src.data_to_send(), now)


def pair(**kw) -> tuple[YamuxSession, YamuxSession]:
    return YamuxSession(True, **kw), YamuxSession(False, **kw)


def received(events: list, stream_id: int) -> bytes:
    return b"".join(e.data for e in events if type(e) is DataReceived and e.stream_id == stream_id)


# ---------------------------------------------------------------- frame codec

def test_header_roundtrip_and_exact_bytes():
    raw = y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN | y.FLAG_ACK, 7, 0x01020304)
    assert raw == bytes([0, 1, 0, 3, 0, 0, 0, 7, 1, 2, 3, 4])
    assert y.decode_header(raw) == y.FrameHeader(y.TYPE_WINDOW_UPDATE, 3, 7, 0x01020304)
    assert y.decode_header(b"xx" + raw, 2).stream_id == 7


@pytest.mark.parametrize("raw, message", [
    (bytes([1, 0, 0, 0]) + bytes(8), "version"),
    (bytes([0, 4, 0, 0]) + bytes(8), "type"),
    (bytes(11), "truncated"),
])
def test_decode_header_rejects_bad_headers(raw, message):
    with pytest.raises(YamuxProtocolError, match=message):
        y.decode_header(raw)


@pytest.mark.parametrize("args", [(4, 0, 1, 0), (0, 0x10000, 1, 0), (0, 0, 2**32, 0), (0, 0, 1, -1)])
def test_encode_header_rejects_out_of_range(args):
    with pytest.raises(ValueError):
        y.encode_header(*args)


# --------------------------------------------------------------- stream setup

def test_open_sends_syn_and_peer_acks():
    a, b = pair()
    sid = a.open_stream()
    assert sid == 1 and a.open_stream() == 3
    assert frames(a.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0, b""),
                                        (y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 3, 0, b"")]
    events = b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0), 0.0)
    assert events == [StreamOpened(1)]
    assert frames(b.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, y.FLAG_ACK, 1, 0, b"")]
    assert b.open_stream() == 2  # the responder uses even ids


def test_data_flows_intact_whatever_the_chunking():
    a, b = pair()
    sid = a.open_stream()
    payload = os.urandom(30_000)
    assert a.send_data(sid, payload) == len(payload)
    a.end_stream(sid)
    wire = a.data_to_send()
    for size in (1, 5, 12, 13, 4096, len(wire)):
        peer = YamuxSession(False)
        events = []
        for i in range(0, len(wire), size):
            events += peer.receive_data(wire[i:i + size], 0.0)
        assert events[0] == StreamOpened(sid)
        assert received(events, sid) == payload
        assert events[-1] == StreamEnded(sid)


def test_syn_on_data_frame_opens_stream_and_window_update_syn_extends_window():
    b = YamuxSession(False)
    events = b.receive_data(y.encode_header(y.TYPE_DATA, y.FLAG_SYN, 5, 3) + b"abc", 0.0)
    assert events == [StreamOpened(5), DataReceived(5, b"abc")]
    b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 7, 1000), 0.0)
    assert b.send_window(7) == y.INITIAL_WINDOW + 1000


# ---------------------------------------------------------------- flow control

def test_send_data_stops_at_window_and_resumes_after_update():
    a, b = pair()
    sid = a.open_stream()
    pump(a, b)
    big = bytes(y.INITIAL_WINDOW + 1000)
    assert a.send_data(sid, big) == y.INITIAL_WINDOW
    assert a.send_data(sid, big) == 0
    events = pump(a, b)
    assert len(received(events, sid)) == y.INITIAL_WINDOW
    b.acknowledge_received(sid, y.INITIAL_WINDOW, now=10.0)  # slow consumer: no growth
    assert b.receive_window(sid) == y.INITIAL_WINDOW
    assert pump(b, a) == [SendWindowOpened(sid)]
    assert a.send_window(sid) == y.INITIAL_WINDOW


def test_frames_are_split_at_max_frame_payload():
    a = YamuxSession(True, max_frame_payload=1000)
    sid = a.open_stream()
    a.data_to_send()
    a.send_data(sid, bytes(2500))
    assert [f[3] for f in frames(a.data_to_send())] == [1000, 1000, 500]


def test_data_beyond_receive_window_is_a_protocol_error():
    b = YamuxSession(False)
    b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0), 0.0)
    b.data_to_send()
    b.receive_data(y.encode_header(y.TYPE_DATA, 0, 1, y.INITIAL_WINDOW - 10) + bytes(y.INITIAL_WINDOW - 10), 0.0)
    with pytest.raises(YamuxProtocolError, match="receive window"):
        b.receive_data(y.encode_header(y.TYPE_DATA, 0, 1, 11), 0.0)  # rejected before any body
    assert b.terminated
    assert frames(b.data_to_send()) == [(y.TYPE_GO_AWAY, 0, 0, y.GO_AWAY_PROTOCOL_ERROR, b"")]
    with pytest.raises(YamuxSessionClosed):
        b.receive_data(b"", 0.0)


def test_window_updates_are_batched_at_half_window():
    a, b = pair()
    sid = a.open_stream()
    a.send_data(sid, bytes(y.INITIAL_WINDOW))
    pump(a, b)
    b.data_to_send()
    for _ in range(127):
        b.acknowledge_received(sid, 1024, now=100.0)
    assert b.data_to_send() == b""  # 127 KiB consumed: below half of 256 KiB
    b.acknowledge_received(sid, 1024, now=100.0)
    # the update, and a ping that refreshes the RTT auto-tuning uses (at most every 0.25 s)
    assert frames(b.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, 0, sid, 128 * 1024, b""),
                                        (y.TYPE_PING, y.FLAG_SYN, 0, 0, b"")]
    a.send_data(sid, bytes(128 * 1024))
    pump(a, b)
    b.acknowledge_received(sid, 128 * 1024, now=100.1)
    assert frames(b.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, 0, sid, 128 * 1024, b"")]  # no new ping yet


def test_window_grows_for_fast_consumer_up_to_max_and_not_for_slow_one():
    for seconds_per_window in (0.0001, 1.0):
        a, b = pair(max_window=1024 * 1024)
        sid = a.open_stream()
        pump(a, b)
        now = 0.0
        for _ in range(10):
            a.send_data(sid, bytes(a.send_window(sid)))
            pump(a, b, now)
            now += seconds_per_window
            b.acknowledge_received(sid, b.receive_window(sid), now)
            pump(b, a, now)
        fast = seconds_per_window < 0.001
        assert b.receive_window(sid) == (1024 * 1024 if fast else y.INITIAL_WINDOW)
        assert a.send_window(sid) == b.receive_window(sid)


def consume_window(a: YamuxSession, b: YamuxSession, sid: int, now: float) -> None:
    """a fills the stream's window, b consumes all of it at ``now``, a gets the update."""
    a.send_data(sid, bytes(a.send_window(sid)))
    pump(a, b, now)
    b.acknowledge_received(sid, b.receive_window(sid) - b._streams[sid].consumed, now)
    pump(b, a, now)


def test_a_stream_joining_a_tuned_session_gets_the_tuned_window_even_if_slow():
    a, b = pair(max_window=1024 * 1024)
    fast, slow = a.open_stream(), a.open_stream()
    pump(a, b)
    now = 0.0
    for _ in range(4):
        now += 0.0001
        consume_window(a, b, fast, now)
    assert b.receive_window(fast) == 1024 * 1024
    consume_window(a, b, slow, now + 10.0)  # consumed slowly, still moves to the tuned window
    assert b.receive_window(slow) == 1024 * 1024 == a.send_window(slow)


def test_streams_share_the_budget_evenly_and_shrink_by_withholding_credit():
    budget = 4 * y.INITIAL_WINDOW
    a, b = pair(max_window=8 * y.INITIAL_WINDOW, window_growth_budget=budget)
    s1, s2 = a.open_stream(), a.open_stream()
    pump(a, b)
    now = 0.0
    for _ in range(4):
        now += 0.0001
        consume_window(a, b, s1, now)
    assert b.receive_window(s1) == y.INITIAL_WINDOW + budget  # alone: the whole budget
    consume_window(a, b, s2, now)  # s2 starts sharing: nothing left to grow with yet
    assert b.receive_window(s2) == y.INITIAL_WINDOW
    fair = y.INITIAL_WINDOW + budget // 2
    window = b.receive_window(s1)
    a.send_data(s1, bytes(a.send_window(s1)))  # the whole window in flight
    pump(a, b, now)
    b.acknowledge_received(s1, window // 2, now)  # above its share: credits less than consumed
    pump(b, a, now)
    assert b.receive_window(s1) == fair and a.send_window(s1) == fair - window // 2
    b.acknowledge_received(s1, window // 2, now)
    pump(b, a, now)
    assert a.send_window(s1) == fair  # the peer's credit never exceeds the new window
    consume_window(a, b, s2, now)  # the freed budget goes to s2
    assert b.receive_window(s2) == fair == a.send_window(s2)
    assert b.window_tuner.growth == budget
    b.reset_stream(s1)
    assert b.window_tuner.growth == fair - y.INITIAL_WINDOW and b.window_tuner.sharing == 1


def test_sessions_sharing_a_tuner_get_equal_windows_and_release_them_on_close():
    tuner = y.WindowTuner(growth_budget=64 * y.INITIAL_WINDOW)
    a1, b1 = YamuxSession(True), YamuxSession(False, window_tuner=tuner, max_window=1024 * 1024)
    a2, b2 = YamuxSession(True), YamuxSession(False, window_tuner=tuner, max_window=1024 * 1024)
    s1, s2 = a1.open_stream(), a2.open_stream()
    pump(a1, b1)
    pump(a2, b2)
    now = 0.0
    for _ in range(4):
        now += 0.0001
        consume_window(a1, b1, s1, now)
    consume_window(a2, b2, s2, now + 5.0)  # another connection, slow: adopts the tuned window
    assert b1.receive_window(s1) == b2.receive_window(s2) == 1024 * 1024
    assert tuner.sharing == 2 and tuner.growth == 2 * (1024 * 1024 - y.INITIAL_WINDOW)
    b1.close()  # the connection went away
    assert tuner.sharing == 1 and tuner.growth == 1024 * 1024 - y.INITIAL_WINDOW
    with pytest.raises(YamuxSessionClosed):
        b1.open_stream()


def test_window_growth_respects_session_budget():
    a, b = pair(window_growth_budget=y.INITIAL_WINDOW)
    s1, s2 = a.open_stream(), a.open_stream()
    pump(a, b)
    for sid in (s1, s2):
        a.send_data(sid, bytes(y.INITIAL_WINDOW))
    pump(a, b, 0.0)
    b.acknowledge_received(s1, y.INITIAL_WINDOW, 0.0001)
    b.acknowledge_received(s2, y.INITIAL_WINDOW, 0.0001)
    assert b.receive_window(s1) == 2 * y.INITIAL_WINDOW
    assert b.receive_window(s2) == y.INITIAL_WINDOW  # budget spent by s1
    b.reset_stream(s1)  # releases s1's growth
    pump(b, a)
    a.send_data(s2, bytes(a.send_window(s2)))
    pump(a, b, 0.0001)
    b.acknowledge_received(s2, y.INITIAL_WINDOW, 0.0002)
    assert b.receive_window(s2) == 2 * y.INITIAL_WINDOW


def test_window_update_overflow_is_a_protocol_error():
    a, b = pair()
    sid = a.open_stream()
    pump(a, b)
    with pytest.raises(YamuxProtocolError, match="overflow"):
        a.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, 0, sid, y.MAX_UINT32), 0.0)


# ----------------------------------------------------------- close and reset

def test_half_close_both_ways_removes_stream():
    a, b = pair()
    sid = a.open_stream()
    a.send_data(sid, b"hello")
    a.end_stream(sid)
    assert pump(a, b) == [StreamOpened(sid), DataReceived(sid, b"hello"), StreamEnded(sid)]
    with pytest.raises(YamuxStreamError, match="closed for writing"):
        a.send_data(sid, b"more")
    b.send_data(sid, b"reply")  # the other direction is still open
    b.end_stream(sid)
    assert not b.has_stream(sid)
    assert pump(b, a) == [DataReceived(sid, b"reply"), StreamEnded(sid)]
    assert a.num_streams == 0 and b.num_streams == 0


def test_data_after_fin_is_a_protocol_error():
    a, b = pair()
    sid = a.open_stream()
    a.end_stream(sid)
    pump(a, b)
    with pytest.raises(YamuxProtocolError, match="after FIN"):
        b.receive_data(y.encode_header(y.TYPE_DATA, 0, sid, 1) + b"x", 0.0)


def test_reset_notifies_peer_and_late_frames_are_ignored():
    a, b = pair()
    sid = a.open_stream()
    pump(a, b)
    b.data_to_send()
    b.reset_stream(sid)
    b.reset_stream(sid)  # idempotent
    assert frames(b.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, y.FLAG_RST, sid, 0, b"")]
    a.send_data(sid, b"late data crossing the RST")
    late = a.data_to_send()
    assert a.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_RST, sid, 0), 0.0) == [StreamReset(sid)]
    assert b.receive_data(late, 0.0) == []
    with pytest.raises(YamuxStreamError):
        a.send_data(sid, b"x")


def test_reset_during_a_partially_received_frame_discards_its_rest():
    a, b = pair()
    sid = a.open_stream()
    a.send_data(sid, bytes(1000))
    a.end_stream(sid)
    wire = a.data_to_send()
    events = b.receive_data(wire[:500], 0.0)
    assert received(events, sid) == bytes(500 - 2 * y.HEADER_SIZE)
    b.reset_stream(sid)
    assert b.receive_data(wire[500:], 0.0) == []


# ------------------------------------------------------------- session level

def test_ping_is_answered_and_pong_gives_rtt():
    a, b = pair()
    opaque = a.send_ping(now=1.0)
    assert pump(a, b) == []
    assert frames(b.data_to_send()) == [(y.TYPE_PING, y.FLAG_ACK, 0, opaque, b"")]
    b.receive_data(y.encode_header(y.TYPE_PING, y.FLAG_SYN, 0, opaque), 0.0)
    assert a.receive_data(b.data_to_send(), 1.25) == [PongReceived(opaque, 0.25)]
    assert a.rtt == 0.25
    assert a.receive_data(y.encode_header(y.TYPE_PING, y.FLAG_ACK, 0, 999), 2.0) == []  # unsolicited


def test_remote_go_away_stops_new_streams_but_existing_ones_continue():
    a, b = pair()
    sid = a.open_stream()
    pump(a, b)
    b.go_away()
    assert pump(b, a) == [GoAwayReceived(y.GO_AWAY_NORMAL)]
    with pytest.raises(YamuxSessionClosed, match="GoAway"):
        a.open_stream()
    a.send_data(sid, b"still works")
    assert received(pump(a, b), sid) == b"still works"


def test_after_local_go_away_new_streams_are_refused():
    a, b = pair()
    b.go_away()
    pump(b, a)
    b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0), 0.0)
    assert frames(b.data_to_send()) == [(y.TYPE_WINDOW_UPDATE, y.FLAG_RST, 1, 0, b"")]


def test_inbound_stream_limit_resets_new_streams_and_outbound_limit_raises():
    a, b = YamuxSession(True), YamuxSession(False, max_streams=2)
    ids = [a.open_stream() for _ in range(3)]
    for sid in ids:
        a.send_data(sid, b"x" * 10)
    events = pump(a, b)
    assert [e for e in events if type(e) is StreamOpened] == [StreamOpened(1), StreamOpened(3)]
    assert received(events, 5) == b""  # the refused stream's data is discarded
    assert (y.TYPE_WINDOW_UPDATE, y.FLAG_RST, 5, 0, b"") in frames(b.data_to_send())
    small = YamuxSession(True, max_streams=1)
    small.open_stream()
    with pytest.raises(YamuxStreamLimitError):
        small.open_stream()


@pytest.mark.parametrize("header, message", [
    (y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 0, 0), "stream id 0"),
    (y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 3, 0), "parity"),
    (y.encode_header(y.TYPE_DATA, 0, 9, y.MAX_WINDOW + 1), "maximum window"),
])
def test_protocol_violations(header, message):
    b = YamuxSession(True)  # initiator: the peer must use even ids
    with pytest.raises(YamuxProtocolError, match=message):
        b.receive_data(header, 0.0)


def test_duplicate_syn_is_a_protocol_error():
    b = YamuxSession(False)
    b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0), 0.0)
    with pytest.raises(YamuxProtocolError, match="already open"):
        b.receive_data(y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 1, 0), 0.0)


def test_ten_thousand_streams_in_one_session():
    a, b = pair(max_streams=10_000)
    ids = [a.open_stream() for _ in range(10_000)]
    for sid in ids:
        a.send_data(sid, sid.to_bytes(4, "big"))
    events = pump(a, b)
    data = [e for e in events if type(e) is DataReceived]
    assert len(data) == 10_000 and all(int.from_bytes(e.data, "big") == e.stream_id for e in data)
    assert b.num_streams == 10_000


# ------------------------------------------------------- zero-copy buffers

def test_parts_reference_payloads_and_views_in_give_views_out():
    a, b = pair()
    sid = a.open_stream()
    payload = bytes(range(256)) * 256  # 64 KiB
    a.send_data(sid, payload)
    a.send_data(sid, b"tiny")
    parts = a.data_to_send_parts()
    assert any(part is payload for part in parts)  # queued by reference, never joined
    assert a.data_to_send_parts() == []
    wire = memoryview(b"".join(parts))
    events = b.receive_data(wire, 0.0)
    chunks = [e.data for e in events if type(e) is DataReceived]
    assert [type(c) for c in chunks] == [memoryview, bytes]  # a big body uncopied, a small one copied
    assert b"".join(chunks) == payload + b"tiny"
    split = memoryview(bytes(wire))  # the same frames cut mid-header and mid-body
    c = YamuxSession(False)
    got = b"".join(e.data for piece in (split[:5], split[5:40_000], split[40_000:])
                   for e in c.receive_data(piece, 0.0) if type(e) is DataReceived)
    assert got == payload + b"tiny"


def test_small_parts_of_a_large_read_are_copied_so_they_cannot_pin_it():
    a, b = pair()
    s1, s2, s3 = a.open_stream(), a.open_stream(), a.open_stream()
    a.send_data(s1, bytes(17_000))  # >= 16 KiB but under 1/16 of the ~530 KB read
    a.send_data(s2, bytes(y.INITIAL_WINDOW))
    a.send_data(s3, bytes(y.INITIAL_WINDOW))
    events = b.receive_data(memoryview(a.data_to_send()), 0.0)
    kinds = {e.stream_id: type(e.data) for e in events if type(e) is DataReceived}
    assert kinds == {s1: bytes, s2: memoryview, s3: memoryview}
