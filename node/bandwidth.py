"""This node's measured upload/download bandwidth and latency to peers (docs/adr/0158).

`BandwidthMeter` (pure, clock injected) keeps the recent bulk-transfer samples of each direction
(artifact downloads, all-reduce uploads, probes) and the round-trip times to peers; its figures are
what the compute role publishes in the node's ledger record instead of the operator's declared
bandwidth. Samples under `MIN_SAMPLE_BYTES` say more about latency than bandwidth and are ignored. A
direction's figure is the 75th percentile of its last `WINDOW` samples: a transfer is often limited
by the other end, so the low ones understate this node's link, while one lucky burst should not set it.

`/dekube/bandwidth-probe/1.0.0` measures a link on demand: the asker sends one request
(`encode_request`: 4-byte N), the server answers one status byte (0 = go, 1 = busy or too soon),
the asker uploads N bytes, the server answers how long they took to arrive (8 bytes, microseconds)
and then sends N bytes, which the asker times. The server admits one
probe at a time and one per asker per `PROBE_COOLDOWN_S` (`ProbeAdmission`, pure), so nobody can use
it to make a node send much. `BandwidthService` (a node service) serves the probe and, once a role
calls `start_probing()`, pings the connected peers and probes two every `PROBE_INTERVAL_S` (every
`RETRY_PROBE_S` while none could be probed). Each probe's download leg is the probed peer's upload
as this node saw it; the service keeps the last one per peer (`peer_uploads`), and `measure_peers`
probes the peers it has no fresh figure for (a probe of a peer this node already has in flight is
awaited, not asked twice): what a compute node reports for its co-workers in commit_result
(docs/adr/0219), so the ledger can rank by bandwidth other nodes measured; `uploads_of` reads the
figures found so far, for a commit that cannot wait for the rest.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node.p2p.errors import ProtocolError

if TYPE_CHECKING:
    from node.p2p.host import Host

log = logging.getLogger(__name__)

PROTOCOL = "/dekube/bandwidth-probe/1.0.0"
MIN_SAMPLE_BYTES = 256 * 1024
WINDOW = 16
MAX_PEERS = 32                 # latency figures kept
PROBE_BYTES = 2 * 1024 * 1024
MIN_PROBE_BYTES = 64 * 1024
MAX_PROBE_BYTES = 8 * 1024 * 1024
PROBE_COOLDOWN_S = 30.0
PROBE_TIMEOUT_S = 30.0
PROBE_INTERVAL_S = 600.0
RETRY_PROBE_S = 30.0        # while no probe has succeeded (no peer connected yet)
FIRST_PROBE_S = 2.0
PEERS_PER_PROBE = 2
CHUNK = 64 * 1024
PROBE_ATTEMPTS = 8           # measure_peers: tries per peer while it is busy with another asker's probe
RETRY_PAUSE_S = (0.05, 0.4)  # measure_peers: the random pause before the next round of tries
MEASURE_BUDGET_S = 15.0      # measure_peers: seconds for all its probes (a worker's, while it trains)
GO, BUSY = b"\x00", b"\x01"
REQUEST = struct.Struct(">I")
ELAPSED = struct.Struct(">Q")


class ProbeError(ValueError):
    """A malformed probe request or answer, a refused probe, or a probe that could not finish."""


def mbit_per_s(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / max(seconds, 1e-6) / 1e6


class BandwidthMeter:
    """Recent transfer rates (Mbit/s) per direction and round-trip times (ms) per peer."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._samples: dict[str, deque[float]] = {"up": deque(maxlen=WINDOW), "down": deque(maxlen=WINDOW)}
        self._latency: dict[str, float] = {}
        self.updated_at: float | None = None

    def record_transfer(self, direction: str, nbytes: int, seconds: float) -> bool:
        """Note `nbytes` sent ("up") or received ("down") over `seconds`; False when too small to count."""
        if direction not in self._samples:
            raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
        if nbytes < MIN_SAMPLE_BYTES or not seconds > 0:
            return False
        self._samples[direction].append(mbit_per_s(nbytes, seconds))
        self.updated_at = self._clock()
        return True

    def record_rate(self, direction: str, mbps: float) -> None:
        """A rate measured elsewhere (e.g. the all-reduce's agreed upload rate of this node)."""
        if direction not in self._samples:
            raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
        if mbps > 0:
            self._samples[direction].append(float(mbps))
            self.updated_at = self._clock()

    def record_latency(self, peer: str, seconds: float) -> None:
        self._latency.pop(peer, None)
        self._latency[peer] = seconds * 1000
        while len(self._latency) > MAX_PEERS:
            del self._latency[next(iter(self._latency))]
        self.updated_at = self._clock()

    def rate(self, direction: str) -> float | None:
        """The direction's figure in Mbit/s, or None before any sample."""
        samples = sorted(self._samples[direction])
        return samples[(len(samples) * 3) // 4] if samples else None

    def figures(self) -> dict[str, Any]:
        """{"upload_mbps", "download_mbps" (None = not measured), "latency_ms": {peer: ms}, "median_latency_ms"}."""
        latencies = sorted(self._latency.values())
        return {"upload_mbps": self.rate("up"), "download_mbps": self.rate("down"),
                "latency_ms": dict(self._latency),
                "median_latency_ms": latencies[len(latencies) // 2] if latencies else None,
                "samples": {d: len(s) for d, s in self._samples.items()}, "updated_at": self.updated_at}

    def link_mbps(self) -> int | None:
        """One figure for the node's link (the slower measured direction, whole Mbit/s, at least 1),
        or None while nothing is measured."""
        rates = [r for r in (self.rate("up"), self.rate("down")) if r is not None]
        return max(1, round(min(rates))) if rates else None


def worth_publishing(published: int | None, measured: int | None, ratio: float = 1.5) -> bool:
    """True when `measured` differs enough from the `published` figure to send a new record."""
    if measured is None:
        return False
    if not published:
        return True
    return not (published / ratio <= measured <= published * ratio)


# ---- the probe protocol: sans-I/O pieces
def encode_request(size: int) -> bytes:
    if not MIN_PROBE_BYTES <= size <= MAX_PROBE_BYTES:
        raise ProbeError(f"probe size {size} outside [{MIN_PROBE_BYTES}, {MAX_PROBE_BYTES}]")
    return REQUEST.pack(size)


def decode_request(data: bytes) -> int:
    if len(data) != REQUEST.size:
        raise ProbeError(f"a probe request is {REQUEST.size} bytes")
    (size,) = REQUEST.unpack(data)
    if not MIN_PROBE_BYTES <= size <= MAX_PROBE_BYTES:
        raise ProbeError(f"probe size {size} outside [{MIN_PROBE_BYTES}, {MAX_PROBE_BYTES}]")
    return size


class ProbeAdmission:
    """Which probes the server runs: one at a time, one per asker per `cooldown_s`."""

    def __init__(self, cooldown_s: float = PROBE_COOLDOWN_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self.busy = False

    def admit(self, peer: str) -> bool:
        now = self._clock()
        last = self._last.get(peer)
        if self.busy or (last is not None and now - last < self.cooldown_s):
            return False
        self._last = {p: t for p, t in self._last.items() if now - t < self.cooldown_s}  # bounded
        self._last[peer] = now
        self.busy = True
        return True

    def done(self) -> None:
        self.busy = False


# ---- the probe protocol: thin drivers
def make_probe_handler(meter: BandwidthMeter, admission: ProbeAdmission):
    async def serve_probe(stream) -> None:
        try:
            size = decode_request(await asyncio.wait_for(stream.readexactly(REQUEST.size), PROBE_TIMEOUT_S))
        except (ProbeError, TimeoutError, asyncio.IncompleteReadError, ProtocolError, OSError):
            stream.reset()
            return
        if not admission.admit(stream.remote_peer):
            with contextlib.suppress(ProtocolError, OSError):
                await stream.write(BUSY)
                await stream.close()
            return
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await stream.write(GO)
                start = time.monotonic()
                await stream.readexactly(size)
                elapsed = time.monotonic() - start
                meter.record_transfer("down", size, elapsed)
                await stream.write(ELAPSED.pack(round(elapsed * 1e6)))
                await _send_zeros(stream, size)
                await stream.close()
        except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, OSError):
            stream.reset()
        finally:
            admission.done()

    return serve_probe


async def _send_zeros(stream, size: int) -> None:
    block = bytes(CHUNK)
    for offset in range(0, size, CHUNK):
        await stream.write(block[:min(CHUNK, size - offset)])


async def probe(host: Host, peer_id: str, meter: BandwidthMeter, size: int = PROBE_BYTES) -> dict[str, float]:
    """Upload then download `size` bytes to/from `peer_id`; records both in `meter` and returns
    {"upload_mbps", "download_mbps"}. ProbeError when refused or broken."""
    request = encode_request(size)
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            stream = await host.open_stream(peer_id, PROTOCOL)
            try:
                await stream.write(request)
                if await stream.readexactly(1) != GO:
                    raise ProbeError(f"{peer_id} refused the probe (busy or too soon)")
                await _send_zeros(stream, size)
                (micros,) = ELAPSED.unpack(await stream.readexactly(ELAPSED.size))
                up_seconds = max(micros / 1e6, 1e-6)
                start = time.monotonic()
                await stream.readexactly(size)
                down_seconds = time.monotonic() - start
            finally:
                with contextlib.suppress(ProtocolError, OSError):
                    await stream.close()
    except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, OSError) as exc:
        raise ProbeError(f"probe of {peer_id} failed: {exc!r}") from None
    meter.record_transfer("up", size, up_seconds)
    meter.record_transfer("down", size, down_seconds)
    return {"upload_mbps": mbit_per_s(size, up_seconds), "download_mbps": mbit_per_s(size, down_seconds)}


async def measure_latency(host: Host, peer_id: str, meter: BandwidthMeter) -> float | None:
    """One ping to `peer_id` recorded in `meter`; None when it fails."""
    try:
        rtt = await asyncio.wait_for(host.ping(peer_id), 5.0)
    except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, OSError):
        return None
    meter.record_latency(peer_id, rtt)
    return rtt


class BandwidthService:
    """The node service: the meter, the probe protocol, and periodic probes once asked for."""

    def __init__(self, node) -> None:
        self.host: Host = node.host
        self.meter = BandwidthMeter()
        self.admission = ProbeAdmission()
        self._probing = asyncio.Event()
        self.last_error: str | None = None
        self.peer_uploads: dict[str, tuple[float, float]] = {}   # peer -> (its upload in Mbit/s, when)
        self._probing_now: dict[str, asyncio.Future[None]] = {}   # peer -> this node's probe of it in flight
        self.host.set_handler(PROTOCOL, make_probe_handler(self.meter, self.admission))
        node.status.add_section("bandwidth", self.status)
        node.dashboard.sections["bandwidth"] = self._dashboard   # the provider page's status (docs/adr/0198)

    def status(self) -> dict:
        return {**self.meter.figures(), "probing": self._probing.is_set(), "last_error": self.last_error}

    async def _dashboard(self) -> dict:
        figures = self.meter.figures()
        return {key: figures[key] for key in ("upload_mbps", "download_mbps", "median_latency_ms")}

    def start_probing(self) -> None:
        """Measure connected peers now and every PROBE_INTERVAL_S (a role that publishes figures asks)."""
        self._probing.set()

    async def probe_peers(self, peers: list[str]) -> bool:
        """Ping `peers`, probe the first PEERS_PER_PROBE that answer; True if a probe succeeded."""
        answered = [peer for peer in peers if await measure_latency(self.host, peer, self.meter) is not None]
        measured = False
        for peer in answered[:PEERS_PER_PROBE]:
            try:
                await self._probe(peer)
                self.last_error, measured = None, True
            except ProbeError as exc:
                self.last_error = str(exc)
                log.info("bandwidth probe: %s", exc)
        return measured

    async def _probe(self, peer: str) -> None:
        """Probe ``peer`` and keep its upload; a probe of it already in flight from this node (the periodic
        one, another task's) is awaited rather than asked again: the peer would refuse a second one."""
        running = self._probing_now.get(peer)
        if running is None:
            running = asyncio.ensure_future(self._probe_once(peer))
            self._probing_now[peer] = running
            running.add_done_callback(lambda done: self._probe_ended(peer, done))
        await asyncio.shield(running)

    def _probe_ended(self, peer: str, done: asyncio.Future[None]) -> None:
        if self._probing_now.get(peer) is done:
            del self._probing_now[peer]
        if not done.cancelled():
            done.exception()   # retrieved: a probe whose askers all gave up is not an unhandled error

    async def _probe_once(self, peer: str) -> None:
        figures = await probe(self.host, peer, self.meter)
        if len(self.peer_uploads) >= MAX_PEERS and peer not in self.peer_uploads:   # bounded: drop the oldest
            del self.peer_uploads[min(self.peer_uploads, key=lambda p: self.peer_uploads[p][1])]
        self.peer_uploads[peer] = (figures["download_mbps"], time.monotonic())

    def uploads_of(self, peers: list[str], max_age_s: float = PROBE_INTERVAL_S) -> dict[str, float]:
        """Each of ``peers``' upload (Mbit/s) as this node measured it within ``max_age_s`` (those without
        such a figure left out): what `measure_peers` has found so far, also while it still runs."""
        now = time.monotonic()
        return {peer: self.peer_uploads[peer][0] for peer in peers
                if peer in self.peer_uploads and now - self.peer_uploads[peer][1] <= max_age_s}

    async def measure_peers(self, peers: list[str], max_age_s: float = PROBE_INTERVAL_S,
                            budget_s: float = MEASURE_BUDGET_S) -> dict[str, float]:
        """Each of ``peers``' upload (Mbit/s) as this node measured it within ``max_age_s``, probing the
        connected ones without such a figure within ``budget_s`` seconds in all: each round tries every
        peer still unmeasured once, and a peer busy with another asker's probe is tried again in the next
        round, after a random pause, up to PROBE_ATTEMPTS times; peers that could not be measured are
        left out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        fresh = self.uploads_of(peers, max_age_s)
        pending = [peer for peer in dict.fromkeys(peers) if peer not in fresh and self.host.is_connected(peer)]
        for attempt in range(PROBE_ATTEMPTS):
            failed = []
            for peer in pending:
                left = deadline - loop.time()
                if left <= 0:
                    return self.uploads_of(peers, max_age_s)
                try:
                    await asyncio.wait_for(self._probe(peer), left)
                except (ProbeError, TimeoutError) as exc:
                    log.info("bandwidth probe of %s (try %d): %r", peer, attempt + 1, exc)
                    failed.append(peer)
            fresh = self.uploads_of(failed, max_age_s)   # a probe another asker here ran meanwhile
            pending = [peer for peer in failed if peer not in fresh]
            if not pending:
                break
            await asyncio.sleep(min(random.uniform(*RETRY_PAUSE_S), max(0.0, deadline - loop.time())))
        return self.uploads_of(peers, max_age_s)

    async def run(self) -> None:
        await self._probing.wait()
        await asyncio.sleep(FIRST_PROBE_S)
        while True:  # until a probe succeeded (a node may have no peer yet), look again soon
            peers = sorted({c.remote_peer for c in self.host.connections() if not c.closed})
            measured = await self.probe_peers(peers[:MAX_PEERS]) if peers else False
            await asyncio.sleep(PROBE_INTERVAL_S if measured else RETRY_PROBE_S)
