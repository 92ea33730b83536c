"""Transaction gossip: batch framing, junk frames, dedup, and two gossipers over an in-memory transport."""
import asyncio
import struct

import pytest

from consensus.txgossip import (
    MAX_BATCH_TXS,
    PROTOCOL,
    GossipFrameError,
    SeenCache,
    TxGossip,
    decode_batch,
    encode_batch,
)


def test_batch_round_trip():
    txs = [b"a", b"bb" * 100, bytes(range(256))]
    frame = encode_batch(txs)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert decode_batch(frame[4:]) == txs


@pytest.mark.parametrize("payload", [
    b"", b"\x00", b"\x00\x00",                                  # too short, zero transactions
    struct.pack(">H", MAX_BATCH_TXS + 1),                       # too many
    struct.pack(">HI", 1, 5) + b"abc",                          # truncated transaction
    struct.pack(">HI", 1, 0),                                   # empty transaction
    struct.pack(">HI", 1, 1) + b"ab",                           # trailing bytes
    struct.pack(">HI", 2, 1) + b"a",                            # count larger than contents
])
def test_malformed_batches_are_rejected(payload):
    with pytest.raises(GossipFrameError):
        decode_batch(payload)


def test_encode_refuses_empty_or_huge():
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch([b""])


def test_seen_cache_dedups_and_stays_bounded():
    cache = SeenCache(capacity=3)
    assert cache.fresh([b"1", b"2", b"1"]) == [b"1", b"2"]
    assert cache.fresh([b"3", b"4"]) == [b"3", b"4"]
    assert len(cache) == 3
    assert cache.fresh([b"2"]) == [b"2"]          # least recently seen (1 was seen again later): evicted
    assert cache.fresh([b"4", b"1"]) == [b"1"]


class Pipe:
    def __init__(self, incoming, outgoing, remote):
        self._in, self._out, self.remote_peer = incoming, outgoing, remote

    async def readexactly(self, n):
        return await self._in.readexactly(n)

    async def write(self, data):
        self._out.feed_data(data)

    async def close(self):
        if not self._out.at_eof():
            self._out.feed_eof()


class Net:
    def __init__(self):
        self.hosts, self.tasks = {}, set()


class Host:
    def __init__(self, net, peer_id):
        self.net, self.peer_id, self.handlers = net, peer_id, {}
        net.hosts[peer_id] = self

    def set_handler(self, protocol, handler):
        self.handlers[protocol] = handler

    def remove_handler(self, protocol):
        self.handlers.pop(protocol, None)

    async def open_stream(self, peer_id, protocol):
        remote = self.net.hosts[peer_id]
        a, b = asyncio.StreamReader(), asyncio.StreamReader()
        far = Pipe(a, b, self.peer_id)
        self.net.tasks.add(asyncio.get_running_loop().create_task(remote.handlers[protocol](far)))
        return Pipe(b, a, peer_id)


def test_gossip_delivers_batches_once_and_survives_junk():
    async def main():
        net = Net()
        admitted = {"a": [], "b": []}
        gossips = {}
        for name in ("a", "b"):
            async def admit(txs, name=name):
                admitted[name].extend(txs)
            gossips[name] = TxGossip(Host(net, name), name, lambda: ["a", "b"], admit, flush_interval=0.001)
            await gossips[name].start()
        gossips["a"].broadcast([b"tx1", b"tx2"])
        gossips["a"].broadcast([b"tx3"])
        for _ in range(100):
            if len(admitted["b"]) == 3:
                break
            await asyncio.sleep(0.01)
        assert admitted["b"] == [b"tx1", b"tx2", b"tx3"]
        gossips["a"].broadcast([b"tx1"])          # b already saw it: not admitted again
        gossips["b"].broadcast([b"tx4"])
        for _ in range(100):
            if admitted["a"]:
                break
            await asyncio.sleep(0.01)
        assert admitted["a"] == [b"tx4"] and admitted["b"] == [b"tx1", b"tx2", b"tx3"]

        junk = await net.hosts["a"].open_stream("b", PROTOCOL)   # a raw stream into b's handler
        await junk.write(struct.pack(">I", 10**9))               # oversized frame length
        await asyncio.sleep(0.05)
        assert gossips["b"].rejected_frames == 1
        gossips["a"].broadcast([b"tx5"])                         # the real stream still works
        for _ in range(100):
            if b"tx5" in admitted["b"]:
                break
            await asyncio.sleep(0.01)
        assert admitted["b"][-1] == b"tx5"
        for g in gossips.values():
            await g.stop()
        for task in net.tasks:
            task.cancel()
        await asyncio.gather(*net.tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 10))
