"""App hash: a per-block commitment to the ledger state that replicas compare.

``next_app_hash`` chains the previous app hash, the height and the sorted change set of
the block (every written key with its new value, or a deletion marker): one sha256 pass
over the bytes a block changed, so its cost follows the block, not the state size. Two
replicas that start from the same genesis have equal app hashes at height h iff they
applied identical change sets at every height up to h (see docs/adr/0022).
``full_state_hash`` hashes the whole state (for audits and tests, not per block).
``committee_app_hash`` wraps the app hash of the block that elects the next committee (one block
before an epoch ends) around that committee, so the epoch's last block, which its committee
certifies, commits to its successor (docs/adr/0216).
"""
from __future__ import annotations

import hashlib

from consensus.encoding import encode, encode_uvarint

APP_HASH_DOMAIN = b"dekube/apphash/v1\x00"
STATE_HASH_DOMAIN = b"dekube/statehash/v1\x00"
COMMITTEE_DOMAIN = b"dekube/committee-apphash/v1\x00"


def genesis_app_hash(genesis_hash: bytes, initial_state_hash: bytes) -> bytes:
    return hashlib.sha256(APP_HASH_DOMAIN + genesis_hash + initial_state_hash).digest()


def next_app_hash(previous: bytes, height: int, changes: list[tuple[bytes, bytes | None]]) -> bytes:
    h = hashlib.sha256(APP_HASH_DOMAIN)
    h.update(previous)
    h.update(height.to_bytes(8, "big"))
    parts = []
    for key, value in changes:
        parts.append(encode_uvarint(len(key)))
        parts.append(key)
        if value is None:
            parts.append(b"\x00")
        else:
            parts.append(b"\x01")
            parts.append(encode_uvarint(len(value)))
            parts.append(value)
    h.update(b"".join(parts))
    return h.digest()


def full_state_hash(items: list[tuple[bytes, bytes]]) -> bytes:
    h = hashlib.sha256(STATE_HASH_DOMAIN)
    for key, value in items:
        h.update(encode_uvarint(len(key)) + key + encode_uvarint(len(value)) + value)
    return h.digest()


def committee_app_hash(chain_part: bytes, committee: list[list], start_height: int) -> bytes:
    """The app hash of a block that elected ``committee`` (``[[peer_id, power], ...]``) for heights
    from ``start_height``; ``chain_part`` is its ``next_app_hash``."""
    return hashlib.sha256(COMMITTEE_DOMAIN + chain_part + encode([start_height, committee])).digest()
