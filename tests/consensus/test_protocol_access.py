"""Protocol access by role (issue 12 item 3): on the consensus protocol only committee members may
send votes and proposals (anyone may ask for blocks); tx gossip from non-members is rate-limited;
senders to peers that left the committee are closed."""
import asyncio

from consensus.driver import SYNC_REQUEST_TAG, _member_or_sync_request, encode_sync_request
from consensus.network import HostNetwork, frame
from consensus.txgossip import NON_MEMBER_BURST_TXS, TxAllowance, TxGossip, encode_batch


class FramesStream:
    """A stream that yields the given bytes, then a clean end; records whether it was closed."""

    def __init__(self, peer: str, data: bytes) -> None:
        self.remote_peer = peer
        self.reader = asyncio.StreamReader()
        self.reader.feed_data(data)
        self.reader.feed_eof()
        self.closed = False

    async def readexactly(self, n: int) -> bytes:
        return await self.reader.readexactly(n)

    async def close(self) -> None:
        self.closed = True


class NoHost:
    def set_handler(self, *_):
        pass

    def remove_handler(self, *_):
        pass

    async def open_stream(self, peer, protocol):
        raise ConnectionError("no network in this test")


VOTE_LIKE = bytes([0x01]) + b"\x00" * 40
SYNC = encode_sync_request(5)


def _received(members: set[str], peer: str, payloads: list[bytes]) -> tuple[list, HostNetwork, FramesStream]:
    async def main():
        network = HostNetwork(NoHost(), admits=_member_or_sync_request(members.__contains__))
        got = []
        network.start(lambda p, payload: got.append((p, payload)))
        stream = FramesStream(peer, b"".join(frame(p) for p in payloads))
        await network._handle_stream(stream)
        return got, network, stream
    return asyncio.run(main())


def test_members_send_anything():
    got, network, _ = _received({"alice"}, "alice", [VOTE_LIKE, SYNC])
    assert [p for _, p in got] == [VOTE_LIKE, SYNC] and network.refused_frames == 0


def test_non_members_may_only_ask_for_blocks():
    assert SYNC[0] == SYNC_REQUEST_TAG
    got, network, stream = _received({"alice"}, "mallory", [SYNC, VOTE_LIKE, SYNC])
    assert [p for _, p in got] == [SYNC]          # the vote closed the stream: the later sync is unread
    assert network.refused_frames == 1 and stream.closed


def test_prune_closes_senders_of_peers_that_left():
    async def main():
        network = HostNetwork(NoHost())
        network.start(lambda *_: None)
        for peer in ("alice", "bob"):
            network.send(peer, b"x")
        for _ in range(100):
            if all(s.queue.empty() for s in network._senders.values()):
                break
            await asyncio.sleep(0.01)
        network.prune({"alice"})
        assert set(network._senders) == {"alice"}
        await network.stop()
    asyncio.run(main())


def test_tx_allowance_is_a_token_bucket():
    bucket = TxAllowance(rate=10.0, burst=20, now=0.0)
    assert bucket.take(50, 0.0) == 20
    assert bucket.take(50, 0.5) == 5
    assert bucket.take(50, 100.0) == 20   # never more than the burst


def test_non_member_tx_gossip_is_rate_limited():
    async def main():
        admitted = []

        async def admit(txs):
            admitted.extend(txs)

        gossip = TxGossip(NoHost(), "me", lambda: (), admit, members={"alice"}.__contains__)
        txs = [b"tx-%d" % i for i in range(1000)]
        data = b"".join(encode_batch(txs[i:i + 100]) for i in range(0, 1000, 100))
        await gossip._handle_stream(FramesStream("mallory", data))
        from_mallory = len(admitted)
        await gossip._handle_stream(FramesStream("alice", encode_batch([b"member-%d" % i for i in range(1000)])))
        return from_mallory, len(admitted) - from_mallory, gossip.shed_txs
    from_mallory, from_alice, shed = asyncio.run(main())
    assert NON_MEMBER_BURST_TXS <= from_mallory < NON_MEMBER_BURST_TXS + 64   # the burst, plus at most ~1 s of rate
    assert shed == 1000 - from_mallory and from_alice == 1000
