"""ArtifactStore: complete and partial artifacts on disk under one directory (ADR 0146).

Layout under ``root``: ``objects/<id>`` complete files, ``manifests/<id>`` their manifests (also
of partial downloads), ``partial/<id>.data`` a download in progress (pre-sized, chunks written in
place) with ``partial/<id>.have`` one byte per chunk (1 = written), ``tmp/`` staging for adds.
Every completion is a rename, so another process (``dekube-node artifact add`` while the node
runs) and a crash only ever leave whole files or partials. Nothing on disk is trusted blindly: a
manifest must hash to its id, a partial's claimed chunks are re-hashed when it is reopened, every
chunk read for serving is checked against its leaf hash, and a complete file found corrupt is
demoted to a partial so the bad chunks are fetched again. With a ``StoreQuota`` (quota.py) every add
and every new download first makes room under the store's total quota, and what this node adds itself
is marked as its own. All methods block (callers use a thread).
"""
from __future__ import annotations

import builtins
import contextlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from .errors import ArtifactError, CorruptChunk
from .manifest import Manifest, ManifestError
from .merkle import CHUNK_SIZE, ID_PATTERN, artifact_id, check_id, leaf_hash
from .quota import StoreQuota

log = logging.getLogger(__name__)


class Partial:
    """A download in progress: the pre-sized data file and its have-chunk bitmap."""

    def __init__(self, store: ArtifactStore, manifest: Manifest) -> None:
        self.store = store
        self.manifest = manifest
        self.id = manifest.id
        self.data_path = store.root / "partial" / f"{self.id}.data"
        self.have_path = store.root / "partial" / f"{self.id}.have"
        self._data_fd = os.open(self.data_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._have_fd = -1
        try:
            if os.fstat(self._data_fd).st_size != manifest.size:
                os.ftruncate(self._data_fd, manifest.size)
            self.have = self._load_have()
            self._have_fd = os.open(self.have_path, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(self._have_fd, 0)
            os.pwrite(self._have_fd, bytes(self.have), 0)
        except BaseException:
            self.close()
            raise

    def _load_have(self) -> bytearray:
        """The bitmap on disk, with every claimed chunk re-hashed (a crash may have left the byte
        written and the data not); a missing or wrong-length bitmap starts from nothing."""
        chunks = self.manifest.chunks
        try:
            have = bytearray(self.have_path.read_bytes())
        except OSError:
            have = bytearray(chunks)
        if len(have) != chunks:
            have = bytearray(chunks)
        for index in range(chunks):
            if have[index]:
                data = os.pread(self._data_fd, self.manifest.chunk_length(index), self.manifest.offset(index))
                have[index] = 1 if self.manifest.chunk_ok(index, data) else 0
        return have

    def missing(self) -> list[int]:
        return [i for i, bit in enumerate(self.have) if not bit]

    @property
    def done_bytes(self) -> int:
        return sum(self.manifest.chunk_length(i) for i, bit in enumerate(self.have) if bit)

    def write_chunk(self, index: int, data: bytes, *, verified: bool = False) -> None:
        """Write chunk ``index`` and mark it held; it is hashed first unless ``verified``."""
        if not verified and not self.manifest.chunk_ok(index, data):
            raise CorruptChunk(f"chunk {index} of {self.id} does not match its leaf hash")
        os.pwrite(self._data_fd, data, self.manifest.offset(index))
        os.pwrite(self._have_fd, b"\x01", index)
        self.have[index] = 1

    def read_chunk(self, index: int) -> bytes | None:
        """Chunk ``index`` if held and still intact, else None."""
        if not self.have[index]:
            return None
        data = os.pread(self._data_fd, self.manifest.chunk_length(index), self.manifest.offset(index))
        if not self.manifest.chunk_ok(index, data):
            self.have[index] = 0
            return None
        return data

    def complete(self) -> Path:
        """Move the finished file into ``objects/`` (fsynced, atomic) and drop the bitmap."""
        if not all(self.have):
            raise ArtifactError(f"{self.id} still misses {len(self.missing())} chunks")
        os.fsync(self._data_fd)
        target = self.store.object_path(self.id)
        os.replace(self.data_path, target)
        self.store.release_partial(self)
        with contextlib.suppress(OSError):
            self.have_path.unlink()
        return target

    def close(self) -> None:
        for fd in (self._data_fd, self._have_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._data_fd = self._have_fd = -1


class ArtifactStore:
    """Artifacts held on disk under ``root``, each at most ``max_size`` bytes."""

    def __init__(self, root: Path, max_size: int, quota: StoreQuota | None = None) -> None:
        self.root = Path(root)
        self.max_size = max_size
        self.quota = quota
        for sub in ("objects", "manifests", "partial", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._manifests: dict[str, Manifest] = {}
        self._partials: dict[str, Partial] = {}
        self._lock = threading.RLock()

    # ---- paths
    def object_path(self, artifact: str) -> Path:
        return self.root / "objects" / check_id(artifact)

    def _manifest_path(self, artifact: str) -> Path:
        return self.root / "manifests" / check_id(artifact)

    # ---- adding
    def add_file(self, path: Path | str) -> str:
        """Copy the file at ``path`` into the store (hashing as it copies); its id."""
        path = Path(path)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
        if not path.is_file():
            raise ArtifactError(f"{path} is not a regular file")
        if size > self.max_size:
            raise ArtifactError(f"{path} is {size} bytes, over the artifact size limit of {self.max_size}")
        self._make_room(size)
        with open(path, "rb") as source:
            return self._add_stream(source)

    def add_bytes(self, data: bytes) -> str:
        if len(data) > self.max_size:
            raise ArtifactError(f"{len(data)} bytes exceed the artifact size limit of {self.max_size}")
        self._make_room(len(data))
        view = memoryview(data)
        return self._add_chunks(view[i:i + CHUNK_SIZE] for i in range(0, len(data), CHUNK_SIZE))

    def _add_stream(self, source) -> str:
        return self._add_chunks(iter(lambda: source.read(CHUNK_SIZE), b""))

    def _add_chunks(self, chunks) -> str:
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp")
        tmp = Path(tmp_name)
        try:
            size, leaves = 0, []
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_size:
                        raise ArtifactError(f"artifact over the size limit of {self.max_size} bytes")
                    leaves.append(leaf_hash(chunk))
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            manifest = Manifest(size, tuple(leaves or [leaf_hash(b"")]))
            artifact = manifest.id
            self.save_manifest(manifest)
            os.replace(tmp, self.object_path(artifact))
            if self.quota is not None:
                self.quota.mark_own(artifact)
            return artifact
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def save_manifest(self, manifest: Manifest) -> None:
        """Store a manifest (already checked against its id)."""
        target = self._manifest_path(manifest.id)
        if target.exists() and self.manifest(manifest.id) is not None:
            return
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(manifest.encode())
        os.replace(tmp_name, target)
        self._manifests[manifest.id] = manifest

    # ---- reading
    def manifest(self, artifact: str) -> Manifest | None:
        """The stored manifest of ``artifact``, or None (a corrupt one is deleted)."""
        cached = self._manifests.get(artifact)
        if cached is not None:
            return cached
        path = self._manifest_path(artifact)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            manifest = Manifest.decode(data, artifact, max(self.max_size, 1 << 62))
        except ManifestError as exc:
            log.warning("discarding a corrupt manifest", extra={"artifact": artifact, "error": str(exc)})
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self._manifests[artifact] = manifest
        return manifest

    def has(self, artifact: str) -> bool:
        """Whether ``artifact`` is complete here (its file is the manifest's size; chunks are
        checked when read, and in full by ``verify``)."""
        try:
            check_id(artifact)
        except ValueError:
            return False
        manifest = self.manifest(artifact)
        if manifest is None:
            return False
        try:
            return self.object_path(artifact).stat().st_size == manifest.size
        except OSError:
            return False

    def path(self, artifact: str) -> Path:
        """The complete file of ``artifact``; KeyError if it is not held."""
        if not self.has(artifact):
            raise KeyError(artifact)
        return self.object_path(artifact)

    def list(self) -> list[dict]:
        """Every artifact held, complete or partial: {id, size, complete, chunks, have}."""
        out = []
        ids = {p.name for p in (self.root / "objects").iterdir() if ID_PATTERN.fullmatch(p.name)}
        ids |= {p.name[:-5] for p in (self.root / "partial").iterdir()
                if p.name.endswith(".data") and ID_PATTERN.fullmatch(p.name[:-5])}
        for artifact in sorted(ids):
            manifest = self.manifest(artifact)
            if manifest is None:
                continue
            complete = self.has(artifact)
            have = manifest.chunks if complete else self._have_count(artifact)
            out.append({"id": artifact, "size": manifest.size, "complete": complete,
                        "chunks": manifest.chunks, "have": have})
        return out

    def _have_count(self, artifact: str) -> int:
        partial = self._partials.get(artifact)
        if partial is not None:
            return sum(partial.have)
        try:
            return sum(1 for b in (self.root / "partial" / f"{artifact}.have").read_bytes() if b)
        except OSError:
            return 0

    def read_chunk(self, artifact: str, index: int) -> bytes | None:
        """Chunk ``index`` of ``artifact`` checked against its leaf hash, from the complete file or
        a partial download; None if not held. A corrupt complete file is demoted to a partial."""
        manifest = self.manifest(artifact)
        if manifest is None or not 0 <= index < manifest.chunks:
            return None
        with self._lock:
            partial = self._partials.get(artifact)
        if partial is not None:
            return partial.read_chunk(index)
        try:
            with open(self.object_path(artifact), "rb") as file:
                file.seek(manifest.offset(index))
                data = file.read(manifest.chunk_length(index))
        except OSError:
            return None
        if manifest.chunk_ok(index, data):
            return data
        self._demote(manifest, [index])
        return None

    def verify(self, artifact: str) -> bool:
        """Re-hash the whole complete file; a corrupt one is demoted to a partial (False)."""
        manifest = self.manifest(artifact)
        if manifest is None or not self.has(artifact):
            return False
        bad = []
        size, leaves = 0, []
        with open(self.object_path(artifact), "rb") as file:
            for index in range(manifest.chunks):
                data = file.read(manifest.chunk_length(index))
                size += len(data)
                leaves.append(leaf_hash(data))
                if leaves[-1] != manifest.leaves[index]:
                    bad.append(index)
        if not bad and artifact_id(size, leaves) == artifact:
            return True
        self._demote(manifest, bad)
        return False

    def _demote(self, manifest: Manifest, bad: builtins.list[int]) -> None:
        """Turn a corrupt complete file into a partial that lacks the ``bad`` chunks."""
        artifact = manifest.id
        log.warning("corrupt chunks in a stored artifact; it will be fetched again",
                    extra={"artifact": artifact, "chunks": bad[:16]})
        with self._lock:
            have = bytearray(b"\x01" * manifest.chunks)
            for index in bad:
                have[index] = 0
            partial_dir = self.root / "partial"
            with contextlib.suppress(OSError):
                os.replace(self.object_path(artifact), partial_dir / f"{artifact}.data")
                (partial_dir / f"{artifact}.have").write_bytes(bytes(have))

    # ---- downloading
    def open_partial(self, manifest: Manifest) -> Partial:
        """The partial download of ``manifest``'s artifact, created or resumed (re-hashing the
        chunks it claims to hold). Close it or ``complete()`` it; one at a time per id."""
        if manifest.size > self.max_size:
            raise ArtifactError(f"artifact {manifest.id} is {manifest.size} bytes, over the limit of {self.max_size}")
        with self._lock:
            if manifest.id in self._partials:
                raise ArtifactError(f"{manifest.id} is already being downloaded")
            data = self.root / "partial" / f"{manifest.id}.data"
            self._make_room(manifest.size - (data.stat().st_size if data.exists() else 0), keep=manifest.id)
            self.save_manifest(manifest)
            partial = Partial(self, manifest)
            self._partials[manifest.id] = partial
        return partial

    def release_partial(self, partial: Partial) -> None:
        with self._lock:
            if self._partials.get(partial.id) is partial:
                del self._partials[partial.id]
        partial.close()

    # ---- quota (quota.py)
    def _make_room(self, incoming: int, keep: str = "") -> None:
        if self.quota is not None and incoming > 0:
            with self._lock:
                self.quota.make_room(self, incoming, keep)

    def held(self) -> dict[str, tuple[int, float, bool]]:
        """Every artifact on disk: id -> (bytes, modification time, being downloaded now)."""
        out: dict[str, tuple[int, float, bool]] = {}
        for folder, suffix in (("objects", ""), ("partial", ".data")):
            for path in (self.root / folder).iterdir():
                name = path.name[:len(path.name) - len(suffix)] if suffix else path.name
                if not path.name.endswith(suffix) or not ID_PATTERN.fullmatch(name):
                    continue
                with contextlib.suppress(OSError):
                    stat = path.stat()
                    size, mtime, busy = out.get(name, (0, 0.0, False))
                    out[name] = (size + stat.st_size, max(mtime, stat.st_mtime), name in self._partials)
        return out

    def delete(self, artifact: str) -> None:
        """Remove ``artifact`` (file, partial, manifest); not one being downloaded."""
        with self._lock:
            if artifact in self._partials:
                raise ArtifactError(f"{artifact} is being downloaded")
            for path in (self.object_path(artifact), self.root / "partial" / f"{artifact}.data",
                         self.root / "partial" / f"{artifact}.have", self._manifest_path(artifact)):
                with contextlib.suppress(OSError):
                    path.unlink()
            self._manifests.pop(artifact, None)

    def clear_stale_tmp(self, max_age_s: float = 3600.0) -> None:
        """Delete staging files of adds that died (older than ``max_age_s``; a running add is newer)."""
        now = time.time()
        for path in (self.root / "tmp").iterdir():
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > max_age_s:
                    path.unlink()
