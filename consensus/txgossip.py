"""Transaction gossip between validators (protocol ``/dekube/tx/1.0.0``): batched, bounded, deduplicated.

Wire: one long-lived stream per peer carrying frames ``len u32 | count u16 | (len u32 | tx)*``.
Transactions a node accepted from its clients are queued in an outbox and flushed to every peer
as one batch every ``flush_interval`` (validators are connected all-to-all, so one hop reaches
everyone; a node that was down catches up through blocks). The receiving side reads a frame,
drops hashes it has already seen (a bounded LRU), and awaits ``admit(batch)`` before reading the
next frame, so a slow validator pushes back on its senders through TCP instead of buffering.
Per-peer send queues are bounded (oldest batch dropped). A malformed frame closes that stream.
Protocol access by role: ``members(peer)`` (the committee) gossip at full rate; any other peer (a
standby validator forwarding its clients' transactions) gets a ``TxAllowance`` of
``NON_MEMBER_TXS_PER_S`` and the rest of its batches is dropped and counted. Senders to peers that
left ``peers()`` are closed.

``encode_batch``/``decode_batch``/``SeenCache``/``TxAllowance`` are the sans-I/O parts; ``TxGossip``
drives them.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable

from node.p2p.peer_sender import PeerSender

PROTOCOL = "/dekube/tx/1.0.0"
MAX_BATCH_TXS = 2048
MAX_TX_BYTES = 64 * 1024
MAX_FRAME_BYTES = 4 * 1024 * 1024
NON_MEMBER_TXS_PER_S = 64.0
NON_MEMBER_BURST_TXS = 256
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
log = logging.getLogger(__name__)


class GossipFrameError(ValueError):
    """A malformed or oversized gossip frame."""


def encode_batch(txs: list[bytes]) -> bytes:
    """One frame (with its length prefix) carrying ``txs``."""
    if not 0 < len(txs) <= MAX_BATCH_TXS:
        raise ValueError(f"a batch holds 1..{MAX_BATCH_TXS} transactions")
    body = [_U16.pack(len(txs))]
    for tx in txs:
        if not 0 < len(tx) <= MAX_TX_BYTES:
            raise ValueError("transaction size outside 1..MAX_TX_BYTES")
        body += [_U32.pack(len(tx)), tx]
    payload = b"".join(body)
    return _U32.pack(len(payload)) + payload


def decode_batch(payload: bytes) -> list[bytes]:
    """The transactions of one frame payload (without its length prefix)."""
    if len(payload) < 2:
        raise GossipFrameError("batch too short")
    (count,) = _U16.unpack_from(payload, 0)
    if not 0 < count <= MAX_BATCH_TXS:
        raise GossipFrameError(f"batch of {count} transactions outside 1..{MAX_BATCH_TXS}")
    pos, txs = 2, []
    for _ in range(count):
        if pos + 4 > len(payload):
            raise GossipFrameError("batch truncated")
        (length,) = _U32.unpack_from(payload, pos)
        pos += 4
        if not 0 < length <= MAX_TX_BYTES or pos + length > len(payload):
            raise GossipFrameError("transaction length out of range or truncated")
        txs.append(payload[pos:pos + length])
        pos += length
    if pos != len(payload):
        raise GossipFrameError("trailing bytes after the batch")
    return txs


class SeenCache:
    """The most recent ``capacity`` transaction hashes (LRU)."""

    def __init__(self, capacity: int = 200_000):
        self.capacity = capacity
        self._hashes: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def add(self, tx_hash: bytes) -> bool:
        """Remember ``tx_hash``; False if it was already known."""
        if tx_hash in self._hashes:
            self._hashes.move_to_end(tx_hash)
            return False
        self._hashes[tx_hash] = None
        if len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)
        return True

    def fresh(self, txs: Iterable[bytes]) -> list[bytes]:
        """The transactions not seen before (and remember them)."""
        return [tx for tx in txs if self.add(hashlib.sha256(tx).digest())]


class TxAllowance:
    """A token bucket of transactions: ``rate`` per second, up to ``burst`` saved."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.last = now

    def take(self, wanted: int, now: float) -> int:
        """How many of ``wanted`` transactions may pass at ``now``."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        granted = min(wanted, int(self.tokens))
        self.tokens -= granted
        return granted


Admit = Callable[[list[bytes]], Awaitable[object]]


class TxGossip:
    """Sends accepted transactions to ``peers()`` and hands received ones to ``admit``."""

    def __init__(self, host, self_id: str, peers: Callable[[], Iterable[str]], admit: Admit, *,
                 flush_interval: float = 0.01, max_send_queue: int = 256, seen_capacity: int = 200_000,
                 members: Callable[[str], bool] | None = None, non_member_rate: float = NON_MEMBER_TXS_PER_S):
        self.host = host
        self.self_id = self_id
        self.peers = peers
        self.admit = admit
        self.members = members
        self.non_member_rate = non_member_rate
        self.shed_txs = 0
        self.flush_interval = flush_interval
        self.max_send_queue = max_send_queue
        self.seen = SeenCache(seen_capacity)
        self.rejected_frames = 0
        self.received = 0
        self._outbox: list[bytes] = []
        self._senders: dict[str, PeerSender] = {}
        self._flusher: asyncio.Task | None = None
        self._wakeup = asyncio.Event()

    async def start(self) -> None:
        self.host.set_handler(PROTOCOL, self._handle_stream)
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def stop(self) -> None:
        self.host.remove_handler(PROTOCOL)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        for sender in list(self._senders.values()):
            await sender.close()
        self._senders.clear()

    def broadcast(self, txs: Iterable[bytes]) -> None:
        """Queue transactions this node accepted for its peers."""
        for tx in txs:
            self.seen.add(hashlib.sha256(tx).digest())
            self._outbox.append(tx)
        self._wakeup.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(self.flush_interval)  # let a batch build up
            outbox, self._outbox = self._outbox, []
            frames = [encode_batch(outbox[i:i + MAX_BATCH_TXS]) for i in range(0, len(outbox), MAX_BATCH_TXS)]
            peers = set(self.peers()) - {self.self_id}
            for peer in peers:
                sender = self._senders.get(peer)
                if sender is None:
                    sender = self._senders[peer] = PeerSender(self.host, peer, PROTOCOL, self.max_send_queue, 3.0)
                for frame in frames:
                    sender.send(frame)
            for gone in [p for p in self._senders if p not in peers]:
                await self._senders.pop(gone).close()

    async def _handle_stream(self, stream) -> None:
        peer = getattr(stream, "remote_peer", None)
        loop = asyncio.get_running_loop()
        allowance = None
        try:
            while True:
                (length,) = _U32.unpack(await stream.readexactly(4))
                if not 0 < length <= MAX_FRAME_BYTES:
                    raise GossipFrameError(f"frame of {length} bytes outside 1..{MAX_FRAME_BYTES}")
                batch = decode_batch(await stream.readexactly(length))
                if self.members is not None and (peer is None or not self.members(peer)):
                    allowance = allowance or TxAllowance(self.non_member_rate, NON_MEMBER_BURST_TXS, loop.time())
                    granted = allowance.take(len(batch), loop.time())
                    self.shed_txs += len(batch) - granted
                    batch = batch[:granted]
                txs = self.seen.fresh(batch)
                self.received += len(txs)
                if txs:
                    await self.admit(txs)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except GossipFrameError as exc:
            self.rejected_frames += 1
            log.info("closing tx gossip stream from %s: %s", peer, exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
