"""The chain's random beacon (docs/adr/0202): one ECVRF output per block, chained from genesis.

Each block header carries its proposer's RFC 9381 proof (consensus/vrf.py) over ``alpha`` = domain,
chain id, height and the previous block's beacon; the block's beacon is sha256 of the previous beacon
and the proof's output. The output is unique for the proposer's key and that input, so a proposer
cannot choose it (no block time, transaction order or nonce changes it): its only choice is to
propose or not. Nobody can compute a block's beacon before the previous one exists, and nobody but
the proposers of the blocks in between can compute it before those blocks: draws that use the
beacon of a block ``beacon_delay`` blocks after the act that triggers them are unknown to every
party when that act is final. No I/O here.
"""
from __future__ import annotations

import hashlib

from consensus import vrf
from node.identity import Identity

_ALPHA_DOMAIN = b"dekube/beacon/v1\x00"
_NEXT_DOMAIN = b"dekube/beacon-next\x00"
_GENESIS_DOMAIN = b"dekube/beacon-genesis\x00"


class BeaconError(ValueError):
    """A block's beacon proof that does not verify for its proposer."""


def genesis_beacon(genesis_hash: bytes) -> bytes:
    """The beacon before height 1 (public and fixed: the first blocks' draws use later beacons)."""
    return hashlib.sha256(_GENESIS_DOMAIN + genesis_hash).digest()


def beacon_input(chain_id: str, height: int, prev_beacon: bytes) -> bytes:
    """What the proposer of ``height`` proves: its VRF input (``alpha``)."""
    raw = chain_id.encode()
    return _ALPHA_DOMAIN + len(raw).to_bytes(1, "big") + raw + height.to_bytes(8, "big") + prev_beacon


def prove(identity: Identity, chain_id: str, height: int, prev_beacon: bytes) -> bytes:
    """The proposer's 80-byte beacon proof for the block at ``height``."""
    return vrf.prove(identity.seed, beacon_input(chain_id, height, prev_beacon))


def verify(public_key: bytes, chain_id: str, height: int, prev_beacon: bytes, proof: bytes) -> bytes:
    """The beacon of the block at ``height`` proposed by ``public_key`` with ``proof``; else BeaconError."""
    try:
        beta = vrf.verify(public_key, beacon_input(chain_id, height, prev_beacon), proof)
    except vrf.VrfError as exc:
        raise BeaconError(f"the beacon proof does not verify for the proposer: {exc}") from None
    return hashlib.sha256(_NEXT_DOMAIN + prev_beacon + beta).digest()
