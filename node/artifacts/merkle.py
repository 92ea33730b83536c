"""Artifact ids: a sha256 Merkle tree over fixed 1 MiB chunks, bound to the total size (ADR 0146).

leaf = sha256(0x00 || chunk); inner = sha256(0x01 || left || right), an odd last node is promoted
unchanged to the next level; id = sha256(0x02 || size as 8 bytes big-endian || root), as 64 hex.
The distinct prefixes keep a leaf from passing for an inner node (second-preimage), and binding
the size keeps a truncated or extended file from sharing an id. An empty artifact has one leaf,
the hash of the empty chunk. The tree is node.merkle's, the project's one (ADR 0190); ``leaf_hash``
and ``HASH_BYTES`` are re-exported for the artifact modules. Everything here is pure and blocking
(callers hash off the event loop).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from node.merkle import HASH_BYTES, leaf_hash, root_of_leaf_hashes

__all__ = ["CHUNK_SIZE", "HASH_BYTES", "ID_PATTERN", "artifact_id", "artifact_id_of_bytes", "artifact_id_of_file",
           "check_id", "chunk_count", "chunk_length", "leaf_hash", "leaves_of_chunks", "leaves_of_file"]

CHUNK_SIZE = 1 << 20
ID_PATTERN = re.compile(r"[0-9a-f]{64}")
_ROOT = b"\x02"


def artifact_id(size: int, leaves: Sequence[bytes]) -> str:
    """The 64-hex id of an artifact of ``size`` bytes with these leaf hashes."""
    if size < 0 or size >= 1 << 64:
        raise ValueError(f"artifact size {size} out of range")
    return hashlib.sha256(_ROOT + size.to_bytes(8, "big") + root_of_leaf_hashes(leaves)).hexdigest()


def chunk_count(size: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Chunks of an artifact of ``size`` bytes (an empty one has one empty chunk)."""
    return max(1, -(-size // chunk_size))


def chunk_length(size: int, index: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Bytes in chunk ``index`` of an artifact of ``size`` bytes."""
    return max(0, min(chunk_size, size - index * chunk_size))


def leaves_of_chunks(chunks: Iterable[bytes | memoryview]) -> list[bytes]:
    leaves = [leaf_hash(chunk) for chunk in chunks]
    return leaves or [leaf_hash(b"")]


def leaves_of_file(path: Path | str) -> tuple[int, list[bytes]]:
    """(size, leaf hashes) of the file at ``path``, read chunk by chunk (blocking)."""
    size, leaves = 0, []
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_SIZE):
            size += len(chunk)
            leaves.append(leaf_hash(chunk))
    return size, leaves or [leaf_hash(b"")]


def artifact_id_of_bytes(data: bytes) -> str:
    view = memoryview(data)
    return artifact_id(len(data), leaves_of_chunks(view[i:i + CHUNK_SIZE] for i in range(0, len(data), CHUNK_SIZE)))


def artifact_id_of_file(path: Path | str) -> str:
    """The artifact id of the file at ``path`` (blocking: reads the whole file)."""
    size, leaves = leaves_of_file(path)
    return artifact_id(size, leaves)


def check_id(artifact: str) -> str:
    """``artifact`` if it is a well-formed id (64 lowercase hex), else ValueError."""
    if not isinstance(artifact, str) or not ID_PATTERN.fullmatch(artifact):
        raise ValueError(f"not an artifact id (64 lowercase hex): {str(artifact)[:80]!r}")
    return artifact
