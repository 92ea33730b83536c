"""What a member received from each other member in a round (`Receipt`), and the pure functions both
sides of the wire share, so a sender's honest bytes can be recomputed by anyone (docs/adr/0167,
"Receiver-side evidence").

Butterfly: a reducer of [start, stop) receives from every member the chunks `chunk_ranges(start,
stop, chunk)` of its contribution, each `encode_local(codec, flat[a:b])`; its receipt is
`payload_digest` over those payloads in chunk order. All-gather: the sender's whole encoding
(start = stop = chunk = 0). `expected_part_digest` recomputes the butterfly digest from a sender's
flat contribution, with the same `chunk_ranges` and `encode_local` the sender uses.

Signed receipts (docs/adr/0209): with a `WireSigner`, a sender signs `receipt_message` -- the task (the
signer's context), round, sender, receiver, range and the digest of exactly the bytes it sent that
receiver -- and sends the signature with those bytes; the receiver refuses bytes whose signature does
not verify, and keeps it in its `Receipt`. A receipt is then proof of what the sender put on the wire,
which no co-worker can forge: receipts that accuse a sender count only when it signed them.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ml.codecs.base import Codec

from .payloads import Payload, encode_local


@dataclass(frozen=True)
class Receipt:
    sender: str
    digest: str     # sha256 hex of the bytes received from `sender`
    start: int      # butterfly: the range of the sender's contribution this member reduced
    stop: int       # (all-gather: 0, 0 -- the whole encoding)
    chunk: int      # butterfly: the chunk size the range was cut into (all-gather: 0)
    signature: bytes = b""   # the sender's signature of `receipt_message` (empty: the group signs nothing)


RECEIPT_DOMAIN = b"dekube/wire-receipt/1\x00"


def receipt_message(context: bytes, round_id: int, sender: str, receiver: str, digest: str, start: int, stop: int,
                    chunk: int) -> bytes:
    """What a sender signs for the bytes it sent `receiver` in round `round_id` of the task `context`."""
    body = json.dumps([round_id, sender, receiver, digest, start, stop, chunk], separators=(",", ":"))
    return RECEIPT_DOMAIN + len(context).to_bytes(2, "big") + context + body.encode()


@dataclass(frozen=True)
class WireSigner:
    """A member's signing key and its peers' verification, bound to one task (`context`)."""
    me: str
    context: bytes
    sign_message: Callable[[bytes], bytes]
    verify_message: Callable[[str, bytes, bytes], bool]   # (peer, message, signature)

    def sign(self, round_id: int, receiver: str, digest: str, start: int, stop: int, chunk: int) -> str:
        """The hex signature of what this member sent `receiver` (it goes in a frame's meta)."""
        message = receipt_message(self.context, round_id, self.me, receiver, digest, start, stop, chunk)
        return self.sign_message(message).hex()

    def receipt(self, round_id: int, sender: str, digest: str, start: int, stop: int, chunk: int,
                signature: object) -> Receipt | None:
        """The receipt of what `sender` sent this member, if `signature` (hex, from the frame) is the
        sender's over it; else None."""
        if not isinstance(signature, str) or len(signature) != 128:
            return None
        try:
            raw = bytes.fromhex(signature)
        except ValueError:
            return None
        message = receipt_message(self.context, round_id, sender, self.me, digest, start, stop, chunk)
        if not self.verify_message(sender, message, raw):
            return None
        return Receipt(sender, digest, start, stop, chunk, raw)


def chunk_ranges(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """The chunks [a, b) a shard [start, stop) travels in."""
    return [(s, min(s + chunk, stop)) for s in range(start, stop, chunk)]


def feed(hasher: hashlib._Hash, payload: Payload) -> None:
    """Hash `payload` as it goes on the wire (a (header, body) tuple is sent concatenated)."""
    for part in payload if isinstance(payload, tuple) else (payload,):
        hasher.update(part)


def payload_digest(payloads: Iterable[Payload]) -> str:
    hasher = hashlib.sha256()
    for payload in payloads:
        feed(hasher, payload)
    return hasher.hexdigest()


def expected_part_digest(codec: Codec, flat: torch.Tensor, start: int, stop: int, chunk: int) -> str:
    """The digest an honest sender with contribution `flat` produces at the reducer of [start, stop)."""
    if not 0 <= start <= stop <= flat.numel() or chunk <= 0:
        raise ValueError(f"range [{start}, {stop}) chunk {chunk} does not fit {flat.numel()} values")
    return payload_digest(encode_local(codec, flat[a:b], "auditor") for a, b in chunk_ranges(start, stop, chunk))
