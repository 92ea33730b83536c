"""An artifact's manifest: size, chunk size and every chunk's leaf hash, checkable against the id.

A downloader asks a holder for the manifest first and trusts it only once ``Manifest.decode``
recomputed the id from it; then each chunk is checked against its own leaf hash on arrival
(ADR 0146). Binary form: b"DKAM" magic, version 1, size u64, chunk_size u32, count u32, then
count leaf hashes of 32 bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .merkle import CHUNK_SIZE, HASH_BYTES, artifact_id, chunk_count, chunk_length, leaf_hash

MAGIC = b"DKAM"
VERSION = 1
_HEADER = struct.Struct(">4sBQII")


class ManifestError(ValueError):
    """A manifest that is malformed, too large, or not the one of the id it claims."""


@dataclass(frozen=True)
class Manifest:
    size: int
    leaves: tuple[bytes, ...]
    chunk_size: int = CHUNK_SIZE

    @property
    def id(self) -> str:
        return artifact_id(self.size, self.leaves)

    @property
    def chunks(self) -> int:
        return len(self.leaves)

    def chunk_length(self, index: int) -> int:
        return chunk_length(self.size, index, self.chunk_size)

    def offset(self, index: int) -> int:
        return index * self.chunk_size

    def chunk_ok(self, index: int, data: bytes | memoryview) -> bool:
        """Whether ``data`` is chunk ``index`` of this artifact."""
        return (0 <= index < self.chunks and len(data) == self.chunk_length(index)
                and leaf_hash(data) == self.leaves[index])

    def encode(self) -> bytes:
        return _HEADER.pack(MAGIC, VERSION, self.size, self.chunk_size, len(self.leaves)) + b"".join(self.leaves)

    @classmethod
    def decode(cls, data: bytes, expected_id: str, max_size: int) -> Manifest:
        """The manifest in ``data`` if it is well formed, describes at most ``max_size`` bytes and
        hashes to ``expected_id``; else ManifestError."""
        if len(data) < _HEADER.size:
            raise ManifestError("manifest shorter than its header")
        magic, version, size, chunk_size, count = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise ManifestError("not a version-1 artifact manifest")
        if chunk_size != CHUNK_SIZE:
            raise ManifestError(f"chunk size {chunk_size} is not {CHUNK_SIZE}")
        if size > max_size:
            raise ManifestError(f"artifact of {size} bytes exceeds the limit of {max_size}")
        if count != chunk_count(size, chunk_size) or len(data) != _HEADER.size + count * HASH_BYTES:
            raise ManifestError(f"manifest lists {count} chunks, {size} bytes need {chunk_count(size, chunk_size)}")
        body = data[_HEADER.size:]
        manifest = cls(size, tuple(body[i:i + HASH_BYTES] for i in range(0, len(body), HASH_BYTES)), chunk_size)
        if manifest.id != expected_id:
            raise ManifestError(f"manifest does not hash to {expected_id}")
        return manifest


def max_manifest_bytes(max_size: int) -> int:
    """The largest encoded manifest of an artifact of at most ``max_size`` bytes."""
    return _HEADER.size + chunk_count(max_size) * HASH_BYTES
