"""SnapshotServer limits what one peer can take (docs/adr/0214): one request at a time per peer, and
answers within a byte rate; a peer over it is told "none" without a read, others are served as before."""
import asyncio

from test_statesync import build_chain

from consensus.encoding import decode, encode
from consensus.network import frame
from consensus.validator.snapshot_wire import SnapshotServer


class FakeStream:
    """One request frame in, the answer frame out."""

    def __init__(self, peer: str, request: list):
        self.remote_peer = peer
        self._in = frame(encode(request))
        self.out = b""

    async def readexactly(self, n: int) -> bytes:
        if len(self._in) < n:
            raise asyncio.IncompleteReadError(self._in, n)
        data, self._in = self._in[:n], self._in[n:]
        return data

    async def write(self, data: bytes) -> None:
        self.out += data

    async def close(self) -> None:
        pass

    def answer(self):
        return decode(self.out[4:])


def ask(server, peer, request):
    stream = FakeStream(peer, request)
    asyncio.run(server._handle(stream))
    return stream.answer()


def test_a_peer_over_its_byte_rate_gets_none_and_others_are_still_served():
    store, _ = build_chain(9)
    height = store.storage.snapshot_heights()[-1]
    chunk = store.storage.snapshot_chunk(height, 0)
    server = SnapshotServer(None, store, rate=1.0, burst=2 * len(chunk) + 64)   # ~2 chunks, then 1 B/s
    try:
        assert ask(server, "leech", ["list", 0, 0]) == store.storage.snapshot_heights()
        got = [ask(server, "leech", ["chunk", height, 0]) for _ in range(6)]
        assert got[0] == chunk and got[1] == chunk
        assert got[-1] is None and got.count(None) >= 3             # out of bytes: refused, no read
        assert ask(server, "joiner", ["chunk", height, 0]) == chunk   # another peer has its own budget
    finally:
        server._reader.shutdown(wait=False)


def test_a_second_request_while_one_is_in_flight_gets_none():
    store, _ = build_chain(5)
    server = SnapshotServer(None, store)
    server._busy.add("eager")
    try:
        assert ask(server, "eager", ["list", 0, 0]) is None
        assert ask(server, "calm", ["list", 0, 0]) == store.storage.snapshot_heights()
    finally:
        server._reader.shutdown(wait=False)
