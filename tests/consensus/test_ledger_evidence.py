"""Equivocation evidence: a verified double vote slashes (and burns) stake exactly once."""
from test_ledger_kit import CHAIN, Chain, ident

from consensus.messages import DoubleVoteEvidence, Vote, VoteType, sign_vote
from consensus.txcodes import TxCode
from devtools.ledger_chain import QUICK_UNBONDING

VALIDATOR, REPORTER = ident(0), ident(1)


def double_vote(who=VALIDATOR, height=1, round_=0, chain_id=CHAIN, vote_type=VoteType.PRECOMMIT, values=(1, 2)):
    a, b = (sign_vote(who, chain_id, Vote(vote_type, height, round_, bytes([v]) * 32, who.peer_id))
            for v in values)
    return DoubleVoteEvidence(a, b).encode()


def test_evidence_tx_slashes_once_per_offence():
    chain = Chain()
    chain.empty_blocks(2)
    receipt = chain.run(REPORTER, "evidence", {"evidence": double_vote()})
    assert receipt.code == TxCode.OK
    slashed = 10_000 * 500 // 10_000
    assert chain.ledger.stake_info(VALIDATOR.peer_id) == {"bonded": 10_000 - slashed, "unbonding": [],
                                                          "slashed": slashed, "missed": 0,
                                                          "jailed_until": chain.ledger.height + 500}
    assert chain.ledger.state.burned == slashed
    # the same evidence, or another pair of votes for the same step, does not slash again
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote()}).code == TxCode.ALREADY_KNOWN
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote(values=(1, 3))}).code == TxCode.ALREADY_KNOWN
    # a different step is a different offence
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote(vote_type=VoteType.PREVOTE)}).code == TxCode.OK


def test_invalid_evidence_is_refused_without_slashing():
    chain = Chain()
    chain.empty_blocks(2)
    cases = [
        b"\x03junk",
        double_vote(chain_id="another-chain"),
        double_vote(height=50),                # not yet committed
        double_vote(who=ident(5)),             # signer has no stake
    ]
    for evidence in cases:
        assert chain.run(REPORTER, "evidence", {"evidence": evidence}).code == TxCode.INVALID_EVIDENCE
    assert chain.ledger.stake_info(VALIDATOR.peer_id)["slashed"] == 0


def test_evidence_older_than_max_age_is_refused():
    from consensus.genesis import Params
    chain = Chain(params=Params(evidence_max_age=2, min_fee=0))
    chain.empty_blocks(4)
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote(height=1)}).code == TxCode.INVALID_EVIDENCE
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote(height=4)}).code == TxCode.OK


def test_block_evidence_slashes_and_junk_evidence_is_only_an_event():
    chain = Chain()
    chain.empty_blocks(1)
    result = chain.block(evidence=[double_vote(), b"junk"])
    assert chain.ledger.stake_info(VALIDATOR.peer_id)["slashed"] == 500
    kinds = [event["type"] for event in result.events]
    assert kinds == ["validator_slashed", "validator_jailed", "evidence_rejected"]


def test_slash_reaches_unbonding_stake_and_release_pays_only_the_rest():
    from consensus.genesis import Params
    chain = Chain(params=Params(slash_double_sign_bps=5_000, min_fee=0, **QUICK_UNBONDING),
                  balances={VALIDATOR.peer_id: 1, REPORTER.peer_id: 1})  # an empty account cannot transact
    chain.ok(VALIDATOR, "unbond", {"amount": 8_000})          # height 1: releases at height 5
    chain.ok(REPORTER, "evidence", {"evidence": double_vote(height=1)})  # 5_000 of 10_000
    assert chain.ledger.stake_info(VALIDATOR.peer_id) == {"bonded": 0, "unbonding": [[5, 5_000]],
                                                          "slashed": 5_000, "missed": 0, "jailed_until": 502}
    chain.empty_blocks(3)
    assert chain.ledger.balance(VALIDATOR.peer_id) == 1 + 5_000
    assert chain.ledger.state.burned == 5_000
