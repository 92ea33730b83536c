"""ArtifactService: the node's artifact store served and fetched over ``/dekube/artifact/1.0.0``.

The thin asyncio driver around the pure parts: it answers requests from the store (chunks read and
hashed in a thread, the next chunk read while the current one is written), its upload streams a
scoped pool (node/admission.py, ADR 0186): at most ``max_uploads`` at once and
``max_uploads_per_peer`` per peer, unknown peers sharing ``max_uploads_unknown`` of them while
staked peers, a task's crew and owner, and the committee use the rest; a full pool evicts an idle
stream (waiting for a request) of the most-represented peer, or one idle past ``upload_grace``,
instead of answering BUSY. And ``fetch`` runs one puller per holder that sends what the
``Scheduler`` says, checks every chunk against the manifest in a thread,
writes it into the store's partial file and reports back. Everything a fetch learns is in its
``FetchReport``; a holder that served bad bytes is also logged and counted
(``dekube_artifact_bad_holders_total``). Whatever the node holds, complete or partial, it serves.
"""
from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.admission import Pool, PoolLimits
from node.p2p.errors import ProtocolError
from node.p2p.multiaddr import Multiaddr, MultiaddrError

from .errors import ArtifactError, ArtifactTooLarge
from .manifest import Manifest, ManifestError, max_manifest_bytes
from .merkle import check_id
from .protocol import (
    BAD_REQUEST,
    BUSY,
    HEADER_BYTES,
    MAX_REQUEST_BYTES,
    NOT_FOUND,
    PROTOCOL,
    Chunk,
    Error,
    GetChunks,
    GetManifest,
    ManifestMsg,
    NoChunk,
    ProtocolViolation,
    chunk_header,
    decode_body,
    decode_header,
    encode,
    max_response_bytes,
)
from .quota import DEFAULT_RETENTION_S, StoreQuota
from .scheduler import Scheduler, Verdict
from .store import ArtifactStore, Partial

log = logging.getLogger(__name__)

MAX_RANGE = 64            # most chunks one GET_CHUNKS may ask for
IDLE_TIMEOUT_S = 60.0     # a serving stream with no request for this long is closed
OPEN_TIMEOUT_S = 20.0
RETRY_BACKOFF_S = 0.25
Progress = Callable[[int, int], Any]
_NET_ERRORS = (OSError, ConnectionError, ProtocolError, TimeoutError, asyncio.IncompleteReadError)


@dataclass(frozen=True)
class ArtifactLimits:
    max_size: int = 4096 << 20
    max_uploads: int = 32
    max_uploads_per_peer: int = 4
    max_uploads_unknown: int = 16   # of max_uploads, what peers without stake or business share
    upload_grace: float = 5.0       # an upload stream idle this long may be evicted by any newcomer
    window_chunks: int = 8
    request_chunks: int = 4
    stall_timeout: float = 30.0
    max_failures: int = 3
    quota: int = 65536 << 20          # total bytes of the store (quota.py)
    own_retention_s: float = DEFAULT_RETENTION_S

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> ArtifactLimits:
        return cls(max_size=section["max_size_mb"] << 20, max_uploads=section["max_uploads"],
                   max_uploads_per_peer=section["max_uploads_per_peer"],
                   max_uploads_unknown=min(section["max_uploads_unknown"], section["max_uploads"]),
                   window_chunks=section["window_chunks"],
                   request_chunks=section["request_chunks"], stall_timeout=section["stall_timeout"],
                   quota=max(section["quota_mb"], section["max_size_mb"]) << 20,
                   own_retention_s=section["own_retention_s"])


@dataclass
class FetchReport:
    """What a fetch did: the file, bytes received per holder, holders dropped and why, liars."""
    id: str
    path: Path
    size: int
    received_bytes: int = 0
    resumed_bytes: int = 0
    seconds: float = 0.0
    per_holder: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    bad_holders: list[str] = field(default_factory=list)


class _Signal:
    """Wakes every waiter when something changed (a chunk landed, chunks went back to the pool)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class _Dropped(Exception):
    """The holder was dropped by the scheduler: stop pulling from it."""


class ArtifactService:
    """``node.artifacts``: add, hold, serve and fetch content-addressed artifacts."""

    def __init__(self, host, root: Path | None, limits: ArtifactLimits | None = None, metrics=None) -> None:
        self.host = host
        self.limits = limits or ArtifactLimits()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dekube-artifacts-")
            root = Path(self._tmp.name)
        self.root = Path(root)
        self.quota = StoreQuota(self.root, self.limits.quota, self.limits.own_retention_s)
        self.store = ArtifactStore(self.root, self.limits.max_size, self.quota)
        self.store.clear_stale_tmp()
        unknown = min(self.limits.max_uploads_unknown, self.limits.max_uploads)
        self._uploads = Pool(PoolLimits(total=self.limits.max_uploads, per_peer=self.limits.max_uploads_per_peer,
                                        unknown_pool=unknown, per_prefix=unknown,
                                        grace=self.limits.upload_grace), time.monotonic)
        self._fetch_locks: dict[str, asyncio.Lock] = {}
        self._verified: set[str] = set()
        self._max_frame = max_response_bytes(max_manifest_bytes(self.limits.max_size))
        self._metrics_init(metrics)
        host.set_handler(PROTOCOL, self._serve)

    @classmethod
    def for_node(cls, node) -> ArtifactService:
        root = node.data_dir / "artifacts" if node.data_dir is not None else None
        service = cls(node.host, root, ArtifactLimits.from_config(node.config["artifacts"]), node.metrics)
        node.status.add_section("artifacts", service.status)
        return service

    def _metrics_init(self, metrics) -> None:
        self._served = self._received = self._bad = None
        if metrics is None:
            return
        self._served = metrics.counter("dekube_artifact_served_bytes_total", "Artifact chunk bytes sent to peers.")
        self._received = metrics.counter("dekube_artifact_received_bytes_total",
                                         "Verified artifact chunk bytes received from peers.")
        self._bad = metrics.counter("dekube_artifact_bad_holders_total",
                                    "Holders dropped for serving chunks or manifests that fail verification.")
        metrics.gauge("dekube_artifact_uploads", "Artifact streams being served now.").set_function(
            lambda: len(self._uploads))

    def close(self) -> None:
        """Remove the temporary store of a node without a data dir."""
        if self._tmp is not None:
            self._tmp.cleanup()

    # ---- local store
    async def add_file(self, path: Path | str) -> str:
        return await asyncio.to_thread(self.store.add_file, path)

    async def add_bytes(self, data: bytes) -> str:
        return await asyncio.to_thread(self.store.add_bytes, data)

    def pin_mirrors(self, artifacts: Iterable[str]) -> None:
        """Pin exactly ``artifacts`` as the epoch states this node mirrors (docs/adr/0236, 0240)."""
        self.quota.set_mirror_pins(artifacts)

    async def room_within(self, share: float, taken: Iterable[str]) -> int:
        """Bytes left in ``share`` of the store's quota once the artifacts ``taken`` are counted."""
        held = await asyncio.to_thread(self.store.held)
        used = sum(held[artifact][0] for artifact in set(taken) if artifact in held)
        return max(0, int(self.quota.quota * share) - used)

    def has(self, artifact: str) -> bool:
        return self.store.has(artifact)

    def path(self, artifact: str) -> Path:
        return self.store.path(artifact)

    def list(self) -> list[dict]:
        return self.store.list()

    def status(self) -> dict[str, Any]:
        return {"root": str(self.root), "uploads": len(self._uploads), "fetching": len(self._fetch_locks)}

    # ---- serving
    async def _serve(self, stream) -> None:
        peer = stream.remote_peer
        addr = stream.connection.remote_addr
        decision = self._uploads.admit(stream, peer, addr.parts[0][1] if addr is not None else peer,
                                       self.host.peer_class(peer))
        for victim in decision.evict:   # an idle stream of the most-represented peer, or a stale one
            log.debug("artifact upload to %s evicted for %s", getattr(victim, "remote_peer", "?"), peer)
            victim.reset()  # type: ignore[attr-defined]
        if not decision.admitted:
            await stream.write(encode(Error(BUSY, f"too many artifact transfers ({decision.reason}); try again later")))
            await stream.close()
            return
        try:
            await self._serve_requests(stream)
        except ProtocolViolation as exc:
            log.debug("bad artifact request from %s: %s", peer, exc)
            with contextlib.suppress(*_NET_ERRORS):   # say why, then stop reading this stream
                await stream.write(encode(Error(BAD_REQUEST, str(exc))))
                await stream.close()
        except _NET_ERRORS as exc:   # the peer went away, or the stream was evicted
            log.debug("artifact upload to %s ended: %s", peer, _describe(exc))
        finally:
            self._uploads.release(stream)

    async def _serve_requests(self, stream) -> None:
        while True:
            try:
                header = await asyncio.wait_for(stream.readexactly(HEADER_BYTES), IDLE_TIMEOUT_S)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise ProtocolViolation("truncated frame") from None
                await stream.close()
                return
            except TimeoutError:
                stream.reset()
                return
            self._uploads.set_busy(stream, True)   # answering: not evictable until it waits again
            try:
                kind, length = decode_header(header, MAX_REQUEST_BYTES)
                message = decode_body(kind, await asyncio.wait_for(stream.readexactly(length), IDLE_TIMEOUT_S))
                if isinstance(message, GetManifest):
                    manifest = await asyncio.to_thread(self.store.manifest, message.artifact)
                    await stream.write(encode(ManifestMsg(manifest.encode()) if manifest is not None
                                              else Error(NOT_FOUND, f"no artifact {message.artifact}")))
                elif isinstance(message, GetChunks):
                    await self._serve_chunks(stream, message)
                else:
                    raise ProtocolViolation(f"{type(message).__name__} is not a request")
            finally:
                self._uploads.set_busy(stream, False)

    async def _serve_chunks(self, stream, request: GetChunks) -> None:
        manifest = await asyncio.to_thread(self.store.manifest, request.artifact)
        if manifest is None:
            await stream.write(encode(Error(NOT_FOUND, f"no artifact {request.artifact}")))
            return
        if not 1 <= request.count <= MAX_RANGE or request.start + request.count > manifest.chunks:
            raise ProtocolViolation(f"chunk range {request.start}+{request.count} outside 1..{MAX_RANGE} chunks "
                                    f"of {manifest.chunks}")
        indices = range(request.start, request.start + request.count)
        reading = asyncio.ensure_future(asyncio.to_thread(self.store.read_chunk, request.artifact, indices[0]))
        try:
            for position, index in enumerate(indices):
                data = await reading
                if position + 1 < len(indices):  # read the next chunk while this one goes out
                    reading = asyncio.ensure_future(
                        asyncio.to_thread(self.store.read_chunk, request.artifact, indices[position + 1]))
                if data is None:
                    await stream.write(encode(NoChunk(index)))
                    continue
                await stream.write(chunk_header(index, len(data)))
                await stream.write(data)
                if self._served is not None:
                    self._served.inc(len(data))
        finally:
            if not reading.done():
                reading.cancel()

    # ---- fetching
    async def fetch(self, artifact: str, holders: Sequence[str], *, progress: Progress | None = None,
                    max_bytes: int | None = None) -> Path:
        """Download ``artifact`` from ``holders`` (peer ids in the peer book, or multiaddrs ending in
        /p2p/<id>) into the store; its path. Raises ArtifactError when no holder could serve it
        (see ``fetch_report`` for why), ArtifactTooLarge when its manifest names more than ``max_bytes``."""
        return (await self.fetch_report(artifact, holders, progress=progress, max_bytes=max_bytes)).path

    async def fetch_report(self, artifact: str, holders: Sequence[str], *,
                           progress: Progress | None = None, max_bytes: int | None = None) -> FetchReport:
        """``fetch``, returning what happened: bytes per holder, holders dropped, liars."""
        try:
            check_id(artifact)
        except ValueError as exc:
            raise ArtifactError(str(exc)) from None
        peers = [h for h in dict.fromkeys(self._resolve(holders)) if h != self.host.peer_id]
        lock = self._fetch_locks.setdefault(artifact, asyncio.Lock())
        try:
            async with lock:
                return await self._fetch(artifact, peers, progress, max_bytes)
        finally:
            if not lock.locked() and self._fetch_locks.get(artifact) is lock:
                del self._fetch_locks[artifact]

    def _resolve(self, holders: Sequence[str]) -> builtins.list[str]:
        """Peer ids of ``holders``: a peer id as is; a multiaddr ending in /p2p/<id> (direct or
        relayed) is added to the peer book and stands for its peer."""
        peers = []
        for holder in holders:
            if not holder.startswith("/"):
                peers.append(holder)
                continue
            try:
                addr = Multiaddr.parse(holder)
            except MultiaddrError as exc:
                raise ArtifactError(f"bad holder address {holder!r}: {exc}") from None
            if addr.peer_id is None:
                raise ArtifactError(f"holder address {holder!r} needs a /p2p/<peer id> suffix")
            self.host.peerbook.add_addrs(addr.peer_id, [addr])
            peers.append(addr.peer_id)
        return peers

    async def _fetch(self, artifact: str, holders: builtins.list[str], progress: Progress | None,
                     max_bytes: int | None) -> FetchReport:
        started = time.monotonic()
        if self.store.has(artifact) and (artifact in self._verified
                                         or await asyncio.to_thread(self.store.verify, artifact)):
            self._verified.add(artifact)
            size = self.store.path(artifact).stat().st_size
            _check_size(artifact, size, max_bytes)
            if progress is not None:
                progress(size, size)
            return FetchReport(artifact, self.store.path(artifact), size, resumed_bytes=size)
        report = FetchReport(artifact, Path(), 0)
        manifest = await asyncio.to_thread(self.store.manifest, artifact)
        if manifest is None:
            manifest = await self._fetch_manifest(artifact, holders, report)
        _check_size(artifact, manifest.size, max_bytes)
        report.size = manifest.size
        partial = await asyncio.to_thread(self.store.open_partial, manifest)
        try:
            report.resumed_bytes = partial.done_bytes
            live = [h for h in holders if h not in report.dropped]
            scheduler = Scheduler(manifest.chunks, partial.have, live, window=self.limits.window_chunks,
                                  request_chunks=self.limits.request_chunks, max_failures=self.limits.max_failures)
            await self._pull_all(scheduler, manifest, partial, report, progress)
            if not scheduler.done:
                reasons = "; ".join(f"{peer}: {why}" for peer, why in report.dropped.items()) or "no holders given"
                raise ArtifactError(f"could not fetch artifact {artifact}: {scheduler.missing()} of "
                                    f"{manifest.chunks} chunks missing ({reasons})")
            report.path = await asyncio.to_thread(partial.complete)
            if progress is not None:
                progress(manifest.size, manifest.size)
        finally:
            self.store.release_partial(partial)
        self._verified.add(artifact)
        report.seconds = time.monotonic() - started
        return report

    def _report_bad(self, report: FetchReport, peer: str, reason: str) -> None:
        log.warning("artifact holder dropped for bad data",
                    extra={"artifact": report.id, "peer": peer, "reason": reason})
        if self._bad is not None:
            self._bad.inc()
        if peer not in report.bad_holders:
            report.bad_holders.append(peer)

    async def _fetch_manifest(self, artifact: str, holders: builtins.list[str], report: FetchReport) -> Manifest:
        for peer in holders:
            try:
                data = await asyncio.wait_for(self._request_manifest(peer, artifact), OPEN_TIMEOUT_S)
                manifest = Manifest.decode(data, artifact, self.limits.max_size)
            except ManifestError as exc:
                report.dropped[peer] = f"bad manifest: {exc}"
                if "exceeds the limit" not in str(exc):
                    self._report_bad(report, peer, f"bad manifest: {exc}")
                continue
            except ProtocolViolation as exc:
                report.dropped[peer] = f"protocol violation: {exc}"
                self._report_bad(report, peer, str(exc))
                continue
            except Exception as exc:   # unreachable, not holding it, or any other failure of this holder
                report.dropped[peer] = f"no manifest: {_describe(exc)}"
                continue
            await asyncio.to_thread(self.store.save_manifest, manifest)
            return manifest
        reasons = "; ".join(f"{peer}: {why}" for peer, why in report.dropped.items()) or "no holders given"
        raise ArtifactError(f"no holder could serve artifact {artifact} ({reasons})")

    async def _request_manifest(self, peer: str, artifact: str) -> bytes:
        stream = await self.host.open_stream(peer, PROTOCOL)
        try:
            await stream.write(encode(GetManifest(artifact)))
            message = await self._read_message(stream, max_response_bytes(max_manifest_bytes(self.limits.max_size)))
            if isinstance(message, Error):
                raise ArtifactError(f"holder answered: {message.text[:200]}")
            if not isinstance(message, ManifestMsg):
                raise ProtocolViolation(f"answered GET_MANIFEST with {type(message).__name__}")
            return message.data
        finally:
            with contextlib.suppress(*_NET_ERRORS):
                await stream.close()

    @staticmethod
    async def _read_message(stream, max_frame: int):
        kind, length = decode_header(await stream.readexactly(HEADER_BYTES), max_frame)
        return decode_body(kind, await stream.readexactly(length))

    async def _pull_all(self, scheduler: Scheduler, manifest: Manifest, partial: Partial, report: FetchReport,
                        progress: Progress | None) -> None:
        signal = _Signal()
        state: dict[str, Any] = {"done": partial.done_bytes, "writes": set()}
        if progress is not None:
            progress(state["done"], manifest.size)
        pullers = [asyncio.ensure_future(self._pull(peer, scheduler, manifest, partial, report, progress, signal,
                                                    state)) for peer in scheduler.live()]
        try:
            while pullers and not scheduler.done:
                finished, _ = await asyncio.wait(pullers, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    pullers.remove(task)
                    task.result()
        finally:
            for task in pullers:
                task.cancel()
            await asyncio.gather(*pullers, return_exceptions=True)
            for write in list(state["writes"]):   # a chunk accepted must be on disk before completion
                try:
                    await write
                except OSError as exc:
                    raise ArtifactError(f"cannot write {manifest.id} into {self.root}: {exc}") from None
        for peer, holder in scheduler.holders.items():
            report.per_holder[peer] = holder.bytes
            if holder.dropped is not None:
                report.dropped[peer] = holder.dropped

    async def _pull(self, peer: str, scheduler: Scheduler, manifest: Manifest, partial: Partial,
                    report: FetchReport, progress: Progress | None, signal: _Signal, state: dict) -> None:
        holder = scheduler.holders[peer]
        while holder.dropped is None and not scheduler.done and not scheduler.stuck:
            if not holder.inflight and not scheduler.requests_possible(peer):
                await signal.wait(1.0)  # nothing to ask this holder now; wait for chunks to go back
                continue
            stream = None
            try:
                stream = await asyncio.wait_for(self.host.open_stream(peer, PROTOCOL), OPEN_TIMEOUT_S)
                await self._pull_stream(stream, peer, scheduler, manifest, partial, report, progress, signal, state)
            except _Dropped:
                pass
            except ProtocolViolation as exc:
                scheduler.drop(peer, f"protocol violation: {exc}", liar=True)
                self._report_bad(report, peer, str(exc))
            except ArtifactError:
                raise   # our side (disk): the whole fetch fails
            except (*_NET_ERRORS, _Busy) as exc:
                if scheduler.on_failure(peer, _describe(exc)):
                    signal.fire()
                    await asyncio.sleep(RETRY_BACKOFF_S * holder.failures)
            except Exception as exc:   # anything else from the holder's path costs it, never the fetch
                log.warning("artifact puller failed", exc_info=True, extra={"artifact": manifest.id, "peer": peer})
                if scheduler.on_failure(peer, _describe(exc)):
                    await asyncio.sleep(RETRY_BACKOFF_S * holder.failures)
            finally:
                if stream is not None:
                    if holder.dropped is not None or holder.inflight:
                        stream.reset()
                    else:
                        with contextlib.suppress(*_NET_ERRORS):
                            await stream.close()
                signal.fire()

    async def _pull_stream(self, stream, peer: str, scheduler: Scheduler, manifest: Manifest, partial: Partial,
                           report: FetchReport, progress: Progress | None, signal: _Signal, state: dict) -> None:
        holder = scheduler.holders[peer]
        artifact = manifest.id
        while not scheduler.done:
            for start, count in scheduler.requests(peer):
                await stream.write(encode(GetChunks(artifact, start, count)))
            if not holder.inflight:
                return   # nothing left for this holder on this stream
            message = await asyncio.wait_for(self._read_message(stream, self._max_frame), self.limits.stall_timeout)
            if isinstance(message, Chunk):
                valid = await asyncio.to_thread(manifest.chunk_ok, message.index, message.data)
                verdict = scheduler.on_chunk(peer, message.index, valid, len(message.data))
                if verdict is Verdict.LIAR:
                    self._report_bad(report, peer, holder.dropped or "bad chunk")
                    raise _Dropped
                scheduler.on_success(peer)
                if verdict is Verdict.ACCEPT:
                    state["done"] += len(message.data)
                    report.received_bytes += len(message.data)
                    if self._received is not None:
                        self._received.inc(len(message.data))
                    # tracked so that completion waits for it even if this puller is cancelled
                    write = asyncio.ensure_future(
                        asyncio.to_thread(partial.write_chunk, message.index, message.data, verified=True))
                    state["writes"].add(write)
                    write.add_done_callback(state["writes"].discard)
                    try:
                        await asyncio.shield(write)
                    except OSError as exc:   # our disk, not the holder: fail the fetch
                        raise ArtifactError(f"cannot write {artifact} into {self.root}: {exc}") from None
                    if progress is not None:
                        progress(state["done"], manifest.size)
                    signal.fire()
            elif isinstance(message, NoChunk):
                scheduler.on_missing(peer, message.index)
                if holder.dropped is not None:
                    if holder.liar:
                        self._report_bad(report, peer, holder.dropped)
                    raise _Dropped
                signal.fire()
            elif isinstance(message, Error):
                if message.code == BUSY:
                    raise _Busy(message.text)
                scheduler.drop(peer, f"holder answered: {message.text[:200]}")
                raise _Dropped
            else:
                raise ProtocolViolation(f"answered GET_CHUNKS with {type(message).__name__}")


class _Busy(Exception):
    """The holder is serving as many transfers as it allows: retry later."""


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_size(artifact: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise ArtifactTooLarge(f"artifact {artifact} has {size} bytes; this fetch allows {max_bytes}")
