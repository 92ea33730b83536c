"""Validator standing (ADR 0165): double proposals are evidence, offenders are jailed, a validator
that misses its proposer slots is slashed and jailed, jailed validators leave at the next election
and come back only with unjail."""
import pytest
from test_ledger_kit import CHAIN, Chain, ident

from consensus.certificate import encode_certificate
from consensus.committee import ValidatorSet
from consensus.genesis import Params
from consensus.messages import (
    DoubleProposalEvidence,
    MessageError,
    Proposal,
    Vote,
    VoteType,
    decode_evidence,
    sign_proposal,
    sign_vote,
)
from consensus.txcodes import TxCode

VALIDATORS = (0, 1, 2, 3)
REPORTER = ident(5)
OFFENDER = ident(0)


def double_proposal(who=OFFENDER, height=1, round_=0, values=(b"a", b"b"), chain_id=CHAIN):
    a, b = (sign_proposal(who, chain_id, Proposal(height, round_, -1, v, who.peer_id)) for v in values)
    return DoubleProposalEvidence.of(a, b)


def test_double_proposal_evidence_round_trips_and_verifies():
    evidence = double_proposal()
    assert evidence.verify(CHAIN) and not evidence.verify("other-chain")
    raw = evidence.encode()
    assert len(raw) < 300 and decode_evidence(raw) == evidence
    assert DoubleProposalEvidence.of(*reversed([sign_proposal(ident(0), CHAIN, Proposal(1, 0, -1, v, ident(0).peer_id))
                                               for v in (b"a", b"b")])).encode() == raw   # canonical order
    with pytest.raises(MessageError):
        decode_evidence(raw[:-1])
    with pytest.raises(MessageError):
        decode_evidence(b"\x09junk")


def test_same_proposal_twice_is_no_equivocation():
    p = sign_proposal(ident(0), CHAIN, Proposal(1, 0, -1, b"a", ident(0).peer_id))
    with pytest.raises(MessageError):   # identical headers are not canonical evidence
        decode_evidence(DoubleProposalEvidence.of(p, p).encode())
    assert not DoubleProposalEvidence.of(p, p).verify(CHAIN)


def test_double_proposal_slashes_and_jails_once():
    chain = Chain(validators=VALIDATORS)
    chain.empty_blocks(2)
    receipt = chain.run(REPORTER, "evidence", {"evidence": double_proposal().encode()})
    assert receipt.code == TxCode.OK
    stake = chain.ledger.stake_info(ident(0).peer_id)
    assert stake["slashed"] == 500 and stake["jailed_until"] == chain.ledger.height + chain.params.jail_blocks
    again = double_proposal(values=(b"a", b"c")).encode()
    assert chain.run(REPORTER, "evidence", {"evidence": again}).code == TxCode.ALREADY_KNOWN
    forged = double_proposal(chain_id="other").encode()
    assert chain.run(REPORTER, "evidence", {"evidence": forged}).code == TxCode.INVALID_EVIDENCE


def test_jailed_validator_leaves_at_the_next_election_and_returns_only_by_unjail():
    params = Params(epoch_length=5, jail_blocks=4, min_fee=0)
    chain = Chain(validators=VALIDATORS, params=params, balances={ident(i).peer_id: 10_000 for i in range(10)})
    victim = ident(0)
    for v in VALIDATORS:
        chain.ok(ident(v), "register_node", {"roles": ["validator"], "listen_addrs": [], "relay_addrs": [],
                                             "hardware": {"cpu_cores": 1, "ram_mb": 1, "gpu": "", "gpu_mem_mb": 0,
                                                          "bandwidth_mbps": 1}})
    assert victim.peer_id in dict(chain.ledger.validators())
    assert chain.run(victim, "unjail", {}).code == TxCode.BAD_STATE            # not jailed
    chain.ok(REPORTER, "evidence", {"evidence": double_proposal(height=2).encode()})
    assert victim.peer_id not in dict(chain.ledger.validators())
    while chain.ledger.height % params.epoch_length:
        chain.block()
    assert victim.peer_id not in chain.ledger.committee().peer_ids            # elected without it
    receipt = chain.run(victim, "unjail", {})
    jailed_until = chain.ledger.stake_info(victim.peer_id)["jailed_until"]
    if chain.ledger.height < jailed_until:
        assert receipt.code == TxCode.BAD_STATE and "jailed until" in receipt.log
        chain.empty_blocks(jailed_until - chain.ledger.height)
        receipt = chain.run(victim, "unjail", {})
    assert receipt.code == TxCode.OK
    assert victim.peer_id in dict(chain.ledger.validators())
    while chain.ledger.height % params.epoch_length:
        chain.block()
    assert victim.peer_id in chain.ledger.committee().peer_ids


def _certificate(height: int, round_: int) -> bytes:
    """A well-formed certificate of ``height`` decided at ``round_`` (the ledger reads only its round)."""
    votes = [sign_vote(ident(v), CHAIN, Vote(VoteType.PRECOMMIT, height, round_, b"\x01" * 32, ident(v).peer_id))
             for v in VALIDATORS[:3]]
    return encode_certificate(votes)


def test_missed_proposer_slots_jail_and_slash_and_a_made_slot_resets_the_count():
    params = Params(downtime_max_missed=3, slash_downtime_bps=100, min_fee=0, epoch_length=10_000)
    chain = Chain(validators=VALIDATORS, params=params)
    victim = ident(2).peer_id
    committee = ValidatorSet([(p, w) for p, w in chain.ledger.state.committee], chain.ledger.state.committee_start)
    chain.block()                                    # height 1 carries no certificate

    def next_block(victim_online: bool):
        previous = chain.ledger.height
        round_ = 1 if committee.proposer(previous, 0) == victim and not victim_online else 0
        return chain.block(last_commit=_certificate(previous, round_))

    misses = 0
    while misses < 2:                               # two missed slots, then one made: count resets
        before = chain.ledger.stake_info(victim)["missed"]
        next_block(victim_online=False)
        misses += chain.ledger.stake_info(victim)["missed"] > before
    while chain.ledger.stake_info(victim)["missed"]:
        next_block(victim_online=True)
    jailed_events = []
    for _ in range(400):
        jailed_events += [e for e in next_block(victim_online=False).events if e["type"] == "validator_jailed"]
        if jailed_events:
            break
    (event,) = jailed_events
    assert event["validator"] == victim and "missed 4 proposer slots" in event["reason"]
    stake = chain.ledger.stake_info(victim)
    assert stake["slashed"] == 10_000 * 100 // 10_000 and stake["jailed_until"] > 0
    assert all(chain.ledger.stake_info(ident(v).peer_id)["slashed"] == 0 for v in VALIDATORS if v != 2)


def test_downtime_tracking_can_be_turned_off():
    chain = Chain(validators=VALIDATORS, params=Params(downtime_max_missed=0, min_fee=0))
    chain.block()
    for _ in range(40):
        chain.block(last_commit=_certificate(chain.ledger.height, 3))
    assert all(chain.ledger.stake_info(ident(v).peer_id)["missed"] == 0 for v in VALIDATORS)
