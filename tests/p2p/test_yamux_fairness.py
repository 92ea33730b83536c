"""Fairness of concurrent yamux streams under receive-window auto-tuning.

Two levels, neither timed: (1) the sans-I/O sessions pushed through a simulated FIFO bottleneck
link (a fixed number of bytes per tick, window updates and pongs coming back after a delay), with
a fast reader: bytes per stream after a fixed total, and a lone stream that must grow its window
to fill the link; (2) the asyncio driver, where 8 writers with large windows share one connection
whose reader is the bottleneck: the longest run of one stream's bytes, and bytes per stream over
a fixed total.
"""
import asyncio
from collections import deque

from node.p2p import muxer
from node.p2p import yamux as y
from node.p2p.muxer import MuxedConnection
from node.p2p.yamux import DataReceived, YamuxSession

MIB = 1 << 20
TICK = 0.001  # seconds of simulated time per tick


def jain(counts) -> float:
    return sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))


class Bottleneck:
    """Sender sessions -> one FIFO link (``rate`` bytes per tick) -> receiver sessions; the
    receivers' frames return after ``delay`` ticks. Writers always have data (as much as their
    send window allows, in 64 KiB turns); readers consume everything at once."""

    def __init__(self, pairs, rate: int, delay: int) -> None:
        self.pairs = pairs  # [(sender, receiver, [stream ids])]
        self.rate, self.delay = rate, delay
        self.link: deque[tuple[int, bytes]] = deque()  # (pair index, bytes), in sending order
        self.back: deque[tuple[int, int, bytes]] = deque()  # (due tick, pair index, bytes)
        self.delivered: dict[tuple[int, int], int] = {}
        self.tick = 0

    def run_until(self, total: int) -> None:
        payload = bytes(64 * 1024)
        while sum(self.delivered.values()) < total:
            now = self.tick * TICK
            while self.back and self.back[0][0] <= self.tick:
                _, i, data = self.back.popleft()
                self.pairs[i][0].receive_data(data, now)
            progress = True
            while progress:  # writers take 64 KiB turns while any has send window
                progress = False
                for sender, _, sids in self.pairs:
                    for sid in sids:
                        progress |= sender.send_data(sid, payload[:sender.send_window(sid)]) > 0
            for i, (sender, _, _) in enumerate(self.pairs):
                if out := sender.data_to_send():
                    self.link.append((i, out))
            budget = self.rate
            while budget and self.link:
                i, data = self.link.popleft()
                if len(data) > budget:
                    self.link.appendleft((i, data[budget:]))
                    data = data[:budget]
                budget -= len(data)
                receiver = self.pairs[i][1]
                for event in receiver.receive_data(data, now):
                    if type(event) is DataReceived:
                        key = (i, event.stream_id)
                        self.delivered[key] = self.delivered.get(key, 0) + len(event.data)
                        receiver.acknowledge_received(event.stream_id, len(event.data), now)
            for i, (_, receiver, _) in enumerate(self.pairs):
                if out := receiver.data_to_send():
                    self.back.append((self.tick + self.delay, i, out))
            self.tick += 1


def open_streams(sender: YamuxSession, receiver: YamuxSession, count: int) -> list[int]:
    sids = [sender.open_stream() for _ in range(count)]
    receiver.receive_data(sender.data_to_send(), 0.0)
    sender.receive_data(receiver.data_to_send(), 0.0)
    return sids


def test_eight_streams_on_one_connection_share_a_bottleneck_fairly():
    sender, receiver = YamuxSession(True), YamuxSession(False)
    net = Bottleneck([(sender, receiver, open_streams(sender, receiver, 8))], rate=256 * 1024, delay=5)
    net.run_until(96 * MIB)
    counts = list(net.delivered.values())
    assert len(counts) == 8 and jain(counts) >= 0.9, [c // MIB for c in counts]
    windows = {receiver.receive_window(sid) for sid in net.pairs[0][2]}
    assert max(windows) > y.INITIAL_WINDOW  # auto-tuning did grow them, and evenly:
    assert max(windows) <= 2 * min(windows), windows


def test_eight_connections_through_one_bottleneck_share_fairly_with_a_host_tuner():
    tuner = y.WindowTuner(256 * MIB)
    pairs = []
    for _ in range(8):
        sender, receiver = YamuxSession(True), YamuxSession(False, window_tuner=tuner)
        pairs.append((sender, receiver, open_streams(sender, receiver, 1)))
    net = Bottleneck(pairs, rate=256 * 1024, delay=5)
    net.run_until(96 * MIB)
    counts = list(net.delivered.values())
    assert len(counts) == 8 and jain(counts) >= 0.9, [c // MIB for c in counts]


def test_a_lone_stream_grows_its_window_to_fill_the_link():
    sender, receiver = YamuxSession(True), YamuxSession(False)
    [sid] = open_streams(sender, receiver, 1)
    rate, delay = 256 * 1024, 5  # 256 MB/s, >= 5 ms RTT: 256 KiB windows would give <= 1/5 of it
    net = Bottleneck([(sender, receiver, [sid])], rate=rate, delay=delay)
    net.run_until(32 * MIB)
    start_tick, start_bytes = net.tick, sum(net.delivered.values())
    net.run_until(start_bytes + 64 * MIB)
    per_tick = (sum(net.delivered.values()) - start_bytes) / (net.tick - start_tick)
    assert per_tick >= 0.9 * rate
    assert receiver.receive_window(sid) >= 4 * y.INITIAL_WINDOW


# ------------------------------------------------------------------ the asyncio driver

class SlowPipeEnd:
    """An in-memory secured-connection end; reading costs one event-loop turn per 64 KiB."""

    def __init__(self, inbox: asyncio.Queue, outbox: asyncio.Queue) -> None:
        self._inbox, self._outbox = inbox, outbox

    async def read(self) -> bytes:
        data = await self._inbox.get()
        await asyncio.sleep(0)  # the bottleneck: the reader is slower than the writers
        return data

    async def write(self, parts) -> None:
        data = b"".join(parts)
        for i in range(0, len(data), 65536):
            await self._outbox.put(data[i:i + 65536])

    async def close(self) -> None:
        self._outbox.put_nowait(b"")
        self._inbox.put_nowait(b"")


def test_concurrent_writers_on_one_connection_take_short_turns(monkeypatch):
    """8 streams with large windows write at once over a connection whose reader is the
    bottleneck. A writer woken when the outbound queue has room must queue up behind the others
    after filling it, not keep the connection for as long as its send window lasts (megabytes)."""
    monkeypatch.setattr(y, "_MIN_TUNING_RTT", 1.0)  # a long-RTT path: windows grow to the maximum
    monkeypatch.setattr(muxer, "OUTBOUND_HIGH_WATER", 256 * 1024)  # short turns, short test
    warm_up, measured = 16 * MIB, 8 * MIB

    async def main():
        a_to_b, b_to_a = asyncio.Queue(16), asyncio.Queue(16)
        received: dict[int, int] = {}
        runs = [[0, 0]]  # [stream id, bytes] of consecutive reads from one stream
        snapshot: dict[int, int] = {}
        done = asyncio.Event()

        async def count(stream) -> None:
            while data := await stream.read():
                received[stream.stream_id] = received.get(stream.stream_id, 0) + len(data)
                total = sum(received.values())
                if total >= warm_up:
                    if not snapshot:
                        snapshot.update(received)
                        snapshot[0] = 0
                    if runs[-1][0] == stream.stream_id:
                        runs[-1][1] += len(data)
                    else:
                        runs.append([stream.stream_id, len(data)])
                if total >= warm_up + measured:
                    done.set()

        options = {"max_window": 16 * MIB, "keepalive_interval": 0}
        a = MuxedConnection(SlowPipeEnd(b_to_a, a_to_b), True, None, **options)
        b = MuxedConnection(SlowPipeEnd(a_to_b, b_to_a), False, count, **options)
        await a.start()
        await b.start()
        streams = [await a.open_stream() for _ in range(8)]
        payload = bytes(64 * 1024)

        async def write_forever(stream) -> None:
            while True:
                await stream.write(payload)

        writers = [asyncio.create_task(write_forever(s)) for s in streams]
        await done.wait()
        shares = [received.get(s.stream_id, 0) - snapshot.get(s.stream_id, 0) for s in streams]
        windows = [b._session.receive_window(s.stream_id) for s in streams]
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        await a.close()
        await b.close()
        return shares, max(size for _, size in runs), windows

    shares, longest_run, windows = asyncio.run(asyncio.wait_for(main(), 60))
    assert min(windows) >= 4 * muxer.OUTBOUND_HIGH_WATER  # windows do not end the turns
    assert longest_run <= 1 * MIB, longest_run
    assert jain(shares) >= 0.9, [round(c / MIB, 2) for c in shares]
