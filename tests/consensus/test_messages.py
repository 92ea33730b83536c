"""Consensus messages: sign/verify over the chain id, strict round-trip codecs, evidence, fuzzing."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.messages import (
    MAX_PROPOSAL_VALUE_BYTES,
    DoubleVoteEvidence,
    MessageError,
    Proposal,
    Vote,
    VoteType,
    decode_message,
    decode_proposal,
    decode_vote,
    encode_message,
    encode_proposal,
    encode_vote,
    sign_proposal,
    sign_vote,
    value_id,
    verify_proposal,
    verify_vote,
)
from node.identity import Identity

CHAIN = "dekube-test"
ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
VID = value_id(b"block-1")


def _vote(identity=ALICE, vtype=VoteType.PREVOTE, height=5, round_=2, vid=VID):
    return sign_vote(identity, CHAIN, Vote(vtype, height, round_, vid, identity.peer_id))


def test_vote_signature_binds_chain_id_and_fields():
    vote = _vote()
    assert verify_vote(vote, CHAIN)
    assert not verify_vote(vote, "other-chain")
    for tampered in (
        Vote(VoteType.PRECOMMIT, 5, 2, VID, ALICE.peer_id, vote.signature),
        Vote(VoteType.PREVOTE, 6, 2, VID, ALICE.peer_id, vote.signature),
        Vote(VoteType.PREVOTE, 5, 3, VID, ALICE.peer_id, vote.signature),
        Vote(VoteType.PREVOTE, 5, 2, b"", ALICE.peer_id, vote.signature),
        Vote(VoteType.PREVOTE, 5, 2, VID, BOB.peer_id, vote.signature),
    ):
        assert not verify_vote(tampered, CHAIN)


def test_sign_bytes_differ_between_votes_and_proposals_and_chains():
    vote = Vote(VoteType.PREVOTE, 1, 0, VID, ALICE.peer_id)
    assert vote.sign_bytes("a") != vote.sign_bytes("b")
    prop = Proposal(1, 0, -1, b"block-1", ALICE.peer_id)
    assert prop.sign_bytes(CHAIN) != vote.sign_bytes(CHAIN)
    with pytest.raises(MessageError):
        vote.sign_bytes("")


def test_vote_round_trip_and_nil():
    for vote in (_vote(), _vote(vid=b""), _vote(vtype=VoteType.PRECOMMIT, height=0, round_=0)):
        data = encode_vote(vote)
        assert decode_vote(data) == vote
        assert decode_message(data) == vote
        assert encode_message(decode_vote(data)) == data
    assert _vote(vid=b"").is_nil


def test_proposal_round_trip_and_signature():
    prop = sign_proposal(ALICE, CHAIN, Proposal(7, 3, 1, b"x" * 1000, ALICE.peer_id))
    assert verify_proposal(prop, CHAIN)
    assert not verify_proposal(prop, "other")
    data = encode_proposal(prop)
    assert decode_proposal(data) == prop
    assert decode_message(data) == prop and encode_message(prop) == data
    forged = Proposal(7, 3, 1, b"y" * 1000, ALICE.peer_id, prop.signature)
    assert not verify_proposal(forged, CHAIN)
    assert prop.value_id == value_id(b"x" * 1000)


def test_proposal_limits():
    with pytest.raises(MessageError):
        Proposal(1, 0, 0, b"", ALICE.peer_id)  # pol_round must be < round
    with pytest.raises(MessageError):
        Proposal(1, 0, -2, b"", ALICE.peer_id)
    big = sign_proposal(ALICE, CHAIN, Proposal(1, 0, -1, b"z" * 2000, ALICE.peer_id))
    with pytest.raises(MessageError, match="exceeds"):
        decode_proposal(encode_proposal(big), max_value_bytes=1000)
    with pytest.raises(MessageError):
        Proposal(1, 0, -1, b"z" * (MAX_PROPOSAL_VALUE_BYTES + 1), ALICE.peer_id)


def test_unsigned_message_cannot_be_encoded_and_bad_fields_rejected():
    with pytest.raises(MessageError):
        encode_vote(Vote(VoteType.PREVOTE, 1, 0, VID, ALICE.peer_id))
    with pytest.raises(MessageError):
        Vote(VoteType.PREVOTE, 1, 0, b"short", ALICE.peer_id)
    with pytest.raises(MessageError):
        Vote(3, 1, 0, VID, ALICE.peer_id)
    with pytest.raises(MessageError):
        Vote(VoteType.PREVOTE, -1, 0, VID, ALICE.peer_id)
    with pytest.raises(MessageError):
        sign_vote(BOB, CHAIN, Vote(VoteType.PREVOTE, 1, 0, VID, ALICE.peer_id))
    assert not verify_vote(Vote(VoteType.PREVOTE, 1, 0, VID, "not-a-peer-id", b"s" * 64), CHAIN)


def test_decoders_reject_truncation_trailing_bytes_and_bad_tags():
    data = encode_vote(_vote())
    for bad in (b"", data[:-1], data + b"\0", b"\x09" + data[1:], data[:1] + b"\x07" + data[2:]):
        with pytest.raises(MessageError):
            decode_message(bad)
    prop = encode_proposal(sign_proposal(ALICE, CHAIN, Proposal(1, 0, -1, b"v", ALICE.peer_id)))
    for bad in (prop[:-1], prop + b"x"):
        with pytest.raises(MessageError):
            decode_proposal(bad)


def test_double_vote_evidence():
    a = _vote(vid=VID)
    b = _vote(vid=value_id(b"block-2"))
    ev = DoubleVoteEvidence(a, b)
    assert ev.verify(CHAIN)
    assert not ev.verify("other")
    assert ev.validator == ALICE.peer_id and ev.height == 5
    assert DoubleVoteEvidence(b, a) == ev and DoubleVoteEvidence(b, a).encode() == ev.encode()
    assert DoubleVoteEvidence.decode(ev.encode()) == ev
    assert DoubleVoteEvidence(b, a).evidence_id == ev.evidence_id
    nil = _vote(vid=b"")
    assert DoubleVoteEvidence(a, nil).verify(CHAIN)  # value vs nil also equivocates
    # not evidence: same value, different rounds/types/validators, forged signature
    assert not DoubleVoteEvidence(a, a).verify(CHAIN)
    assert not DoubleVoteEvidence(a, _vote(round_=3, vid=value_id(b"2"))).verify(CHAIN)
    assert not DoubleVoteEvidence(a, _vote(vtype=VoteType.PRECOMMIT, vid=value_id(b"2"))).verify(CHAIN)
    assert not DoubleVoteEvidence(a, _vote(identity=BOB, vid=value_id(b"2"))).verify(CHAIN)
    forged = Vote(VoteType.PREVOTE, 5, 2, value_id(b"2"), ALICE.peer_id, b.signature)
    assert not DoubleVoteEvidence(a, forged).verify(CHAIN)


def test_evidence_decoder_is_strict():
    ev = DoubleVoteEvidence(_vote(vid=VID), _vote(vid=b""))
    data = ev.encode()
    raw_a, raw_b = encode_vote(ev.vote_a), encode_vote(ev.vote_b)
    swapped = b"\x03" + len(raw_b).to_bytes(2, "big") + raw_b + len(raw_a).to_bytes(2, "big") + raw_a
    for bad in (data[:-1], data + b"\0", b"\x01" + data[1:], swapped):
        with pytest.raises(MessageError):
            DoubleVoteEvidence.decode(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_decoders_raise_only_message_error(data):
    for decode in (decode_message, decode_vote, decode_proposal, DoubleVoteEvidence.decode):
        try:
            decode(data)
        except MessageError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.integers(0, 255))
def test_fuzz_mutated_vote_never_crashes_and_never_verifies_when_changed(pos, byte):
    data = bytearray(encode_vote(_vote()))
    pos %= len(data)
    data[pos] = byte
    try:
        vote = decode_vote(bytes(data))
    except MessageError:
        return
    if bytes(data) != encode_vote(_vote()):
        assert not verify_vote(vote, CHAIN)
