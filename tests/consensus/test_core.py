"""Tendermint core: the upon-rules of Algorithm 1, locking, round skipping, evidence, restarts."""
from consensus.committee import ValidatorSet
from consensus.messages import (
    DoubleProposalEvidence,
    Proposal,
    Vote,
    VoteType,
    sign_proposal,
    sign_vote,
    value_id,
)
from consensus.signer import SignerGuard, Step
from consensus.tendermint import (
    MAX_FUTURE_ROUNDS_PER_VALIDATOR,
    Broadcast,
    Commit,
    EvidenceFound,
    PersistSignerState,
    ScheduleTimeout,
    TendermintCore,
    TimeoutConfig,
)
from node.identity import Identity

CHAIN = "core-test"
IDS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(4)]
VS = ValidatorSet({ident.peer_id: 10 for ident in IDS})
BY_PID = {ident.peer_id: ident for ident in IDS}


def make_core(ident, is_valid=lambda h, v: not v.startswith(b"bad"), signer=None, get_value=None):
    return TendermintCore(CHAIN, signer or SignerGuard(ident),
                          get_value=get_value or (lambda h: b"block-%d-" % h + ident.peer_id.encode()),
                          is_valid=is_valid)


def of_type(outputs, kind):
    return [o for o in outputs if isinstance(o, kind)]


def broadcasts(outputs):
    return [o.message for o in of_type(outputs, Broadcast)]


def vote(ident, vtype, round_, vid, height=0):
    return sign_vote(ident, CHAIN, Vote(vtype, height, round_, vid, ident.peer_id))


def proposal(ident, round_, value, pol_round=-1, height=0):
    return sign_proposal(ident, CHAIN, Proposal(height, round_, pol_round, value, ident.peer_id))


def run_network(cores, initial, deliver=lambda src, dst, msg: True):
    """Deliver every broadcast to every other core until quiet; returns commits per core."""
    queue = [(i, out) for i, outs in enumerate(initial) for out in outs]
    commits = {}
    steps = 0
    while queue and steps < 10_000:
        steps += 1
        src, out = queue.pop(0)
        if isinstance(out, Commit):
            commits[src] = out
        elif isinstance(out, Broadcast):
            for dst, core in enumerate(cores):
                if dst != src and deliver(src, dst, out.message):
                    queue.extend((dst, o) for o in core.on_message(out.message))
    return commits


def proposer_identity(height, round_):
    return BY_PID[VS.proposer(height, round_)]


def test_all_honest_commit_the_same_value_with_a_valid_certificate():
    cores = [make_core(ident) for ident in IDS]
    commits = run_network(cores, [c.start_height(0, VS) for c in cores])
    assert sorted(commits) == [0, 1, 2, 3]
    values = {c.value for c in commits.values()}
    assert len(values) == 1
    (value,) = values
    assert value == b"block-0-" + VS.proposer(0, 0).encode()
    for c in commits.values():
        assert c.height == 0 and c.round == 0
        assert VS.verify_commit(CHAIN, 0, value_id(value), c.certificate)
    assert all(core.decided for core in cores)


def test_persist_comes_before_every_own_broadcast():
    cores = [make_core(ident) for ident in IDS]
    outputs = []
    initial = [c.start_height(0, VS) for c in cores]
    outputs.extend(initial[0])
    queue = [(i, o) for i, outs in enumerate(initial) for o in outs]
    while queue:
        src, out = queue.pop(0)
        if isinstance(out, Broadcast):
            for dst, core in enumerate(cores):
                if dst != src:
                    res = core.on_message(out.message)
                    if dst == 0:
                        outputs.extend(res)
                    queue.extend((dst, o) for o in res)
    sent = [i for i, o in enumerate(outputs) if isinstance(o, Broadcast)]
    assert sent
    for i in sent:
        assert isinstance(outputs[i - 1], PersistSignerState)
        assert SignerGuard.restore(IDS[0], outputs[i - 1].state).last_hrs is not None


def test_timeouts_grow_linearly_per_round_and_propose_timeout_prevotes_nil():
    ident = next(i for i in IDS if i.peer_id != VS.proposer(0, 0))
    timeouts = TimeoutConfig(propose=1.0, propose_delta=0.5)
    core = TendermintCore(CHAIN, SignerGuard(ident), lambda h: b"v", lambda h, v: True, timeouts)
    out = core.start_height(0, VS)
    (sched,) = of_type(out, ScheduleTimeout)
    assert (sched.step, sched.height, sched.round, sched.delay) == (Step.PROPOSE, 0, 0, 1.0)
    out = core.on_timeout(Step.PROPOSE, 0, 0)
    (prevote,) = broadcasts(out)
    assert prevote.type is VoteType.PREVOTE and prevote.is_nil and core.step is Step.PREVOTE
    assert core.on_timeout(Step.PROPOSE, 0, 0) == []  # stale
    # 2f+1 prevotes of any kind -> timeoutPrevote; on it -> precommit nil
    others = [i for i in IDS if i is not ident]
    out = []
    for other in others[:2]:
        out += core.on_vote(vote(other, VoteType.PREVOTE, 0, value_id(b"x") if other is others[0] else b""))
    (sched,) = of_type(out, ScheduleTimeout)
    assert sched.step is Step.PREVOTE
    out = core.on_timeout(Step.PREVOTE, 0, 0)
    (precommit,) = broadcasts(out)
    assert precommit.type is VoteType.PRECOMMIT and precommit.is_nil
    out = []
    for other in others[:2]:
        out += core.on_vote(vote(other, VoteType.PRECOMMIT, 0, b""))
    (sched,) = of_type(out, ScheduleTimeout)
    assert sched.step is Step.PRECOMMIT
    out = core.on_timeout(Step.PRECOMMIT, 0, 0)
    assert core.round == 1
    sched = of_type(out, ScheduleTimeout)[-1]
    assert sched.round == 1 and sched.delay == 1.5


def test_invalid_proposal_gets_a_nil_prevote():
    ident = next(i for i in IDS if i.peer_id != VS.proposer(0, 0))
    core = make_core(ident)
    core.start_height(0, VS)
    out = core.on_proposal(proposal(proposer_identity(0, 0), 0, b"bad block"))
    (prevote,) = broadcasts(out)
    assert prevote.is_nil


def test_proposal_from_wrong_proposer_or_bad_signature_is_ignored():
    ident = next(i for i in IDS if i.peer_id != VS.proposer(0, 0))
    impostor = next(i for i in IDS if i.peer_id != VS.proposer(0, 0) and i is not ident)
    core = make_core(ident)
    core.start_height(0, VS)
    assert core.on_proposal(proposal(impostor, 0, b"v")) == []
    good = proposal(proposer_identity(0, 0), 0, b"v")
    forged = Proposal(0, 0, -1, b"other", good.proposer, good.signature)
    assert core.on_proposal(forged) == []
    assert broadcasts(core.on_proposal(good))[0].value_id == value_id(b"v")


def _locked_core():
    """A validator that prevoted and precommitted value A in round 0 (locked on A)."""
    ident = next(i for i in IDS if i.peer_id not in (VS.proposer(0, 0), VS.proposer(0, 1)))
    core = make_core(ident)
    core.start_height(0, VS)
    a = b"value-A"
    core.on_proposal(proposal(proposer_identity(0, 0), 0, a))
    out = []
    for other in [i for i in IDS if i is not ident][:2]:
        out += core.on_vote(vote(other, VoteType.PREVOTE, 0, value_id(a)))
    precommits = [m for m in broadcasts(out) if m.type is VoteType.PRECOMMIT]
    assert precommits and precommits[0].value_id == value_id(a)
    assert core.locked_round == 0 and core.locked_value_id == value_id(a)
    assert core.valid_round == 0
    return core, ident, a


def test_lock_prevents_prevoting_another_value_without_a_newer_polka():
    core, ident, a = _locked_core()
    nil_precommits = [i for i in IDS if i is not ident][:2]
    for other in nil_precommits:
        core.on_vote(vote(other, VoteType.PRECOMMIT, 0, b""))
    core.on_timeout(Step.PRECOMMIT, 0, 0)
    assert core.round == 1
    out = core.on_proposal(proposal(proposer_identity(0, 1), 1, b"value-B"))
    (prevote,) = broadcasts(out)
    assert prevote.is_nil  # locked on A, B has no POL


def test_pol_round_at_or_above_the_lock_unlocks():
    core, ident, a = _locked_core()
    others = [i for i in IDS if i is not ident]
    b = b"value-B"
    for other in others[:2]:
        core.on_vote(vote(other, VoteType.PRECOMMIT, 0, b""))
    core.on_timeout(Step.PRECOMMIT, 0, 0)
    # round 1: a polka for B that this validator did not take part in
    for other in others:
        core.on_vote(vote(other, VoteType.PREVOTE, 1, value_id(b)))
    assert core.round == 1
    for other in others:
        core.on_vote(vote(other, VoteType.PRECOMMIT, 1, b""))
    core.on_timeout(Step.PRECOMMIT, 0, 1)
    assert core.round == 2
    out = core.on_proposal(proposal(proposer_identity(0, 2), 2, b, pol_round=1))
    prevotes = [m for m in broadcasts(out) if m.type is VoteType.PREVOTE]
    assert prevotes[0].value_id == value_id(b)


def test_relocking_proposer_reproposes_valid_value_with_its_pol_round():
    ident = VS.proposer(0, 1)
    me = BY_PID[ident]
    core = make_core(me)
    core.start_height(0, VS)
    a = b"value-A"
    core.on_proposal(proposal(proposer_identity(0, 0), 0, a))
    others = [i for i in IDS if i is not me]
    for other in others:
        core.on_vote(vote(other, VoteType.PREVOTE, 0, value_id(a)))
    out = []
    for other in others:
        out += core.on_vote(vote(other, VoteType.PRECOMMIT, 0, b""))
    out += core.on_timeout(Step.PRECOMMIT, 0, 0)
    props = [m for m in broadcasts(out) if isinstance(m, Proposal)]
    assert props and props[0].round == 1 and props[0].pol_round == 0 and props[0].value == a


def test_commit_in_any_round_once_value_known():
    ident = IDS[0]
    core = make_core(ident)
    core.start_height(0, VS)
    v = b"late-value"
    others = IDS[1:]
    out = []
    for other in others:  # precommits for round 3 arrive before the proposal
        out += core.on_vote(vote(other, VoteType.PRECOMMIT, 3, value_id(v)))
    assert not of_type(out, Commit)
    out = core.on_proposal(proposal(proposer_identity(0, 3), 3, v))
    (commit,) = of_type(out, Commit)
    assert commit.value == v and commit.round == 3 and len(commit.certificate) == 3
    assert core.on_vote(vote(others[0], VoteType.PREVOTE, 3, value_id(v))) == []  # decided


def test_round_skip_needs_more_than_one_third_of_power():
    core = make_core(IDS[0])
    core.start_height(0, VS)
    core.on_vote(vote(IDS[1], VoteType.PREVOTE, 5, b""))
    assert core.round == 0  # 10 of 40: not f+1
    core.on_vote(vote(IDS[2], VoteType.PRECOMMIT, 5, b""))
    assert core.round == 5  # 20 of 40 > 1/3


def test_double_vote_yields_evidence_once_and_is_counted_once():
    core = make_core(IDS[0])
    core.start_height(0, VS)
    first = vote(IDS[1], VoteType.PREVOTE, 0, value_id(b"a"))
    second = vote(IDS[1], VoteType.PREVOTE, 0, value_id(b"b"))
    third = vote(IDS[1], VoteType.PREVOTE, 0, b"")
    core.on_vote(first)
    (ev,) = of_type(core.on_vote(second), EvidenceFound)
    assert ev.evidence.verify(CHAIN) and ev.evidence.validator == IDS[1].peer_id
    assert core.on_vote(third) == []
    assert core.on_vote(first) == []
    assert core.rounds[0].prevotes.total == 10


def test_junk_votes_ignored():
    core = make_core(IDS[0])
    core.start_height(0, VS)
    outsider = Identity.from_seed(b"z" * 32)
    assert core.on_vote(vote(outsider, VoteType.PREVOTE, 0, b"")) == []
    good = vote(IDS[1], VoteType.PREVOTE, 0, b"")
    assert core.on_vote(Vote(good.type, 0, 0, value_id(b"x"), good.validator, good.signature)) == []
    assert core.on_vote(vote(IDS[1], VoteType.PREVOTE, 0, b"", height=7)) == []
    assert IDS[1].peer_id not in core.rounds[0].prevotes.votes


def test_future_rounds_are_bounded_per_validator():
    core = make_core(IDS[0])
    core.start_height(0, VS)
    for r in range(10, 60):
        core.on_vote(vote(IDS[1], VoteType.PREVOTE, r, b""))
    held = [r for r, rs in core.rounds.items() if IDS[1].peer_id in rs.senders]
    assert len(held) == MAX_FUTURE_ROUNDS_PER_VALIDATOR and max(held) == 59
    # the highest rounds are kept, so f+1 validators at a common round still trigger a skip
    core.on_vote(vote(IDS[2], VoteType.PREVOTE, 59, b""))
    assert core.round == 59


def test_next_height_messages_are_buffered_and_replayed():
    core = make_core(IDS[0])
    core.start_height(0, VS)
    early = [vote(i, VoteType.PREVOTE, 0, value_id(b"h1"), height=1) for i in IDS[1:]]
    for v in early:
        assert core.on_vote(v) == []
    assert core.on_vote(vote(IDS[1], VoteType.PREVOTE, 0, b"", height=5)) == []
    out = core.start_height(1, VS)
    assert core.rounds[0].prevotes.total >= 30
    assert any(isinstance(o, ScheduleTimeout) and o.step is Step.PREVOTE for o in out) \
        or core.step is not Step.PROPOSE


def test_observer_follows_and_commits_without_signing():
    observer = TendermintCore(CHAIN, None, lambda h: b"", lambda h, v: True)
    cores = [make_core(ident) for ident in IDS] + [observer]
    commits = run_network(cores, [c.start_height(0, VS) for c in cores])
    assert 4 in commits and commits[4].value == commits[0].value
    # after deciding it re-sends the decided proposal and the commit (for peers still deciding)
    relayed = observer.gossip_messages()
    assert [m.value for m in relayed if isinstance(m, Proposal)] == [commits[4].value]
    assert {m for m in relayed if isinstance(m, Vote)} == set(commits[4].certificate)


def test_restart_readopts_votes_and_lock_and_never_equivocates():
    core, ident, a = _locked_core()
    state = core.signer.to_bytes()
    restarted = make_core(ident, signer=SignerGuard.restore(ident, state),
                          get_value=lambda h: b"something else")
    out = restarted.start_height(0, VS)
    assert restarted.round == 0 and restarted.step is Step.PRECOMMIT
    assert restarted.locked_round == 0 and restarted.locked_value_id == value_id(a)
    assert restarted.valid_value == a  # from the lock proof
    own = restarted.gossip_messages()
    assert {(m.type, m.value_id) for m in own if isinstance(m, Vote) and m.validator == ident.peer_id} \
        == {(VoteType.PREVOTE, value_id(a)), (VoteType.PRECOMMIT, value_id(a))}
    # the polka behind the lock is gossiped too, and nothing conflicting was signed
    assert sum(1 for m in own if isinstance(m, Vote) and m.type is VoteType.PREVOTE) >= 3
    assert not [m for m in broadcasts(out) if isinstance(m, Vote) and m.round == 0]


def test_double_voter_counts_for_each_value_it_signed():
    """An honest node that saw the byzantine's nil prevote first still sees the polka for v that
    includes the byzantine's other prevote (otherwise a locked peer could never convince it)."""
    me, byz, a, b = IDS
    core = make_core(me)
    core.start_height(0, VS)  # no proposal delivered: this node does not prevote itself
    vid = value_id(b"value-V")
    core.on_vote(vote(byz, VoteType.PREVOTE, 0, b""))
    assert of_type(core.on_vote(vote(byz, VoteType.PREVOTE, 0, vid)), EvidenceFound)
    core.on_vote(vote(a, VoteType.PREVOTE, 0, vid))
    assert core.rounds[0].prevotes.quorum_value is None  # 20 of 40
    core.on_vote(vote(b, VoteType.PREVOTE, 0, vid))
    tally = core.rounds[0].prevotes
    assert tally.quorum_value == vid and tally.power_by_value[vid] == 30
    assert tally.total == 30  # distinct validators: the double-voter counts once
    assert len(tally.votes_for(vid)) == 3


def _named_core(ident):
    """A core whose values are ``b"<proposer peer id>|..."``: the value names its proposer."""
    return TendermintCore(CHAIN, SignerGuard(ident), get_value=lambda h: ident.peer_id.encode() + b"|block",
                          is_valid=lambda h, v: True,
                          value_proposer=lambda v: v.split(b"|", 1)[0].decode())


def test_proposal_signed_by_a_member_that_is_not_the_rounds_proposer_is_not_prevoted():
    right = proposer_identity(0, 0)
    impostor = next(i for i in IDS if i is not right)
    ident = next(i for i in IDS if i is not right and i is not impostor)
    core = make_core(ident)
    core.start_height(0, VS)
    assert not core.needs_validation(proposal(impostor, 0, b"v"))  # never validated
    assert core.on_proposal(proposal(impostor, 0, b"v")) == []  # no prevote for it
    assert core.ignored_proposals == 1 and 0 not in core.proposals
    (prevote,) = broadcasts(core.on_timeout(Step.PROPOSE, 0, 0))  # the honest node times out: nil
    assert prevote.is_nil and prevote.type is VoteType.PREVOTE
    # the same value signed by the round's proposer is prevoted
    core = make_core(ident)
    core.start_height(0, VS)
    assert core.needs_validation(proposal(right, 0, b"v"))
    (prevote,) = broadcasts(core.on_proposal(proposal(right, 0, b"v")))
    assert prevote.value_id == value_id(b"v") and core.ignored_proposals == 0


def test_fresh_proposal_whose_block_names_another_proposer_gets_a_nil_prevote():
    right = proposer_identity(0, 0)
    other = next(i for i in IDS if i is not right)
    ident = next(i for i in IDS if i is not right and i is not other)
    core = _named_core(ident)
    core.start_height(0, VS)
    stolen = other.peer_id.encode() + b"|block"  # signed by the round's proposer, names another
    (prevote,) = broadcasts(core.on_proposal(proposal(right, 0, stolen)))
    assert prevote.is_nil
    assert core.wrong_value_proposer == 1
    honest = _named_core(ident)
    honest.start_height(0, VS)
    own = right.peer_id.encode() + b"|block"
    (prevote,) = broadcasts(honest.on_proposal(proposal(right, 0, own)))
    assert prevote.value_id == value_id(own)


def test_reproposal_keeps_the_original_proposer_and_commits_with_value_proposer_bound():
    """A value locked in round 0 is re-proposed (pol_round 0) by round 1's proposer: it still names
    round 0's proposer and must be accepted, or the chain could stall on a lock."""
    r0, r1 = proposer_identity(0, 0), proposer_identity(0, 1)
    assert r0 is not r1
    ident = next(i for i in IDS if i is not r0 and i is not r1)
    core = _named_core(ident)
    core.start_height(0, VS)
    value = r0.peer_id.encode() + b"|block"
    vid = value_id(value)
    core.on_proposal(proposal(r0, 0, value))
    for voter in IDS:
        if voter is not ident:
            core.on_vote(vote(voter, VoteType.PREVOTE, 0, vid))
    assert core.locked_value_id == vid
    core.on_timeout(Step.PRECOMMIT, 0, 0)  # no precommit quorum: round 1
    assert core.round == 1
    (prevote,) = broadcasts(core.on_proposal(proposal(r1, 1, value, pol_round=0)))
    assert prevote.value_id == vid
    assert core.wrong_value_proposer == 0


def test_a_second_proposal_from_the_rounds_proposer_is_ignored_and_reported_once():
    right = proposer_identity(0, 0)
    ident = next(i for i in IDS if i is not right)
    core = make_core(ident)
    core.start_height(0, VS)
    (prevote,) = broadcasts(core.on_proposal(proposal(right, 0, b"v")))
    (found,) = core.on_proposal(proposal(right, 0, b"w"))
    assert isinstance(found, EvidenceFound) and isinstance(found.evidence, DoubleProposalEvidence)
    assert found.evidence.validator == right.peer_id and found.evidence.verify(CHAIN)
    assert core.on_proposal(proposal(right, 0, b"x")) == []  # the offence is reported once per round
    assert core.on_proposal(proposal(right, 0, b"v")) == []  # a duplicate is no equivocation
    assert core.proposal_equivocations == 2
    assert core.proposals[0].value == b"v"
