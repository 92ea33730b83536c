"""All-reduce among 2-4 in-process peers over loopback TCP: exact means, codec error bounds, uneven
shards, non-reducers, rate agreement, joins, and exclusion of stalled, garbage, NaN and wrong-shape
peers."""
import asyncio
import re
import time

import loopback_groups
import pytest
import torch
from loopback_groups import close_all, ids, run

from ml.allreduce import (
    AllReduceError,
    AllReduceGroup,
    DeadlinePolicy,
    ExcludedFromRound,
    PowerSGDAllReduce,
    TcpTransport,
)
from ml.allreduce.plan import make_plan
from ml.allreduce.transport import PeerUnreachable
from ml.allreduce.wire import HEADER, VERSION, Frame, Kind, encode_frame
from ml.codecs.base import CODEC_IDS, pack_header

FAST = DeadlinePolicy(floor_s=0.5, initial_s=1.0, first_frame_grace_s=0.5, ceiling_s=5.0)
CHUNK = 1024


async def make_groups(n, names=None, **kwargs):
    kwargs.setdefault("chunk_numel", CHUNK)
    kwargs.setdefault("deadlines", DeadlinePolicy())
    return await loopback_groups.make_groups(n, names, **kwargs)


def contributions(n, numel, seed=0):
    return [torch.randn(numel, generator=torch.Generator().manual_seed(seed + i)) for i in range(n)]


def mean_in_order(xs):
    acc = xs[0].clone()
    for x in xs[1:]:
        acc.add_(x)
    return acc.div_(len(xs))


def flat(result):
    return torch.cat([t.reshape(-1) for t in result.tensors])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_butterfly_fp32_mean_is_bitwise_the_sorted_order_sum(n):
    async def main():
        groups, transports = await make_groups(n)
        xs = contributions(n, 5000 + 330)
        shapes = [(10, 33), (5000,)]
        try:
            results = await asyncio.gather(*(
                g.allreduce([x[:330].view(10, 33), x[330:]], 7) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        expected = mean_in_order(xs)
        for r in results:
            assert [tuple(t.shape) for t in r.tensors] == shapes
            assert torch.equal(flat(r), expected)
            assert r.participants == tuple(ids(n)) and r.excluded == {} and r.attempts == 1
            assert r.round_id == 7 and r.bytes_sent > 0
    run(main())


def test_ring_fp32_with_uneven_shards_is_exact_in_ring_order():
    n, numel = 3, 9000
    rates = {"peer0": 1e6, "peer1": 3e6, "peer2": 2e6}
    plan = make_plan(ids(n), set(), rates, numel, CHUNK, "fp32")
    sizes = [b - a for a, b in plan.shards]
    assert len(set(sizes)) == 3 and sizes[1] > sizes[2] > sizes[0]

    async def main():
        groups, transports = await make_groups(n, mode="ring", upload_rates=rates)
        xs = contributions(n, numel, seed=10)
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        expected = torch.empty(numel)
        for s, (a, b) in enumerate(plan.shards):  # shard s is summed starting at member s
            acc = xs[s][a:b].clone()
            for k in range(1, n):
                acc = acc + xs[(s + k) % n][a:b]
            expected[a:b] = acc / n
        for r in results:
            assert torch.equal(flat(r), expected)
            assert r.participants == tuple(ids(n))
    run(main())


def test_butterfly_uneven_shards_with_a_non_reducer():
    n, numel = 4, 12345
    rates = {"peer0": 5e6, "peer1": 1e6, "peer2": 2e6, "peer3": 9e6}
    plan = make_plan(ids(n), {"peer3"}, rates, numel, CHUNK, "fp32")
    assert plan.reducers == ("peer0", "peer1", "peer2")
    assert [b - a for a, b in plan.shards][0] > 4 * [b - a for a, b in plan.shards][1] // 2

    async def main():
        groups, transports = await make_groups(n, non_reducers={"peer3"}, upload_rates=rates)
        xs = contributions(n, numel, seed=20)
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        for r in results:
            assert torch.equal(flat(r), mean_in_order(xs))
        # the non-reducer sent only its contribution (about numel fp32 values), no results
        assert results[3].bytes_sent < numel * 4 * 1.05
    run(main())


@pytest.mark.parametrize("codec,bound", [("fp16", 1e-3), ("bf16", 6e-3), ("int8", 1.5e-2), ("int4", 0.25)])
def test_codec_error_bound_and_identical_results(codec, bound):
    async def main():
        groups, transports = await make_groups(4, codec=codec)
        xs = contributions(4, 20000, seed=30)
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        exact = mean_in_order(xs)
        err = float((flat(results[0]) - exact).norm() / exact.norm())
        assert 0 < err < bound
        assert all(torch.equal(flat(r), flat(results[0])) for r in results)
    run(main())


def test_int8_error_does_not_grow_with_group_size():
    async def rel_err(n):
        groups, transports = await make_groups(n, codec="int8")
        xs = contributions(n, 20000, seed=40)
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        exact = mean_in_order(xs)
        return float((flat(results[0]) - exact).norm() / exact.norm())

    e2, e4, e8 = (run(rel_err(n)) for n in (2, 4, 8))
    assert e4 < 1.25 * e2 and e8 < 1.25 * e2


def test_agreed_upload_rates_and_join_between_rounds():
    async def main():
        groups, transports = await make_groups(4)
        xs = contributions(4, 300_000, seed=50)
        for g in groups[:3]:
            g.set_peers(ids(3))
        try:
            for round_id in (0, 1):  # round 0 measures, round 1 shares the measurements
                first = await asyncio.gather(*(g.allreduce([x], round_id) for g, x in zip(groups[:3], xs)))
            rates = [g.upload_rates for g in groups[:3]]  # measured by reducer 0 (peer0) for the others
            assert set(rates[0]) == {"peer1", "peer2"} and all(r == rates[0] for r in rates)
            for g in groups:
                g.set_peers(ids(4))  # peer3 joins between rounds
            second = await asyncio.gather(*(g.allreduce([x], 2) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        assert all(torch.equal(flat(r), mean_in_order(xs[:3])) for r in first)
        assert all(torch.equal(flat(r), mean_in_order(xs)) and r.participants == tuple(ids(4)) for r in second)
    run(main())


def test_stalled_peer_is_excluded_within_deadline():
    async def main():
        groups, transports = await make_groups(4, deadlines=FAST)
        xs = contributions(4, 50_000, seed=60)
        start = time.monotonic()
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups[:3], xs)))
        finally:
            await close_all(groups, transports)
        assert time.monotonic() - start < 8
        for r in results:
            assert r.participants == tuple(ids(3)) and r.attempts == 2
            assert "stalled" in r.excluded["peer3"]
            assert torch.equal(flat(r), mean_in_order(xs[:3]))
    run(main())


def test_local_nan_excludes_that_peer_and_it_is_told():
    async def main():
        groups, transports = await make_groups(4)
        xs = contributions(4, 20_000, seed=70)
        xs[2][123] = float("nan")
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)),
                                           return_exceptions=True)
        finally:
            await close_all(groups, transports)
        assert isinstance(results[2], ExcludedFromRound) and "non-finite" in results[2].reason
        for r in (results[0], results[1], results[3]):
            assert r.participants == ("peer0", "peer1", "peer3")
            assert "non-finite" in r.excluded["peer2"]
            assert torch.equal(flat(r), mean_in_order([xs[0], xs[1], xs[3]]))
    run(main())


class _NaNSendingCodec:
    """A faulty peer's fp32 'codec': a well-formed header over NaN payloads."""
    name = "fp32"

    def __init__(self, real):
        self._real = real

    def encode(self, x):
        return pack_header(CODEC_IDS["fp32"], 0, 0, x.numel()) + torch.full_like(x, float("nan")).numpy().tobytes()

    def decode(self, data, numel):
        return self._real.decode(data, numel)

    def max_encoded_size(self, numel):
        return self._real.max_encoded_size(numel)


@pytest.mark.parametrize("mode", ["butterfly", "ring"])
def test_peer_sending_nan_is_excluded_and_reported(mode):
    async def main():
        groups, transports = await make_groups(3 if mode == "ring" else 4, mode=mode)
        n = len(groups)
        groups[1]._codec = _NaNSendingCodec(groups[1]._codec)
        xs = contributions(n, 20_000, seed=80)
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)),
                                           return_exceptions=True)
        finally:
            await close_all(groups, transports)
        honest = [r for i, r in enumerate(results) if i != 1]
        for r in results:   # peer1's own values were finite: it takes the others' result (docs/adr/0242)
            assert "peer1" not in r.participants and "NaN" in r.excluded["peer1"]
            assert torch.equal(flat(r), flat(honest[0]))
        if mode == "butterfly":
            assert torch.equal(flat(honest[0]), mean_in_order([xs[0], xs[2], xs[3]]))
    run(main())


def test_wrong_shape_contribution_is_excluded():
    async def main():
        groups, transports = await make_groups(4)
        xs = contributions(4, 110, seed=90)
        tensors = [[x.view(11, 10)] for x in xs]
        tensors[3] = [xs[3].view(10, 11)]
        try:
            results = await asyncio.gather(*(g.allreduce(t, 0) for g, t in zip(groups, tensors)),
                                           return_exceptions=True)
        finally:
            await close_all(groups, transports)
        assert isinstance(results[3], AllReduceError)
        for r in results[:3]:
            assert r.participants == tuple(ids(3)) and "wrong-shape" in r.excluded["peer3"]
            assert r.tensors[0].shape == (11, 10)
    run(main())


async def _fake_peer_sends(transport, targets, payload_for):
    for target in targets:
        stream = await transport.open_stream(target, "/dekube/allreduce/1")
        await stream.write(payload_for(target))


@pytest.mark.parametrize("junk,reason", [
    (b"\x07garbage that is not a frame at all" * 3, "bad frame"),
    (HEADER.pack(VERSION, int(Kind.PART), 0, 0, 0, 0, 0, 1 << 30), "oversized"),
])
def test_garbage_or_oversized_frames_exclude_the_sender(junk, reason):
    async def main():
        groups, transports = await make_groups(3, names=ids(4))  # peer3 is the faulty one
        faulty = TcpTransport("peer3", addresses={t.my_id: t.listen_address for t in transports})
        xs = contributions(3, 20_000, seed=100)
        start = time.monotonic()
        try:
            await _fake_peer_sends(faulty, ids(3), lambda _: junk)
            await asyncio.sleep(0.2)
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        assert time.monotonic() - start < 8
        for r in results[:3]:
            assert r.participants == tuple(ids(3)) and reason in r.excluded["peer3"]
            assert torch.equal(flat(r), mean_in_order(xs))
    run(main())


def test_frames_from_strangers_are_ignored():
    async def main():
        groups, transports = await make_groups(2)
        stranger = TcpTransport("mallory", addresses={t.my_id: t.listen_address for t in transports})
        xs = contributions(2, 5000, seed=110)
        bogus = b"".join(encode_frame(Frame(Kind.COMMITTED, 0, 0, 0, 0, {"numel": 5000}, b"\0" * 16)))
        try:
            await _fake_peer_sends(stranger, ids(2), lambda _: bogus)
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
        finally:
            await close_all(groups, transports)
        assert all(torch.equal(flat(r), mean_in_order(xs)) and r.attempts == 1 for r in results)
    run(main())


def test_survivors_adopt_a_result_committed_by_a_member_that_saw_the_dead_reducer_finish():
    """Reducer peer3 sends its results to peer0 only, then dies: peer0 commits, the others time out
    on peer3, send VIEWs, and adopt peer0's commit instead of re-running without peer3."""
    async def main():
        groups, transports = await make_groups(4)
        victim = groups[3]
        real_send = victim._links.send
        sent_to_peer0 = []

        async def selective_send(peer, frame):
            if frame.kind == Kind.RESULT:
                if peer != "peer0":
                    return
                sent_to_peer0.append(frame.chunk)
            await real_send(peer, frame)

        victim._links.send = selective_send
        xs = contributions(4, 40_000, seed=120)

        async def victim_round():
            task = asyncio.ensure_future(victim.allreduce([xs[3]], 0))
            while len(sent_to_peer0) < len(make_plan(ids(4), set(), {}, 40_000, CHUNK, "fp32").chunks(3)):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # let the last frames drain
            task.cancel()
            await victim.close()
            await transports[3].close()

        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups[:3], xs)), victim_round())
        finally:
            await close_all(groups[:3], transports[:3])
        for r in results[:3]:
            assert r.participants == tuple(ids(4)) and r.attempts == 1
            assert torch.equal(flat(r), mean_in_order(xs))
    run(main())


class _ResultsHeldTransport:
    """Wraps a transport: RESULT frames of round 0 stay in the sender's queue until `release`."""

    def __init__(self, inner):
        self.inner = inner
        self.release = asyncio.Event()

    def set_handler(self, protocol, handler):
        self.inner.set_handler(protocol, handler)

    async def open_stream(self, peer, protocol):
        return _ResultsHeldStream(await self.inner.open_stream(peer, protocol), self.release)


class _ResultsHeldStream:
    def __init__(self, inner, release):
        self._inner = inner
        self._release = release
        self._payload_left = 0  # bytes of the current frame's payload still to be written

    async def write(self, data):
        if self._payload_left == 0:  # a frame's first buffer: header and meta
            _, kind, round_id, *_, meta_len, payload_len = HEADER.unpack(bytes(data[:HEADER.size]))
            self._payload_left = payload_len
            if kind == Kind.RESULT and round_id == 0:
                await self._release.wait()
        else:
            self._payload_left -= len(data)
        await self._inner.write(data)

    async def close(self):
        await self._inner.close()

    def reset(self):
        self._inner.reset()


def test_a_reducer_that_commits_and_starts_the_next_round_still_delivers_its_queued_results():
    """docs/adr/0090: peer0 commits round 0 while its results for peer1 are still queued, and
    starts round 1 at once. Those results must still go out (they used to be dropped as frames of
    an old round, and peer1 waited on peer0 forever, kept 'alive' by its round-1 PINGs)."""
    async def main():
        names = ids(2)
        transports = await loopback_groups.start_transports(names)
        held = _ResultsHeldTransport(transports[0])
        # peer1 only contributes, so all that peer0 sends it in round 0 is its results
        groups = [AllReduceGroup(tr, name, names, chunk_numel=CHUNK, deadlines=FAST, non_reducers={"peer1"})
                  for tr, name in zip([held, transports[1]], names)]
        for g in groups:
            await g.start()
        xs = contributions(2, 3 * CHUNK, seed=130)  # 3 result chunks: all fit in the send queue
        ys = contributions(2, 3 * CHUNK, seed=140)
        try:
            late = asyncio.ensure_future(groups[1].allreduce([xs[1]], 0))
            first = await groups[0].allreduce([xs[0]], 0)  # its results for peer1 are held
            next_round = asyncio.ensure_future(groups[0].allreduce([ys[0]], 1))
            await asyncio.sleep(0.2)  # peer0 is in round 1 now
            held.release.set()
            results = [first, await late]
            results += await asyncio.gather(next_round, groups[1].allreduce([ys[1]], 1))
        finally:
            await close_all(groups, transports)
        for r, expected in zip(results, [xs, xs, ys, ys]):
            assert r.participants == tuple(names) and r.attempts == 1
            assert torch.equal(flat(r), mean_in_order(expected))
    run(main(), timeout=30)


class _StoppedPeerTransport:
    """Wraps a transport: writes to `stopped` block forever after its first frame, as to a
    SIGSTOPped process whose socket buffers filled up."""

    def __init__(self, inner, stopped):
        self.inner = inner
        self.stopped = stopped

    def set_handler(self, protocol, handler):
        self.inner.set_handler(protocol, handler)

    async def open_stream(self, peer, protocol):
        stream = await self.inner.open_stream(peer, protocol)
        return _BlockingStream(stream) if peer == self.stopped else stream


class _BlockingStream:
    def __init__(self, inner):
        self._inner = inner
        self._writes = 0

    async def write(self, data):
        self._writes += 1
        if self._writes > 1:
            await asyncio.Event().wait()
        await self._inner.write(data)

    async def close(self):
        await self._inner.close()

    def reset(self):
        self._inner.reset()


@pytest.mark.parametrize("mode", ["butterfly", "ring"])
def test_a_member_that_stops_reading_is_excluded_without_holding_up_the_others(mode):
    """docs/adr/0093: peer2 freezes (SIGSTOP): sends to it block once its buffers are full. The
    VIEWs to the others must still go out (they used to wait behind the one to peer2: a hang)."""
    async def main():
        names = ids(3)
        transports = await loopback_groups.start_transports(names)
        wrapped = [_StoppedPeerTransport(t, "peer2") for t in transports[:2]]
        groups = [AllReduceGroup(t, name, names, mode=mode, chunk_numel=CHUNK, deadlines=FAST)
                  for t, name in zip(wrapped, names)]
        for g in groups:
            await g.start()
        xs = contributions(2, 40 * CHUNK, seed=150)
        start = time.monotonic()
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)))
            seconds = time.monotonic() - start
        finally:
            for g in groups:
                await g.close(linger_s=0.5)
            for t in transports:
                await t.close()
        assert seconds < 8
        for r in results:
            assert r.participants == ("peer0", "peer1") and "stalled" in r.excluded["peer2"]
            assert torch.equal(flat(r), mean_in_order(xs))
    run(main(), timeout=30)


def test_after_a_round_that_left_someone_out_every_member_plans_from_the_same_rates():
    """A member excluded from a round keeps no newer rate table than the others: all start over
    from even shards, so the next round's plans agree (it used to be excluded again for
    'plan differs over the same members')."""
    async def main():
        groups, transports = await make_groups(4)
        try:
            for round_id in range(3):
                xs = contributions(4, 64 * CHUNK, seed=160 + round_id)
                if round_id == 1:
                    xs[2][7] = float("nan")
                results = await asyncio.gather(*(g.allreduce([x], round_id) for g, x in zip(groups, xs)),
                                               return_exceptions=True)
                if round_id == 1:
                    assert isinstance(results[2], ExcludedFromRound)
                    assert all(g.upload_rates == {} for g in groups)
                else:
                    assert all(r.participants == tuple(ids(4)) and r.attempts == 1 for r in results)
                    assert all(g.upload_rates == groups[0].upload_rates for g in groups)
        finally:
            await close_all(groups, transports)
    run(main())


def test_round_ids_must_increase():
    async def main():
        groups, transports = await make_groups(2)
        try:
            await asyncio.gather(*(g.allreduce([torch.ones(10)], 5) for g in groups))
            with pytest.raises(ValueError):
                await groups[0].allreduce([torch.ones(10)], 5)
        finally:
            await close_all(groups, transports)
    run(main())


def test_ring_rejects_quantizing_codecs_and_non_reducers():
    t = TcpTransport("peer0")
    with pytest.raises(ValueError):
        AllReduceGroup(t, "peer0", ids(2), mode="ring", codec="int8")
    with pytest.raises(ValueError):
        AllReduceGroup(t, "peer0", ids(2), mode="ring", non_reducers={"peer1"})
    with pytest.raises(ValueError):
        AllReduceGroup(t, "peer9", ids(2))


def test_powersgd_allreduce_recovers_a_low_rank_mean_identically_everywhere():
    async def main():
        groups, transports = await make_groups(3)
        basis = torch.randn(200, 2, generator=torch.Generator().manual_seed(1))
        grads = [basis @ torch.randn(2, 100, generator=torch.Generator().manual_seed(10 + i)) for i in range(3)]
        reducers = [PowerSGDAllReduce(g, [(200, 100)], rank=4, seed=5) for g in groups]
        try:
            results = await asyncio.gather(*(r.allreduce([m], 0) for r, m in zip(reducers, grads)))
        finally:
            await close_all(groups, transports)
        exact = mean_in_order(grads)
        approx = results[0].tensors[0]
        assert approx.shape == (200, 100)
        assert float((approx - exact).norm() / exact.norm()) < 1e-4
        assert all(torch.equal(r.tensors[0], approx) for r in results)
        assert results[0].participants == tuple(ids(3))
        assert results[0].bytes_sent < 200 * 100 * 4 // 4  # far less than the dense matrix
    run(main())


def test_tcp_stream_reads_small_and_large_pieces_exactly_and_reports_a_cut_read():
    DIRECT_READ_BYTES = 64 << 10  # noqa: N806 - sizes around a threshold a buffered reader may use
    sizes = [1, 30, DIRECT_READ_BYTES - 1, DIRECT_READ_BYTES, 3 * DIRECT_READ_BYTES + 5, 7, 5 << 20]
    blobs = [bytes((i + k) % 251 for k in range(n)) for i, n in enumerate(sizes)]

    async def main():
        got, ended = [], asyncio.get_running_loop().create_future()

        async def handler(stream, remote):
            for n in sizes:
                got.append(bytes(await stream.readexactly(n)))
            try:
                await stream.readexactly(DIRECT_READ_BYTES * 2)
            except asyncio.IncompleteReadError as exc:
                ended.set_result(len(exc.partial))

        server, client = TcpTransport("s"), TcpTransport("c")
        server.set_handler("/t", handler)
        client.addresses["s"] = await server.start()
        stream = await client.open_stream("s", "/t")
        for blob in blobs:
            await stream.write(memoryview(blob))
        await stream.write(b"x" * 1000)
        await stream.close()
        assert await asyncio.wait_for(ended, 10) == 1000
        await server.close()
        assert got == blobs

    run(main())


class _DeadPeerTransport:
    """Wraps a transport: opening a stream to `dead` fails only after `dial_s` (a dial to a host that is
    gone, which often ends in a connect timeout); counts those dials."""

    def __init__(self, inner, dead, dial_s):
        self.inner, self.dead, self.dial_s, self.dials = inner, dead, dial_s, 0

    def set_handler(self, protocol, handler):
        self.inner.set_handler(protocol, handler)

    async def open_stream(self, peer, protocol):
        if peer == self.dead:
            self.dials += 1
            await asyncio.sleep(self.dial_s)
            raise PeerUnreachable(f"could not dial {peer}: TimeoutError")
        return await self.inner.open_stream(peer, protocol)


def test_rounds_after_a_member_died_do_not_dial_it_again_each_round(monkeypatch):
    """docs/adr/0238: a member that died stays in the group until the crew changes; each round's first
    attempt includes it. Its first failed dial starts a backoff, so the next rounds' links to it fail at
    once (the round goes on over the others after one VIEW exchange) instead of each waiting out a dial."""
    from ml.allreduce import links

    monkeypatch.setattr(links, "BACKOFF_FIRST_S", 60.0)   # longer than the test: no re-dial in it

    async def main():
        names = ids(4)
        transports = await loopback_groups.start_transports(names[:3])
        wrapped = [_DeadPeerTransport(t, "peer3", dial_s=1.0) for t in transports]
        groups = [AllReduceGroup(t, name, names, chunk_numel=CHUNK, deadlines=FAST)
                  for t, name in zip(wrapped, names)]
        for g in groups:
            await g.start()
        xs = contributions(3, 4 * CHUNK, seed=170)
        seconds, results = [], []
        try:
            for round_id in range(4):
                start = time.monotonic()
                results.append(await asyncio.gather(*(g.allreduce([x], round_id) for g, x in zip(groups, xs))))
                seconds.append(time.monotonic() - start)
        finally:
            for g in groups:
                await g.close(linger_s=0.5)
            for t in transports:
                await t.close()
        return results, seconds, [t.dials for t in wrapped]

    results, seconds, dials = run(main(), timeout=60)
    for round_results in results:
        for r in round_results:
            assert r.participants == ("peer0", "peer1", "peer2") and r.attempts == 2, r
            assert "link failed" in r.excluded["peer3"]
    assert dials == [1, 1, 1], dials                   # before the backoff: one dial per round each (4)
    assert seconds[0] >= 1.0 and max(seconds[1:]) < seconds[0], seconds


def test_a_failed_open_backs_off_doubling_and_a_stream_from_the_peer_ends_it(monkeypatch):
    from ml.allreduce import links

    monkeypatch.setattr(links, "BACKOFF_FIRST_S", 0.2)
    monkeypatch.setattr(links, "BACKOFF_MAX_S", 5.0)

    async def main():
        opened, broken = [], []

        class Transport:
            async def open_stream(self, peer, protocol):
                opened.append(asyncio.get_running_loop().time())
                raise PeerUnreachable("gone")

        peer_links = links.PeerLinks(Transport(), "/test", lambda peer, reason: broken.append(reason))

        async def send_and_wait(count):
            await peer_links.send("b", Frame(Kind.PING, 1, 0, 0, 0))
            while len(broken) < count:
                await asyncio.sleep(0.005)

        await send_and_wait(1)            # dials: fails, backoff 0.2 s
        await send_and_wait(2)            # within it: fails at once, no dial
        assert len(opened) == 1 and "not dialed again" in broken[1]
        await asyncio.sleep(0.25)
        await send_and_wait(3)            # backoff over: dials again, fails, backoff 0.4 s (doubled)
        await send_and_wait(4)
        left = float(re.search(r"not dialed again for ([0-9.]+) s", broken[3]).group(1))
        assert len(opened) == 2 and 0.25 < left <= 0.4, broken[3]
        peer_links.reachable("b")         # it opened a stream to us: dial it at once next time
        await send_and_wait(5)
        await peer_links.close()
        return opened, broken

    opened, broken = run(main(), timeout=10)
    assert len(opened) == 3 and broken[4] == "link failed: PeerUnreachable: gone"


@pytest.mark.parametrize("mode", ["butterfly", "ring"])
def test_a_live_member_left_out_while_its_link_was_down_adopts_the_result_and_stays_in(mode):
    """docs/adr/0242: peer2's uplink drops in round 0, so the others go on without it; it is alive, and
    once its link is back it gets their result (the mean of peer0's and peer1's contributions, over the
    same participants) instead of ExcludedFromRound, and the next round has all three again."""
    async def main():
        names = ids(3)
        transports = await loopback_groups.start_transports(names)
        flaky = loopback_groups.LinkDropTransport(transports[2])
        groups = [AllReduceGroup(t, name, names, mode=mode, chunk_numel=CHUNK, deadlines=FAST)
                  for t, name in zip([*transports[:2], flaky], names)]
        for g in groups:
            await g.start()
        xs, ys = contributions(3, 40 * CHUNK, seed=170), contributions(3, 40 * CHUNK, seed=180)
        try:
            flaky.cut = True
            rounds = [asyncio.ensure_future(g.allreduce([x], 0)) for g, x in zip(groups, xs)]
            for _ in range(1500):    # until peer2 knows it cannot go on and the others went on without it
                core = groups[2]._core
                if (core is not None and core.round_id == 0 and core.shut_out is not None
                        and all(g._committed.rounds.get(0) for g in groups[:2])):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("peer2 was never left out")
            flaky.cut = False
            first = await asyncio.gather(*rounds)
            second = await asyncio.gather(*(g.allreduce([y], 1) for g, y in zip(groups, ys)))
        finally:
            for g in groups:
                await g.close(linger_s=0.5)
            for t in transports:
                await t.close()
        for r in first:
            assert r.participants == ("peer0", "peer1") and "peer2" in r.excluded
            assert torch.equal(flat(r), mean_in_order(xs[:2]))
        for r in second:   # (the ring sums in ring order: the same bits everywhere, not the sorted order's)
            assert r.participants == tuple(names) and torch.equal(flat(r), flat(second[0]))
            assert torch.allclose(flat(r), mean_in_order(ys), atol=1e-6)
    run(main(), timeout=60)


def test_a_member_whose_link_stays_down_fails_the_round_once_its_bounded_wait_for_a_result_ends():
    """peer2's link stays down: the others finish without it, their result never reaches it, and its
    wait for it ends (bounded) with the round's failure, as before docs/adr/0242 (alone: too few)."""
    async def main():
        names = ids(3)
        transports = await loopback_groups.start_transports(names)
        flaky = loopback_groups.LinkDropTransport(transports[2])
        groups = [AllReduceGroup(t, name, names, chunk_numel=CHUNK, deadlines=FAST, min_participants=2)
                  for t, name in zip([*transports[:2], flaky], names)]
        for g in groups:
            await g.start()
        xs = contributions(3, 8 * CHUNK, seed=190)
        flaky.cut = True     # and it stays down: peer2 never hears back
        started = time.monotonic()
        try:
            results = await asyncio.gather(*(g.allreduce([x], 0) for g, x in zip(groups, xs)),
                                           return_exceptions=True)
        finally:
            for g in groups:
                await g.close(linger_s=0.5)
            for t in transports:
                await t.close()
        assert [r.participants for r in results[:2]] == [("peer0", "peer1")] * 2
        assert isinstance(results[2], AllReduceError) and "only 1 members left" in str(results[2])
        assert time.monotonic() - started < 40
    run(main(), timeout=60)
