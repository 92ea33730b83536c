"""Pure parts of the all-reduce: frame parsing, plans and shard splits, stall deadlines, and the
settlement of views into one member set."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ml.allreduce.deadlines import DeadlinePolicy, StallEstimator
from ml.allreduce.plan import ALIGN, make_plan, split_proportional
from ml.allreduce.round_core import settle_views as _settle_views
from ml.allreduce.wire import (
    HEADER,
    HEADER_SIZE,
    VERSION,
    Frame,
    FrameError,
    Kind,
    members_from_mask,
    members_mask,
    parse_header,
    parse_meta,
)


def test_frame_roundtrip_through_header_and_meta():
    from ml.allreduce.wire import encode_frame

    frame = Frame(Kind.RESULT, 2**40, 3, 7, 9, {"m": [0, 2]}, b"payload")
    head, payload = encode_frame(frame)
    header = parse_header(head[:HEADER_SIZE])
    assert (header.kind, header.round_id, header.attempt, header.slot, header.chunk) == (Kind.RESULT, 2**40, 3, 7, 9)
    assert parse_meta(head[HEADER_SIZE:HEADER_SIZE + header.meta_len]) == {"m": [0, 2]}
    assert header.payload_len == len(payload) == 7


@pytest.mark.parametrize("raw,message", [
    (HEADER.pack(VERSION + 1, 1, 0, 0, 0, 0, 0, 0), "version"),
    (HEADER.pack(VERSION, 99, 0, 0, 0, 0, 0, 0), "kind"),
    (HEADER.pack(VERSION, 1, 0, 0, 0, 0, 1 << 20, 0), "meta"),
    (HEADER.pack(VERSION, 1, 0, 0, 0, 0, 0, 65 << 20), "oversized"),
    (b"\x01\x01", "header is 2 bytes"),
])
def test_bad_headers_are_rejected(raw, message):
    with pytest.raises(FrameError, match=message):
        parse_header(raw)


@pytest.mark.parametrize("meta", [b"\xff\xfe", b"[1, 2]", b"{not json",
                                  pytest.param(b"[" * 60_000, id="deep")])  # was a RecursionError
def test_bad_meta_is_rejected(meta):
    with pytest.raises(FrameError):
        parse_meta(meta)


@given(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
def test_any_header_bytes_parse_or_raise_frame_error(raw):
    try:
        header = parse_header(raw)
    except FrameError:
        return
    assert header.payload_len <= 64 << 20


def test_member_masks_roundtrip_and_reject_junk():
    universe = ["a", "b", "c", "d"]
    assert members_from_mask(members_mask(["d", "b"], universe), universe) == ["b", "d"]
    for junk in ([7], ["0"], "01", [-1], None):
        with pytest.raises(FrameError):
            members_from_mask(junk, universe)


@given(st.integers(0, 10**7), st.lists(st.floats(0.01, 1e9), min_size=1, max_size=16))
def test_proportional_split_covers_everything_on_aligned_bounds(numel, weights):
    shards = split_proportional(numel, weights)
    assert shards[0][0] == 0 and shards[-1][1] == numel
    assert all(a <= b for a, b in shards) and all(shards[i][1] == shards[i + 1][0] for i in range(len(shards) - 1))
    assert all(b % ALIGN == 0 or b == numel for _, b in shards[:-1])


def test_split_follows_weights():
    shards = split_proportional(1 << 20, [1.0, 3.0])
    assert shards[0][1] == 1 << 18


def test_plan_is_deterministic_and_its_digest_covers_the_layout():
    members = ["p2", "p0", "p1"]
    a = make_plan(members, set(), {"p0": 2e6, "p1": 1e6}, 10_000, 1024, "int8")
    b = make_plan(list(reversed(members)), set(), {"p0": 2e6, "p1": 1e6}, 10_000, 1024, "int8")
    assert a == b and a.digest() == b.digest() and a.members == ("p0", "p1", "p2")
    assert make_plan(members, set(), {}, 10_000, 1024, "int8").digest() != a.digest()
    assert make_plan(members, {"p1"}, {}, 10_000, 1024, "int8").reducers == ("p0", "p2")
    assert make_plan(["p0"], {"p0"}, {}, 10, 4, "fp32").reducers == ("p0",)  # someone must reduce
    chunks = a.chunks(0)
    assert chunks[0][0] == a.shards[0][0] and chunks[-1][1] == a.shards[0][1]
    assert all(b - a_ <= 1024 for a_, b in chunks)


def test_stall_timeout_is_adaptive_but_clamped():
    policy = DeadlinePolicy(floor_s=1.0, multiplier=10.0, ceiling_s=20.0, initial_s=4.0)
    est = StallEstimator(policy)
    assert est.stall_timeout() == 4.0
    est.observe_gap(0.01)
    assert est.stall_timeout() == 1.0
    for _ in range(50):
        est.observe_gap(0.5)
    assert 4.9 < est.stall_timeout() <= 5.0
    for _ in range(50):
        est.observe_gap(100.0)
    assert est.stall_timeout() == 20.0
    with pytest.raises(ValueError):
        DeadlinePolicy(floor_s=0)


def _view(alive, reasons=None, shape="s"):
    return set(alive), dict(reasons or {}), shape


def test_settle_views_agrees_on_the_intersection_of_honest_views():
    members = ["a", "b", "c", "d"]
    views = {"a": _view("abc", {"d": "stalled"}), "b": _view("abcd"), "c": _view("abcd")}
    assert _settle_views(members, views, {"d": "no view"}) == (["a", "b", "c"], {"d": "stalled"})


def test_settle_views_ignores_a_member_that_accuses_everyone():
    members = ["a", "b", "c", "d"]
    views = {"a": _view("abc", {"d": "NaN"}), "b": _view("abc", {"d": "NaN"}), "c": _view("abc", {"d": "NaN"}),
             "d": _view("d", {"a": "x", "b": "x", "c": "x"})}
    assert _settle_views(members, views, {}) == (["a", "b", "c"], {"d": "NaN"})


def test_settle_views_drops_the_minority_shape():
    members = ["a", "b", "c"]
    views = {"a": _view("abc"), "b": _view("abc"), "c": _view("abc", shape="other")}
    kept, dropped = _settle_views(members, views, {})
    assert kept == ["a", "b"] and "wrong-shape" in dropped["c"]


def test_settle_views_is_independent_of_arrival_order():
    members = ["a", "b", "c", "d"]
    views = {"a": _view("abd", {"c": "x"}), "b": _view("bcd", {"a": "y"}), "c": _view("abcd"), "d": _view("abcd")}
    reordered = dict(reversed(list(views.items())))
    assert _settle_views(members, views, {}) == _settle_views(members, reordered, {})


def test_frame_payload_in_parts_is_written_unjoined():
    from ml.allreduce.wire import encode_frame

    view = memoryview(bytearray(b"abcdef"))
    buffers = encode_frame(Frame(Kind.PART, 1, 0, 0, 0, {}, (b"hdr", view)))
    header = parse_header(buffers[0][:HEADER_SIZE])
    assert header.payload_len == 9 and buffers[1:] == [b"hdr", view] and buffers[2] is view


def test_upload_rates_within_the_dead_band_count_as_equal():
    from types import SimpleNamespace

    from ml.allreduce.butterfly import RATE_DEAD_BAND, _rates_meta

    ctx = SimpleNamespace(universe=["a", "b", "c", "d"])

    def arrivals(rate):  # 5 parts of 1 MB, evenly spread at `rate` bytes/s
        return [(i * 1e6 / rate, 1_000_000) for i in range(5)]

    noisy = _rates_meta(ctx, {"b": arrivals(2.3e6), "c": arrivals(3.2e6), "d": arrivals(4.2e6)})["rates"]
    assert len(set(noisy.values())) == 1  # TCP noise on equal links: equal shards
    slow = _rates_meta(ctx, {"b": arrivals(1e6), "c": arrivals(3.2e6), "d": arrivals(3.3e6)})["rates"]
    assert slow["1"] < slow["2"] / RATE_DEAD_BAND and slow["2"] == slow["3"]  # a truly slow link shows
    clamped = _rates_meta(ctx, {"b": arrivals(1e4), "c": arrivals(3.2e6), "d": arrivals(3.3e6)})["rates"]
    assert clamped["1"] == round(3.2e6 / 4)


def test_fp32_payloads_sum_bitwise_like_the_reference_and_name_a_nan_sender():
    import torch

    from ml.allreduce.inbox import PeerFailure
    from ml.allreduce.payloads import decode_into, encode_local, encode_result, sum_in_order
    from ml.codecs import get_codec

    codec = get_codec("fp32")
    xs = [torch.randn(1000, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    wire = [b"".join(bytes(p) for p in encode_local(codec, x, "me")) for x in xs]
    assert wire[1] == codec.encode(xs[1])  # same bytes as the codec, without the copy
    terms = [("a", wire[0]), ("b", wire[1]), ("me", xs[2]), ("d", wire[3])]
    acc = sum_in_order(codec, terms, "me", "contribution", 1000)
    reference = xs[0].clone().add_(xs[1]).add_(xs[2]).add_(xs[3])
    assert torch.equal(acc, reference)
    payload, mean = encode_result(codec, acc.div_(4))
    out = torch.empty(1000)
    decode_into(codec, b"".join(bytes(p) for p in payload), out, "a", "result")
    assert torch.equal(out, mean)
    bad = xs[3].clone()
    bad[7] = float("nan")
    terms[3] = ("d", b"".join(bytes(p) for p in encode_local(codec, bad, "me")))
    with pytest.raises(PeerFailure) as failure:
        sum_in_order(codec, terms, "me", "contribution", 1000)
    assert failure.value.peer == "d" and "NaN" in failure.value.reason
    with pytest.raises(PeerFailure, match="malformed"):
        sum_in_order(codec, [("a", wire[0][:-4]), ("me", xs[2])], "me", "contribution", 1000)


def test_lossy_payloads_sum_decoded_terms_in_order():
    import torch

    from ml.allreduce.payloads import encode_local, sum_in_order
    from ml.codecs import get_codec

    codec = get_codec("int8")
    xs = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    terms = [("a", encode_local(codec, xs[0], "me")), ("me", xs[1]), ("c", encode_local(codec, xs[2], "me"))]
    before = xs[1].clone()
    acc = sum_in_order(codec, terms, "me", "contribution", 4096)
    reference = codec.decode(terms[0][1], 4096).add_(xs[1]).add_(codec.decode(terms[2][1], 4096))
    assert torch.equal(acc, reference) and torch.equal(xs[1], before)  # local values untouched


class _RecordingStream:
    """A stream whose writes wait for `open_gate` and are then recorded, frame by frame."""

    def __init__(self, gate):
        self.gate = gate
        self.frames = []

    async def write(self, data):
        await self.gate.wait()
        if len(data) >= HEADER_SIZE:
            header = parse_header(bytes(data[:HEADER_SIZE]))
            self.frames.append((header.kind, header.round_id, header.attempt, header.chunk))

    async def close(self):
        pass

    def reset(self):
        pass


def test_links_send_a_committed_attempts_queued_frames_after_later_rounds_start_and_skip_abandoned_ones():
    """The agreement bug of docs/adr/0090: a reducer that commits round 1 with its last RESULT
    frames still queued, then starts round 2, must still deliver them (only abandoned attempts'
    data frames are skipped), or a slower member waits for them forever."""
    import asyncio

    from ml.allreduce.links import PeerLinks

    async def main():
        gate = asyncio.Event()
        stream = _RecordingStream(gate)

        class Transport:
            async def open_stream(self, peer, protocol):
                return stream

        links = PeerLinks(Transport(), "/test", lambda peer, reason: None)
        frames = [Frame(Kind.PART, 1, 0, 0, 0), Frame(Kind.VIEW, 1, 0, 0, 0),   # attempt 0 failed
                  Frame(Kind.RESULT, 1, 1, 0, 0), Frame(Kind.RESULT, 1, 1, 0, 1),  # attempt 1 committed
                  Frame(Kind.PART, 2, 0, 0, 0)]                                      # the next round
        for frame in frames:
            await links.send("b", frame)
        links.abandon(1, 0)
        gate.set()
        await links.flush(5.0)
        await links.close()
        return stream.frames

    assert asyncio.run(main()) == [(Kind.VIEW, 1, 0, 0), (Kind.RESULT, 1, 1, 0), (Kind.RESULT, 1, 1, 1),
                                   (Kind.PART, 2, 0, 0)]


def test_links_skip_queued_data_frames_of_an_abandoned_attempt():
    import asyncio

    from ml.allreduce.links import PeerLinks

    async def main():
        gate = asyncio.Event()
        stream = _RecordingStream(gate)

        class Transport:
            async def open_stream(self, peer, protocol):
                return stream

        links = PeerLinks(Transport(), "/test", lambda peer, reason: None)
        await links.send("b", Frame(Kind.PING, 3, 0, 0, 0))  # occupies the writer
        await asyncio.sleep(0)
        for chunk in range(3):
            await links.send("b", Frame(Kind.RESULT, 3, 0, 0, chunk))
        await links.send("b", Frame(Kind.VIEW, 3, 0, 0, 0))
        links.abandon(3, 0)
        gate.set()
        await links.flush(5.0)
        await links.close()
        return stream.frames

    assert asyncio.run(main()) == [(Kind.PING, 3, 0, 0), (Kind.VIEW, 3, 0, 0)]


def test_a_sender_busy_with_a_later_round_does_not_keep_a_wait_on_it_alive():
    """Frames of a later round do not show a sender alive in ours: it has finished ours, and the
    wait must end (its VIEW then gets the committed result). Frames of an earlier round do."""
    import asyncio

    from ml.allreduce.inbox import Inbox, PeerFailure

    async def wait_while(sender_round):
        inbox = Inbox(StallEstimator(DeadlinePolicy()))
        loop = asyncio.get_running_loop()

        async def chatter():
            for _ in range(100):   # 2 s at least
                inbox.put("x", Frame(Kind.PING, sender_round, 0, 0, 0))
                await asyncio.sleep(0.02)
            inbox.put("x", Frame(Kind.RESULT, 1, 0, 0, 0))

        task = asyncio.ensure_future(chatter())
        start = loop.time()
        try:
            await inbox.take((1, 0, Kind.RESULT, 0, 0, "x"), start, 0.3)
            outcome = "frame"
        except PeerFailure as exc:
            outcome = exc.reason
        task.cancel()
        return outcome, loop.time() - start

    outcome, seconds = asyncio.run(wait_while(2))
    assert outcome.startswith("stalled") and 0.25 < seconds < 1.5
    outcome, seconds = asyncio.run(wait_while(1))  # its PINGs of round 1 keep it alive
    assert outcome == "frame" and seconds > 1.9
    outcome, seconds = asyncio.run(wait_while(0))  # still finishing round 0: on its way to ours
    assert outcome == "frame" and seconds > 0.7


def test_only_the_data_flow_sets_the_stall_timeout():
    """A VIEW arrives after a stall was waited out: that gap must not stretch later deadlines."""
    import asyncio

    from ml.allreduce.inbox import Inbox

    async def main():
        policy = DeadlinePolicy(floor_s=0.1, multiplier=8.0, initial_s=5.0)
        estimator = StallEstimator(policy)
        inbox = Inbox(estimator)
        inbox.put("x", Frame(Kind.PART, 0, 0, 0, 0))
        await asyncio.sleep(0.2)
        inbox.put("x", Frame(Kind.VIEW, 0, 0, 0, 0))
        inbox.put("x", Frame(Kind.COMMITTED, 0, 0, 0, 0))
        assert estimator.stall_timeout() == policy.initial_s  # nothing learned yet
        inbox.put("x", Frame(Kind.RESULT, 0, 0, 0, 0))
        assert 8 * 0.2 <= estimator.stall_timeout() < 8 * 0.5

    asyncio.run(main())
