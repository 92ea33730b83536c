"""State snapshots on the wire: protocol ``/dekube/snapshots/1.0.0`` (docs/adr/0199).

One request per stream: a frame ``encode([kind, height, index])`` with kind ``list`` (the heights
of the snapshots the node keeps), ``manifest``, ``block`` (block ``height`` with its certificate:
``[height, round, value, certificate]``), ``chunk``, ``hops`` (the heights of the committee hop
records kept from ``height`` on, a page of ``HOP_LIST_PAGE``) or ``hop`` (one record,
consensus/committee_hops.py); the answer is one frame ``encode(value)``,
``None`` when the node does not have it (or the asking peer is over its byte rate, or has a request in
flight). ``SnapshotServer`` answers from a ``ChainStore`` (reads on a thread of its own, one request at
a time per peer, requests of at most 64 bytes);
``RemoteSource`` is a ``consensus.statesync.SnapshotSource`` for one peer, called from the worker
thread that runs ``state_sync`` and bridged to the event loop. A peer that cannot be reached,
times out or answers junk is reported as having nothing (``None``): ``state_sync`` then asks the
next peer; what it does send is checked there.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from consensus.certificate import CertificateError, decode_certificate, encode_certificate
from consensus.committee_hops import HOP_LIST_PAGE, MAX_HOP_BYTES, MAX_HOPS
from consensus.encoding import EncodingError, decode, encode
from consensus.network import MAX_FRAME_BYTES, FrameError, frame, read_frame
from consensus.state.snapshot import MAX_CHUNK_BYTES, MAX_MANIFEST_BYTES
from consensus.statesync import StoreSource
from consensus.tendermint import Commit
from consensus.validator.chainstore import ChainStore

PROTOCOL = "/dekube/snapshots/1.0.0"
MAX_REQUEST_BYTES = 64
MAX_ANSWER_BYTES = max(MAX_FRAME_BYTES, MAX_CHUNK_BYTES, MAX_MANIFEST_BYTES, MAX_HOP_BYTES) + 1024
KINDS = ("list", "manifest", "block", "chunk", "hops", "hop")

log = logging.getLogger(__name__)


PEER_BYTES_PER_S = 8 << 20    # what one peer may fetch a second, on average (a joiner's chunks)
PEER_BURST_BYTES = 16 << 20   # ... and in one burst


class SnapshotServer:
    """Answers snapshot requests from ``store``, one request at a time per peer on a thread of its own
    (a peer flooding requests waits behind itself, never behind the node's other work), each peer
    within ``PEER_BYTES_PER_S`` of answers: a peer with no bytes left is told "none" without a read (a
    joiner then asks the next peer; docs/adr/0199, 0214)."""

    def __init__(self, host, store: ChainStore, rate: float = PEER_BYTES_PER_S,
                 burst: float = PEER_BURST_BYTES) -> None:
        self.host = host
        self.source = StoreSource("self", store)
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}   # peer -> (bytes available, when)
        self._busy: set[str] = set()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="snapshots")

    def start(self) -> None:
        self.host.set_handler(PROTOCOL, self._handle)

    def stop(self) -> None:
        self.host.remove_handler(PROTOCOL)
        self._reader.shutdown(wait=False)

    def _available(self, peer: str) -> float:
        """The bytes ``peer`` may still be sent now (negative: it owes that much of the last answer)."""
        now = time.monotonic()
        available, when = self._buckets.get(peer, (self.burst, now))
        return min(self.burst, available + (now - when) * self.rate)

    def _charge(self, peer: str, size: int) -> None:
        now = time.monotonic()
        self._buckets[peer] = (self._available(peer) - size, now)
        if len(self._buckets) > 4096:   # forget peers whose bucket has refilled
            self._buckets = {p: b for p, b in self._buckets.items() if b[0] + (now - b[1]) * self.rate < self.burst}

    def answer(self, kind: str, height: int, index: int):
        if kind == "list":
            return self.source.snapshots()
        if kind == "manifest":
            return self.source.manifest(height)
        if kind == "chunk":
            return self.source.chunk(height, index)
        if kind == "hops":
            return self.source.store.storage.committee_hops(height, HOP_LIST_PAGE)
        if kind == "hop":
            return self.source.hop(height)
        commit = self.source.block(height)
        return None if commit is None else [commit.height, commit.round, commit.value,
                                            encode_certificate(commit.certificate)]

    async def _handle(self, stream) -> None:
        peer = str(getattr(stream, "remote_peer", "") or "")
        try:
            request = decode(await read_frame(stream, MAX_REQUEST_BYTES), MAX_REQUEST_BYTES)
            if type(request) is not list or len(request) != 3 or request[0] not in KINDS \
                    or any(type(n) is not int or not 0 <= n < 2**63 for n in request[1:]):
                return
            if peer in self._busy or self._available(peer) <= 0:   # one at a time, within its byte rate
                log.debug("snapshot %s for %s refused: busy or over %d bytes/s", request[0], peer, self.rate)
                await stream.write(frame(encode(None)))
                return
            self._busy.add(peer)
            try:
                value = await asyncio.get_running_loop().run_in_executor(self._reader, self.answer, *request)
            finally:
                self._busy.discard(peer)
            answer = encode(value)
            self._charge(peer, len(answer))   # a big chunk may overdraw: the peer then waits it off
            await stream.write(frame(answer))
        except (asyncio.IncompleteReadError, ConnectionError, FrameError, EncodingError) as exc:
            log.debug("snapshot request dropped: %s", exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()


class RemoteSource:
    """A peer's snapshots, for ``state_sync`` running in a worker thread (not on ``loop``)."""

    def __init__(self, host, peer: str, loop: asyncio.AbstractEventLoop, timeout: float = 10.0) -> None:
        self.host, self.name, self.loop, self.timeout = host, peer, loop, timeout

    async def _request(self, kind: str, height: int, index: int):
        stream = await asyncio.wait_for(self.host.open_stream(self.name, PROTOCOL), self.timeout)
        try:
            await stream.write(frame(encode([kind, height, index])))
            raw = await asyncio.wait_for(read_frame(stream, MAX_ANSWER_BYTES), self.timeout)
            return decode(raw, MAX_ANSWER_BYTES)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()

    def _call(self, kind: str, height: int = 0, index: int = 0):
        future = asyncio.run_coroutine_threadsafe(self._request(kind, height, index), self.loop)
        try:
            return future.result(self.timeout * 2 + 1)
        except Exception as exc:  # unreachable, timed out, junk: this peer has nothing for us
            future.cancel()
            log.info("snapshot %s request to %s failed: %s", kind, self.name, exc)
            return None

    def snapshots(self) -> list[int]:
        heights = self._call("list")
        return [h for h in heights if type(h) is int] if type(heights) is list else []

    def manifest(self, height: int) -> bytes | None:
        raw = self._call("manifest", height)
        return raw if type(raw) is bytes else None

    def block(self, height: int) -> Commit | None:
        got = self._call("block", height)
        if type(got) is not list or len(got) != 4 or type(got[0]) is not int or type(got[1]) is not int \
                or type(got[2]) is not bytes or type(got[3]) is not bytes:
            return None
        try:
            return Commit(got[0], got[1], got[2], decode_certificate(got[3]))
        except CertificateError:
            return None

    def chunk(self, height: int, index: int) -> bytes | None:
        raw = self._call("chunk", height, index)
        return raw if type(raw) is bytes else None

    def hops(self) -> list[int]:
        heights: list[int] = []
        while len(heights) < MAX_HOPS:
            page = self._call("hops", heights[-1] + 1 if heights else 0)
            if type(page) is not list:
                break
            page = [h for h in page if type(h) is int and h > (heights[-1] if heights else 0)]
            heights += sorted(set(page))[:HOP_LIST_PAGE]
            if len(page) < HOP_LIST_PAGE:
                break
        return heights[:MAX_HOPS]

    def hop(self, height: int) -> bytes | None:
        raw = self._call("hop", height)
        return raw if type(raw) is bytes else None
