"""SDBFT consensus messages: proposals, votes and double-vote evidence.

Each message has a canonical binary wire encoding (strict decoders, size limits, one error type
for junk: ``MessageError``) and canonical *sign bytes*: a domain tag, the chain id and the message
fields, so a signature is never valid on another chain or for another message kind. The signer's
public key is recovered from its peer ID, so messages carry no separate key. A proposal is signed
over the sha256 of its value (the block), not the value itself. No I/O here.

Wire layouts (big-endian integers):
  vote      = 0x01 | type u8 | height u64 | round u32 | vid_len u8 (0|32) | value_id
              | pid_len u8 | pid | sig[64]
  proposal  = 0x02 | height u64 | round u32 | pol_round i32 (-1: none) | value_len u32 | value
              | pid_len u8 | pid | sig[64]
  evidence  = 0x03 | len u16 | vote_a | len u16 | vote_b      (vote_a < vote_b bytewise: one encoding)
"""
from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from node.identity import (
    Identity,
    InvalidPeerId,
    b58decode,
    b58encode,
    public_key_from_peer_id_bytes,
    verify,
)

VOTE_TAG = 0x01
PROPOSAL_TAG = 0x02
EVIDENCE_TAG = 0x03            # double vote
PROPOSAL_EVIDENCE_TAG = 0x04   # double proposal

VALUE_ID_BYTES = 32
SIGNATURE_BYTES = 64
MAX_HEIGHT = 2**63 - 1
MAX_ROUND = 2**31 - 1
MAX_CHAIN_ID_BYTES = 64
MAX_PROPOSAL_VALUE_BYTES = 8 * 1024 * 1024
MAX_PEER_ID_BYTES = 38  # identity multihash of an ed25519 protobuf key

_VOTE_DOMAIN = b"dekube/sdbft/vote/v1\x00"
_PROPOSAL_DOMAIN = b"dekube/sdbft/proposal/v1\x00"
_VOTE_HEAD = struct.Struct(">BBQI")
_PROPOSAL_HEAD = struct.Struct(">BQIiI")
_U16 = struct.Struct(">H")
_SIGNED_PROPOSAL_HEAD = struct.Struct(">QIi")   # height, round, pol_round (then value id, signature)


class MessageError(ValueError):
    """Bytes or fields that are not a well-formed consensus message."""


class VoteType(IntEnum):
    PREVOTE = 1
    PRECOMMIT = 2


def value_id(value: bytes) -> bytes:
    """The 32-byte identifier of an opaque consensus value (a block)."""
    return hashlib.sha256(value).digest()


def _chain_id_bytes(chain_id: str) -> bytes:
    raw = chain_id.encode("utf-8")
    if not raw or len(raw) > MAX_CHAIN_ID_BYTES:
        raise MessageError(f"chain id must be 1..{MAX_CHAIN_ID_BYTES} bytes")
    return bytes([len(raw)]) + raw


@functools.lru_cache(maxsize=4096)
def _peer_id_to_bytes(peer_id: str) -> bytes:
    try:
        raw = b58decode(peer_id)
        public_key_from_peer_id_bytes(raw)
    except (InvalidPeerId, AttributeError) as exc:
        raise MessageError(f"invalid validator peer id: {exc}") from exc
    return raw


def _public_key(peer_id: str) -> bytes:
    return public_key_from_peer_id_bytes(_peer_id_to_bytes(peer_id))


@functools.lru_cache(maxsize=4096)
def _peer_id_from_bytes(raw: bytes) -> str:
    try:
        public_key_from_peer_id_bytes(raw)
    except InvalidPeerId as exc:
        raise MessageError(f"invalid validator peer id: {exc}") from exc
    return b58encode(raw)


def _check_height_round(height: int, round_: int) -> None:
    if not (isinstance(height, int) and 0 <= height <= MAX_HEIGHT):
        raise MessageError(f"height out of range: {height!r}")
    if not (isinstance(round_, int) and 0 <= round_ <= MAX_ROUND):
        raise MessageError(f"round out of range: {round_!r}")


@dataclass(frozen=True)
class Vote:
    """A prevote or precommit for ``value_id`` (32 bytes) or nil (``b""``) at (height, round)."""

    type: VoteType
    height: int
    round: int
    value_id: bytes
    validator: str
    signature: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.type, VoteType):
            try:
                object.__setattr__(self, "type", VoteType(self.type))
            except ValueError as exc:
                raise MessageError(f"unknown vote type {self.type!r}") from exc
        _check_height_round(self.height, self.round)
        if len(self.value_id) not in (0, VALUE_ID_BYTES):
            raise MessageError("vote value_id must be 32 bytes or empty (nil)")

    @property
    def is_nil(self) -> bool:
        return not self.value_id

    def sign_bytes(self, chain_id: str) -> bytes:
        return b"".join((
            _VOTE_DOMAIN,
            _chain_id_bytes(chain_id),
            struct.pack(">BQIB", self.type, self.height, self.round, len(self.value_id)),
            self.value_id,
            _peer_id_to_bytes(self.validator),
        ))

    def with_signature(self, signature: bytes) -> Vote:
        return Vote(self.type, self.height, self.round, self.value_id, self.validator, signature)


@dataclass(frozen=True)
class Proposal:
    """The proposer's value for (height, round); ``pol_round`` is its valid round or -1."""

    height: int
    round: int
    pol_round: int
    value: bytes
    proposer: str
    signature: bytes = b""

    def __post_init__(self) -> None:
        _check_height_round(self.height, self.round)
        if not (isinstance(self.pol_round, int) and -1 <= self.pol_round < self.round):
            raise MessageError(f"pol_round must be -1 or in [0, round): {self.pol_round!r}")
        if len(self.value) > MAX_PROPOSAL_VALUE_BYTES:
            raise MessageError("proposal value too large")

    @property
    def value_id(self) -> bytes:
        cached = self.__dict__.get("_value_id")
        if cached is None:
            cached = value_id(self.value)
            object.__setattr__(self, "_value_id", cached)
        return cached

    def sign_bytes(self, chain_id: str) -> bytes:
        return b"".join((
            _PROPOSAL_DOMAIN,
            _chain_id_bytes(chain_id),
            struct.pack(">QIi", self.height, self.round, self.pol_round),
            self.value_id,
            _peer_id_to_bytes(self.proposer),
        ))

    def with_signature(self, signature: bytes) -> Proposal:
        return Proposal(self.height, self.round, self.pol_round, self.value, self.proposer, signature)


def vote_from_sign_bytes(sign_bytes: bytes, chain_id: str, signature: bytes) -> Vote:
    """Rebuild a signed vote from its sign bytes (a restarted validator re-adopting its votes)."""
    prefix = _VOTE_DOMAIN + _chain_id_bytes(chain_id)
    if not sign_bytes.startswith(prefix):
        raise MessageError("not vote sign bytes for this chain")
    reader = _Reader(sign_bytes[len(prefix):])
    vtype, height, round_, vid_len = reader.unpack(struct.Struct(">BQIB"))
    vid = reader.take(vid_len)
    validator = _peer_id_from_bytes(reader.take(len(reader.data) - reader.pos))
    try:
        return Vote(VoteType(vtype), height, round_, vid, validator, signature)
    except ValueError as exc:
        raise MessageError(f"bad vote sign bytes: {exc}") from exc


def sign_vote(identity: Identity, chain_id: str, vote: Vote) -> Vote:
    """Sign ``vote`` (its validator must be ``identity``) without any double-sign guard."""
    if vote.validator != identity.peer_id:
        raise MessageError("vote validator is not the signing identity")
    return vote.with_signature(identity.sign(vote.sign_bytes(chain_id)))


def sign_proposal(identity: Identity, chain_id: str, proposal: Proposal) -> Proposal:
    """Sign ``proposal`` (its proposer must be ``identity``) without any double-sign guard."""
    if proposal.proposer != identity.peer_id:
        raise MessageError("proposal proposer is not the signing identity")
    return proposal.with_signature(identity.sign(proposal.sign_bytes(chain_id)))


def verify_vote(vote: Vote, chain_id: str) -> bool:
    """True if the vote's signature is valid for its validator on ``chain_id``; never raises."""
    try:
        return verify(_public_key(vote.validator), vote.sign_bytes(chain_id), vote.signature)
    except (MessageError, TypeError):
        return False


def verify_proposal(proposal: Proposal, chain_id: str) -> bool:
    """True if the proposal's signature is valid for its proposer on ``chain_id``; never raises."""
    try:
        return verify(_public_key(proposal.proposer), proposal.sign_bytes(chain_id), proposal.signature)
    except (MessageError, TypeError):
        return False


def _signature_bytes(signature: bytes) -> bytes:
    if len(signature) != SIGNATURE_BYTES:
        raise MessageError("message is unsigned or its signature is not 64 bytes")
    return signature


def encode_vote(vote: Vote) -> bytes:
    pid = _peer_id_to_bytes(vote.validator)
    return b"".join((
        _VOTE_HEAD.pack(VOTE_TAG, vote.type, vote.height, vote.round),
        bytes([len(vote.value_id)]), vote.value_id,
        bytes([len(pid)]), pid,
        _signature_bytes(vote.signature),
    ))


class _Reader:
    """Bounds-checked cursor over a message's bytes."""

    def __init__(self, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MessageError("message must be bytes")
        self.data = bytes(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise MessageError("message truncated")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        return fmt.unpack(self.take(fmt.size))

    def u8(self) -> int:
        return self.take(1)[0]

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise MessageError("trailing bytes after message")


def _read_vote(reader: _Reader) -> Vote:
    tag, vtype, height, round_ = reader.unpack(_VOTE_HEAD)
    if tag != VOTE_TAG:
        raise MessageError("not a vote")
    vid_len = reader.u8()
    if vid_len not in (0, VALUE_ID_BYTES):
        raise MessageError("vote value_id must be 32 bytes or empty")
    vid = reader.take(vid_len)
    pid_len = reader.u8()
    if pid_len > MAX_PEER_ID_BYTES:
        raise MessageError("validator peer id too long")
    validator = _peer_id_from_bytes(reader.take(pid_len))
    signature = reader.take(SIGNATURE_BYTES)
    try:
        return Vote(VoteType(vtype), height, round_, vid, validator, signature)
    except ValueError as exc:
        raise MessageError(f"bad vote: {exc}") from exc


def decode_vote(data: bytes) -> Vote:
    reader = _Reader(data)
    vote = _read_vote(reader)
    reader.finish()
    return vote


def encode_vote_list(votes: Iterable[Vote]) -> bytes:
    """Votes one after another, each as a big-endian u16 length and ``encode_vote`` bytes
    (the count travels in the enclosing message)."""
    parts = []
    for vote in votes:
        raw = encode_vote(vote)
        parts += [struct.pack(">H", len(raw)), raw]
    return b"".join(parts)


def decode_vote_list(data: bytes, pos: int, count: int) -> tuple[list[Vote], int]:
    """``count`` votes written by ``encode_vote_list`` starting at ``pos``; returns them and the
    position after the last. Raises ``struct.error`` when truncated, ``MessageError`` on a bad vote."""
    votes = []
    for _ in range(count):
        (n,) = struct.unpack_from(">H", data, pos)
        votes.append(decode_vote(data[pos + 2:pos + 2 + n]))
        pos += 2 + n
    return votes, pos


def encode_proposal(proposal: Proposal) -> bytes:
    pid = _peer_id_to_bytes(proposal.proposer)
    return b"".join((
        _PROPOSAL_HEAD.pack(PROPOSAL_TAG, proposal.height, proposal.round, proposal.pol_round,
                            len(proposal.value)),
        proposal.value,
        bytes([len(pid)]), pid,
        _signature_bytes(proposal.signature),
    ))


def decode_proposal(data: bytes, max_value_bytes: int = MAX_PROPOSAL_VALUE_BYTES) -> Proposal:
    reader = _Reader(data)
    tag, height, round_, pol_round, value_len = reader.unpack(_PROPOSAL_HEAD)
    if tag != PROPOSAL_TAG:
        raise MessageError("not a proposal")
    if value_len > min(max_value_bytes, MAX_PROPOSAL_VALUE_BYTES):
        raise MessageError(f"proposal value of {value_len} bytes exceeds the limit")
    value = reader.take(value_len)
    pid_len = reader.u8()
    if pid_len > MAX_PEER_ID_BYTES:
        raise MessageError("proposer peer id too long")
    proposer = _peer_id_from_bytes(reader.take(pid_len))
    signature = reader.take(SIGNATURE_BYTES)
    reader.finish()
    return Proposal(height, round_, pol_round, value, proposer, signature)


def encode_message(message: Vote | Proposal) -> bytes:
    """Wire bytes of a vote or proposal (the first byte tells which)."""
    if isinstance(message, Vote):
        return encode_vote(message)
    if isinstance(message, Proposal):
        return encode_proposal(message)
    raise MessageError(f"not a consensus message: {type(message).__name__}")


def decode_message(data: bytes, max_value_bytes: int = MAX_PROPOSAL_VALUE_BYTES) -> Vote | Proposal:
    """Decode a vote or a proposal; raises ``MessageError`` on anything else."""
    if not data:
        raise MessageError("empty message")
    if data[0] == VOTE_TAG:
        return decode_vote(data)
    if data[0] == PROPOSAL_TAG:
        return decode_proposal(data, max_value_bytes)
    raise MessageError(f"unknown consensus message tag {data[0]:#x}")


@dataclass(frozen=True)
class DoubleVoteEvidence:
    """Two signed votes by one validator for one (height, round, type) with different values.

    The pair is stored in canonical order (``encode_vote(vote_a) < encode_vote(vote_b)``), so
    equal evidence has equal bytes and ``evidence_id`` whichever order it was built in.
    """

    vote_a: Vote
    vote_b: Vote

    def __post_init__(self) -> None:
        if not (isinstance(self.vote_a, Vote) and isinstance(self.vote_b, Vote)):
            raise MessageError("evidence needs two votes")
        if encode_vote(self.vote_b) < encode_vote(self.vote_a):
            a, b = self.vote_b, self.vote_a
            object.__setattr__(self, "vote_a", a)
            object.__setattr__(self, "vote_b", b)

    @property
    def validator(self) -> str:
        return self.vote_a.validator

    @property
    def height(self) -> int:
        return self.vote_a.height

    def verify(self, chain_id: str) -> bool:
        """Same validator, height, round and type; different values; both signatures valid."""
        a, b = self.vote_a, self.vote_b
        return (
            a.validator == b.validator
            and a.height == b.height
            and a.round == b.round
            and a.type == b.type
            and a.value_id != b.value_id
            and verify_vote(a, chain_id)
            and verify_vote(b, chain_id)
        )

    def encode(self) -> bytes:
        a, b = encode_vote(self.vote_a), encode_vote(self.vote_b)
        return bytes([EVIDENCE_TAG]) + _U16.pack(len(a)) + a + _U16.pack(len(b)) + b

    @property
    def evidence_id(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes) -> DoubleVoteEvidence:
        reader = _Reader(data)
        if reader.u8() != EVIDENCE_TAG:
            raise MessageError("not double-vote evidence")
        raw = []
        for _ in range(2):
            (length,) = reader.unpack(_U16)
            raw.append(reader.take(length))
        reader.finish()
        if not raw[0] < raw[1]:
            raise MessageError("evidence votes not in canonical order (or identical)")
        return cls(decode_vote(raw[0]), decode_vote(raw[1]))


@dataclass(frozen=True)
class SignedProposalHeader:
    """What a proposer signs (``Proposal.sign_bytes``) without the block itself: height, round,
    pol_round and the value id, with the signature. Enough to prove a proposal was signed."""

    height: int
    round: int
    pol_round: int
    value_id: bytes
    proposer: str
    signature: bytes

    @classmethod
    def of(cls, proposal: Proposal) -> SignedProposalHeader:
        return cls(proposal.height, proposal.round, proposal.pol_round, proposal.value_id, proposal.proposer,
                   proposal.signature)

    def sign_bytes(self, chain_id: str) -> bytes:
        return b"".join((
            _PROPOSAL_DOMAIN,
            _chain_id_bytes(chain_id),
            _SIGNED_PROPOSAL_HEAD.pack(self.height, self.round, self.pol_round),
            self.value_id,
            _peer_id_to_bytes(self.proposer),
        ))

    def verify(self, chain_id: str) -> bool:
        try:
            return verify(_public_key(self.proposer), self.sign_bytes(chain_id), self.signature)
        except (MessageError, TypeError):
            return False

    def encode(self) -> bytes:
        """The header without the proposer (evidence carries it once)."""
        if len(self.value_id) != VALUE_ID_BYTES:
            raise MessageError("a proposal's value id is 32 bytes")
        return _SIGNED_PROPOSAL_HEAD.pack(self.height, self.round, self.pol_round) + self.value_id + \
            _signature_bytes(self.signature)


@dataclass(frozen=True)
class DoubleProposalEvidence:
    """Two different signed proposals by one proposer for one (height, round): the proposer
    equivocated (docs/adr/0165). Carried as signed headers, not blocks, so evidence stays ~250 bytes.
    Stored in canonical order, so equal evidence has equal bytes."""

    first: SignedProposalHeader
    second: SignedProposalHeader

    def __post_init__(self) -> None:
        if self.second.encode() < self.first.encode():
            a, b = self.second, self.first
            object.__setattr__(self, "first", a)
            object.__setattr__(self, "second", b)

    @classmethod
    def of(cls, a: Proposal, b: Proposal) -> DoubleProposalEvidence:
        return cls(SignedProposalHeader.of(a), SignedProposalHeader.of(b))

    @property
    def validator(self) -> str:
        return self.first.proposer

    @property
    def height(self) -> int:
        return self.first.height

    @property
    def round(self) -> int:
        return self.first.round

    def verify(self, chain_id: str) -> bool:
        """Same proposer, height and round; different signed contents; both signatures valid."""
        a, b = self.first, self.second
        return (a.proposer == b.proposer and a.height == b.height and a.round == b.round
                and (a.value_id, a.pol_round) != (b.value_id, b.pol_round)
                and a.verify(chain_id) and b.verify(chain_id))

    def encode(self) -> bytes:
        pid = _peer_id_to_bytes(self.first.proposer)
        return bytes([PROPOSAL_EVIDENCE_TAG, len(pid)]) + pid + self.first.encode() + self.second.encode()

    @property
    def evidence_id(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes) -> DoubleProposalEvidence:
        reader = _Reader(data)
        if reader.u8() != PROPOSAL_EVIDENCE_TAG:
            raise MessageError("not double-proposal evidence")
        pid_len = reader.u8()
        if pid_len > MAX_PEER_ID_BYTES:
            raise MessageError("proposer peer id too long")
        proposer = _peer_id_from_bytes(reader.take(pid_len))
        headers = []
        for _ in range(2):
            height, round_, pol_round = reader.unpack(_SIGNED_PROPOSAL_HEAD)
            headers.append(SignedProposalHeader(height, round_, pol_round, reader.take(VALUE_ID_BYTES), proposer,
                                                reader.take(SIGNATURE_BYTES)))
        reader.finish()
        if not headers[0].encode() < headers[1].encode():
            raise MessageError("evidence proposals not in canonical order (or identical)")
        return cls(headers[0], headers[1])


Evidence = DoubleVoteEvidence | DoubleProposalEvidence


def decode_evidence(data: bytes) -> Evidence:
    """Double-vote or double-proposal evidence (the first byte tells which)."""
    if not data:
        raise MessageError("empty evidence")
    if data[0] == EVIDENCE_TAG:
        return DoubleVoteEvidence.decode(data)
    if data[0] == PROPOSAL_EVIDENCE_TAG:
        return DoubleProposalEvidence.decode(data)
    raise MessageError(f"unknown evidence tag {data[0]:#x}")
