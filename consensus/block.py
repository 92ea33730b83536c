"""Blocks: header, raw transactions, evidence and the previous height's commit certificate.

The header commits to chain_id, height, time, the previous block's hash, the Merkle root of
the transactions and of the evidence, the proposer, the hash of the (opaque) last commit
certificate, the proposer's beacon proof (an RFC 9381 VRF proof, consensus/beacon.py, docs/adr/0202)
and ``app_hash``: the app hash of the state AFTER the previous block (as
CometBFT does), so a proposer need not execute its own block before proposing it, and each
block attests to the result of its parent. The block hash is sha256 of the encoded header. The Merkle
roots are node.merkle's RFC 6962 tree (ADR 0190).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from consensus import beacon
from consensus.encoding import EncodingError, decode, encode
from consensus.vrf import PROOF_BYTES as BEACON_PROOF_BYTES
from node.identity import Identity
from node.merkle import merkle_root

HEADER_DOMAIN = b"dekube/block-header/v1\x00"
HASH_BYTES = 32
MAX_LAST_COMMIT_BYTES = 1024 * 1024


class BlockError(ValueError):
    """Bytes that are not a well-formed block, or a block that does not fit its chain."""


@dataclass(frozen=True)
class BlockHeader:
    chain_id: str
    height: int
    time_ms: int
    prev_hash: bytes        # b"" at height 1
    txs_root: bytes
    evidence_root: bytes
    app_hash: bytes         # state after the previous block (after genesis at height 1)
    proposer: str
    last_commit_hash: bytes
    beacon_proof: bytes     # the proposer's VRF proof over the previous beacon (checked by the ledger)

    def to_obj(self) -> list[Any]:
        return [self.chain_id, self.height, self.time_ms, self.prev_hash, self.txs_root,
                self.evidence_root, self.app_hash, self.proposer, self.last_commit_hash, self.beacon_proof]

    @classmethod
    def from_obj(cls, obj: Any) -> BlockHeader:
        if type(obj) is not list or len(obj) != 10:
            raise BlockError("a header is a list of 10 fields")
        header = cls(*obj)
        header.check_types()
        return header

    def check_types(self) -> None:
        if type(self.chain_id) is not str or type(self.proposer) is not str:
            raise BlockError("chain_id and proposer must be text")
        for name in ("height", "time_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise BlockError(f"{name} must be a non-negative integer")
        if type(self.prev_hash) is not bytes or len(self.prev_hash) not in (0, HASH_BYTES):
            raise BlockError("prev_hash must be 32 bytes (or empty at height 1)")
        for name in ("txs_root", "evidence_root", "app_hash", "last_commit_hash"):
            value = getattr(self, name)
            if type(value) is not bytes or len(value) != HASH_BYTES:
                raise BlockError(f"{name} must be 32 bytes")
        if type(self.beacon_proof) is not bytes or len(self.beacon_proof) != BEACON_PROOF_BYTES:
            raise BlockError(f"beacon_proof must be {BEACON_PROOF_BYTES} bytes")

    @property
    def hash(self) -> bytes:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hashlib.sha256(HEADER_DOMAIN + encode(self.to_obj())).digest()
            object.__setattr__(self, "_hash", cached)
        return cached

    def to_json(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id, "height": self.height, "time_ms": self.time_ms,
            "prev_hash": self.prev_hash.hex(), "txs_root": self.txs_root.hex(),
            "evidence_root": self.evidence_root.hex(), "app_hash": self.app_hash.hex(),
            "proposer": self.proposer, "last_commit_hash": self.last_commit_hash.hex(),
            "beacon_proof": self.beacon_proof.hex(),
            "hash": self.hash.hex(),
        }


@dataclass(frozen=True)
class Block:
    header: BlockHeader
    txs: tuple[bytes, ...]
    evidence: tuple[bytes, ...] = ()
    last_commit: bytes = b""

    @property
    def hash(self) -> bytes:
        return self.header.hash

    @property
    def height(self) -> int:
        return self.header.height

    def encode(self) -> bytes:
        return encode([self.header.to_obj(), list(self.txs), list(self.evidence), self.last_commit])

    @classmethod
    def decode(cls, raw: bytes, max_bytes: int) -> Block:
        """Strictly decode a block's structure (``check_roots``/``Ledger.validate_block`` check contents)."""
        try:
            obj = decode(raw, max_size=max_bytes)
        except EncodingError as exc:
            raise BlockError(f"malformed block: {exc}") from None
        if type(obj) is not list or len(obj) != 4:
            raise BlockError("a block is a list of 4 fields")
        header_obj, txs, evidence, last_commit = obj
        if type(txs) is not list or not all(type(tx) is bytes for tx in txs):
            raise BlockError("txs must be a list of bytes")
        if type(evidence) is not list or not all(type(ev) is bytes for ev in evidence):
            raise BlockError("evidence must be a list of bytes")
        if type(last_commit) is not bytes or len(last_commit) > MAX_LAST_COMMIT_BYTES:
            raise BlockError("last_commit must be bytes")
        return cls(BlockHeader.from_obj(header_obj), tuple(txs), tuple(evidence), last_commit)

    def check_roots(self) -> None:
        if merkle_root(self.txs) != self.header.txs_root:
            raise BlockError("txs_root does not match the transactions")
        if merkle_root(self.evidence) != self.header.evidence_root:
            raise BlockError("evidence_root does not match the evidence")
        if hashlib.sha256(self.last_commit).digest() != self.header.last_commit_hash:
            raise BlockError("last_commit_hash does not match the commit certificate")


def build_block(chain_id: str, height: int, time_ms: int, prev_hash: bytes, app_hash: bytes,
                proposer: Identity, prev_beacon: bytes, txs: Iterable[bytes], evidence: Iterable[bytes] = (),
                last_commit: bytes = b"") -> Block:
    """Assemble and beacon-sign a block from raw transactions (e.g. ``Mempool.reap``) and evidence
    bytes; ``prev_beacon``: the beacon after the previous block (``Ledger.beacon``)."""
    txs, evidence = tuple(txs), tuple(evidence)
    header = BlockHeader(chain_id, height, time_ms, prev_hash, merkle_root(txs), merkle_root(evidence),
                         app_hash, proposer.peer_id, hashlib.sha256(last_commit).digest(),
                         beacon.prove(proposer, chain_id, height, prev_beacon))
    header.check_types()
    return Block(header, txs, evidence, last_commit)
