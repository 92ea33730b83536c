"""Double-sign guard: the only way the consensus core signs anything.

It remembers what it signed in the last (height, round) it signed in (one entry per step, with sign
bytes and signature), refuses to sign anything at a lower (height, round, step) or different bytes
at an already signed one (re-signing identical bytes returns the same signature), and remembers the
validator's lock (the last non-nil precommit: height, round, value id, plus an opaque proof the core
uses to restore the locked value and its polka). After a restart the core re-adopts the votes of
that round and the lock, so it neither equivocates nor forgets what it promised. ``to_bytes`` is the
state a driver must persist (fsync) *before* sending the signed message; ``SignerGuard.restore``
rebuilds the guard and keeps refusing. No I/O here.

State layout: magic ``DKSG2`` | count u8 | count x (height u64 | round u32 | step u8 | sig[64] |
bytes_len u32 | sign_bytes) | lock_height u64 | lock_round i32 (-1: none) | vid_len u8 | value_id |
proof_len u32 | proof.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from node.identity import Identity, verify

_MAGIC = b"DKSG2"
_ENTRY = struct.Struct(">QIB64sI")
_LOCK = struct.Struct(">QiB")
MAX_SIGN_BYTES = 4096


class Step(IntEnum):
    """Signing steps within a round, in the order a validator signs them."""

    PROPOSE = 1
    PREVOTE = 2
    PRECOMMIT = 3


class DoubleSignRefused(Exception):
    """Signing this would conflict with something already signed."""


class SignerStateError(ValueError):
    """Persisted signer state is corrupt, foreign, or not signed by this identity."""


@dataclass(frozen=True)
class Lock:
    """The validator's lock; ``proof`` is opaque to the guard (the core stores the locked value
    and the prevotes that justified it, so a restarted validator can still convince others)."""

    height: int
    round: int
    value_id: bytes
    proof: bytes = b""


@dataclass(frozen=True)
class SignedEntry:
    height: int
    round: int
    step: Step
    sign_bytes: bytes
    signature: bytes

    @property
    def hrs(self) -> tuple[int, int, int]:
        return (self.height, self.round, int(self.step))


class SignerGuard:
    """Signs consensus messages for one identity, never twice differently for one step."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.peer_id = identity.peer_id
        self.entries: list[SignedEntry] = []  # the last signed (height, round), by step
        self.lock: Lock | None = None

    @property
    def last_hrs(self) -> tuple[int, int, int] | None:
        return self.entries[-1].hrs if self.entries else None

    def sign(self, height: int, round_: int, step: Step, sign_bytes: bytes,
             lock_value_id: bytes | None = None, lock_proof: bytes = b"") -> bytes:
        """Sign ``sign_bytes`` for (height, round, step) or raise ``DoubleSignRefused``.

        ``lock_value_id`` (and its ``lock_proof``) come with a non-nil precommit: the validator
        locks on that value.
        """
        if len(sign_bytes) > MAX_SIGN_BYTES:
            raise ValueError("sign bytes too long")
        hrs = (height, round_, int(step))
        last = self.last_hrs
        if last is not None:
            if hrs == last:
                if sign_bytes != self.entries[-1].sign_bytes:
                    raise DoubleSignRefused(f"conflicting message for already signed step {hrs}")
                return self.entries[-1].signature
            if hrs < last:
                raise DoubleSignRefused(f"{hrs} is below the last signed step {last}")
        entry = SignedEntry(height, round_, Step(step), sign_bytes, self.identity.sign(sign_bytes))
        if last is not None and last[:2] == hrs[:2]:
            self.entries.append(entry)
        else:
            self.entries = [entry]
        if lock_value_id:
            self.lock = Lock(height, round_, lock_value_id, lock_proof)
        return entry.signature

    def signed_at(self, height: int) -> list[SignedEntry]:
        """What was signed in the last round signed in, if that round is at ``height``."""
        return [e for e in self.entries if e.height == height]

    def lock_for(self, height: int) -> Lock | None:
        """The lock to restore when (re)starting ``height``, if the last lock was at it."""
        return self.lock if self.lock is not None and self.lock.height == height else None

    def to_bytes(self) -> bytes:
        parts = [_MAGIC, bytes([len(self.entries)])]
        for e in self.entries:
            parts += [_ENTRY.pack(e.height, e.round, e.step, e.signature, len(e.sign_bytes)),
                      e.sign_bytes]
        lock = self.lock or Lock(0, -1, b"")
        parts += [_LOCK.pack(lock.height, lock.round, len(lock.value_id)), lock.value_id,
                  struct.pack(">I", len(lock.proof)), lock.proof]
        return b"".join(parts)

    @classmethod
    def restore(cls, identity: Identity, data: bytes | None) -> SignerGuard:
        """A guard for ``identity`` from persisted bytes (``None`` or ``b""``: never signed)."""
        guard = cls(identity)
        if not data:
            return guard
        if data[:5] != _MAGIC:
            raise SignerStateError("not dekube signer state (bad magic)")
        try:
            count = data[5]
            pos = 6
            for _ in range(count):
                h, r, s, signature, n = _ENTRY.unpack_from(data, pos)
                pos += _ENTRY.size
                sign_bytes = data[pos:pos + n]
                pos += n
                if len(sign_bytes) != n or n > MAX_SIGN_BYTES or s not in (1, 2, 3):
                    raise SignerStateError("signer state has a malformed entry")
                if not verify(identity.public_key, sign_bytes, signature):
                    raise SignerStateError("signer state was not signed by this identity")
                guard.entries.append(SignedEntry(h, r, Step(s), bytes(sign_bytes), signature))
            lock_h, lock_r, vid_len = _LOCK.unpack_from(data, pos)
            pos += _LOCK.size
            lock_vid = data[pos:pos + vid_len]
            pos += vid_len
            (proof_len,) = struct.unpack_from(">I", data, pos)
            proof = data[pos + 4:pos + 4 + proof_len]
            pos += 4 + proof_len
        except (struct.error, IndexError) as exc:
            raise SignerStateError("signer state truncated") from exc
        if pos != len(data) or len(lock_vid) != vid_len or len(proof) != proof_len:
            raise SignerStateError("signer state truncated or has trailing bytes")
        hrs = [e.hrs for e in guard.entries]
        if hrs != sorted(set(hrs)) or len({x[:2] for x in hrs}) > 1:
            raise SignerStateError("signer state entries are not one round in step order")
        if lock_r >= 0 and vid_len:
            guard.lock = Lock(lock_h, lock_r, bytes(lock_vid), bytes(proof))
        return guard
