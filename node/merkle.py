"""The one sha256 Merkle tree of the project (RFC 6962 shape), with audit paths (ADR 0190).

leaf node = sha256(0x00 || item); inner = sha256(0x01 || left || right); an odd last node is
promoted unchanged to the next level. The distinct prefixes keep a leaf from passing for an inner
node (second-preimage). Block roots (consensus.block), artifact ids (node.artifacts.merkle) and
segment commitments (ml.compute.segment_record) all build on these functions; it sits in ``node``,
the lowest layer, so that every other package may import it. Pure and blocking.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_BYTES = 32
_LEAF, _INNER = b"\x00", b"\x01"


def leaf_hash(item: bytes | memoryview) -> bytes:
    """The leaf node of ``item``: sha256(0x00 || item)."""
    digest = hashlib.sha256(_LEAF)
    digest.update(item)
    return digest.digest()


def inner_hash(left: bytes, right: bytes) -> bytes:
    """The inner node over two children: sha256(0x01 || left || right)."""
    return hashlib.sha256(_INNER + left + right).digest()


def _parents(level: Sequence[bytes]) -> list[bytes]:
    parents = [inner_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        parents.append(level[-1])
    return parents


def root_of_leaf_hashes(nodes: Sequence[bytes]) -> bytes:
    """The root over already hashed leaf nodes (at least one)."""
    if not nodes:
        raise ValueError("a Merkle tree needs at least one leaf")
    level = list(nodes)
    while len(level) > 1:
        level = _parents(level)
    return level[0]


def merkle_root(items: Sequence[bytes]) -> bytes:
    """RFC 6962 tree hash of ``items``; the empty list hashes to sha256(b"")."""
    if not items:
        return hashlib.sha256(b"").digest()
    return root_of_leaf_hashes([leaf_hash(item) for item in items])


def audit_path(items: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path of item ``index``: the sibling at every level where it has one, bottom up."""
    if not 0 <= index < len(items):
        raise ValueError(f"leaf {index} outside {len(items)} leaves")
    level = [leaf_hash(item) for item in items]
    path = []
    while len(level) > 1:
        if index ^ 1 < len(level):
            path.append(level[index ^ 1])
        level = _parents(level)
        index //= 2
    return path


def root_from_path(item: bytes, index: int, count: int, path: Sequence[bytes]) -> bytes | None:
    """The root that ``path`` proves for ``item`` at ``index`` of ``count``, or None when the path
    has the wrong length for that position (callers bound ``count`` and ``path`` first)."""
    node, width, used = leaf_hash(item), count, 0
    while width > 1:
        if index ^ 1 < width:
            if used == len(path):
                return None
            sibling = path[used]
            used += 1
            node = inner_hash(sibling, node) if index % 2 else inner_hash(node, sibling)
        index //= 2
        width = (width + 1) // 2
    return node if used == len(path) else None
