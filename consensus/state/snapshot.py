"""State snapshots: the whole ledger state at a snapshot height, in canonical chunks the app hash commits to.

The per-block app hash (``apphash.next_app_hash``) chains change sets, so it says nothing about a
state handed over whole. At every snapshot height ``S`` (a multiple of ``epoch_length``, where the
committee is elected) the app hash also commits to the state (docs/adr/0199):

    app_hash(S) = sha256(SNAPSHOT_DOMAIN || chain_part || state_root)
    chain_part  = next_app_hash(app_hash(S-1), S, changes of block S)
    state_root  = sha256(ROOT_DOMAIN || sha256(chunk_1) || ... || sha256(chunk_n))

where the chunks are the state's sorted items (``LedgerState.items``) split greedily into
``encode([[key, value], ...])`` pieces of at most ``CHUNK_BYTES`` (an item larger than that goes
alone). Block ``S + 1`` carries ``app_hash(S)`` in its header, so a ``Manifest`` (``S``,
``chain_part``, the chunk hashes) is checked against a certified header before any chunk is
fetched, and each chunk against its hash on arrival. Everything here is pure and bounded.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from consensus.encoding import EncodingError, decode, encode

SNAPSHOT_DOMAIN = b"dekube/snapshot-apphash/v1\x00"
ROOT_DOMAIN = b"dekube/state-root/v1\x00"
CHUNK_BYTES = 256 * 1024          # canonical target size of a chunk
MAX_CHUNK_BYTES = 4 * 1024 * 1024  # the largest chunk a node accepts (one record never exceeds it)
MAX_CHUNKS = 1 << 16              # 16 GiB of state at most
MAX_MANIFEST_BYTES = 64 + 40 * MAX_CHUNKS


class SnapshotError(ValueError):
    """A manifest or chunk is malformed, oversized or does not match what the chain committed."""


def is_snapshot_height(height: int, epoch_length: int) -> bool:
    return height > 0 and height % epoch_length == 0


def split_chunks(items: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The canonical chunks of sorted state ``items`` (at least one, possibly empty)."""
    chunks: list[bytes] = []
    current: list[list[bytes]] = []
    size = 0
    for key, value in items:
        cost = len(key) + len(value) + 16
        if current and size + cost > CHUNK_BYTES:
            chunks.append(encode(current))
            current, size = [], 0
        current.append([key, value])
        size += cost
    chunks.append(encode(current))
    return chunks


def state_root(chunk_hashes: list[bytes]) -> bytes:
    return hashlib.sha256(ROOT_DOMAIN + b"".join(chunk_hashes)).digest()


def snapshot_app_hash(chain_part: bytes, root: bytes) -> bytes:
    return hashlib.sha256(SNAPSHOT_DOMAIN + chain_part + root).digest()


@dataclass(frozen=True)
class Manifest:
    height: int
    chain_part: bytes
    chunk_hashes: tuple[bytes, ...]

    @property
    def app_hash(self) -> bytes:
        return snapshot_app_hash(self.chain_part, state_root(list(self.chunk_hashes)))

    def encode(self) -> bytes:
        return encode([self.height, self.chain_part, list(self.chunk_hashes)])

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise SnapshotError(f"manifest of {len(raw)} bytes exceeds {MAX_MANIFEST_BYTES}")
        try:
            height, chain_part, hashes = decode(raw, MAX_MANIFEST_BYTES)
        except (EncodingError, ValueError, TypeError) as exc:
            raise SnapshotError(f"manifest is malformed: {exc}") from None
        if type(height) is not int or height <= 0 or type(chain_part) is not bytes or len(chain_part) != 32:
            raise SnapshotError("manifest height or chain part is malformed")
        if type(hashes) is not list or not 1 <= len(hashes) <= MAX_CHUNKS or \
                any(type(h) is not bytes or len(h) != 32 for h in hashes):
            raise SnapshotError("manifest chunk hashes are malformed")
        return cls(height, chain_part, tuple(hashes))


def make_manifest(height: int, chain_part: bytes, chunks: list[bytes]) -> Manifest:
    return Manifest(height, chain_part, tuple(hashlib.sha256(c).digest() for c in chunks))


def check_chunk(manifest: Manifest, index: int, raw: bytes) -> list[tuple[bytes, bytes]]:
    """The items of chunk ``index`` if ``raw`` is that chunk, else raise SnapshotError saying why."""
    if not 0 <= index < len(manifest.chunk_hashes):
        raise SnapshotError(f"chunk {index} is not in the snapshot of height {manifest.height}")
    if len(raw) > MAX_CHUNK_BYTES:
        raise SnapshotError(f"chunk {index} of {len(raw)} bytes exceeds the {MAX_CHUNK_BYTES}-byte limit")
    if hashlib.sha256(raw).digest() != manifest.chunk_hashes[index]:
        raise SnapshotError(f"chunk {index} does not match its hash in the manifest of height {manifest.height}")
    try:
        pairs = decode(raw, MAX_CHUNK_BYTES)
    except EncodingError as exc:  # a hash match with a bad body means the committed state is bad
        raise SnapshotError(f"chunk {index} is undecodable: {exc}") from None
    if type(pairs) is not list or any(type(p) is not list or len(p) != 2 or type(p[0]) is not bytes
                                      or type(p[1]) is not bytes for p in pairs):
        raise SnapshotError(f"chunk {index} is not a list of key/value pairs")
    return [(k, v) for k, v in pairs]
