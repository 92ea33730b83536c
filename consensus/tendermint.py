"""The SDBFT consensus core: Tendermint (Buchman, Kwon, Milosevic 2018, Algorithm 1) as a pure,
deterministic state machine.

Inputs are method calls (``start_height``, ``on_proposal``, ``on_vote``, ``on_timeout``); each
returns the list of outputs the driver must act on, in order: ``PersistSignerState`` (persist/fsync
before sending anything after it), ``Broadcast``, ``ScheduleTimeout``, ``Commit``, ``EvidenceFound``.
No I/O, clocks or randomness inside; values are opaque bytes identified by sha256.

Boundaries and choices:
- Signatures of incoming messages are checked by the core with the injected ``verifier`` (default:
  ed25519 over the chain id). A driver that has already verified may inject a cheaper one.
- ``is_valid`` results are cached per value id for the height; a driver can compute them off the
  event loop (``needs_validation`` / ``record_validity``). The node's own proposals (from
  ``get_value``) are trusted.
- After ``Commit`` the core waits: the driver executes the block and calls ``start_height(h + 1,
  next_validator_set)`` (the app decides the next committee). Messages for ``h + 1`` that arrive
  meanwhile are buffered (bounded per sender); anything further ahead or behind is dropped, a
  lagging node catches up by block sync in the driver (``ValidatorSet`` + ``verify_commit``).
- Memory is bounded: per validator, messages for only its highest
  ``MAX_FUTURE_ROUNDS_PER_VALIDATOR`` rounds above the current one are kept (older ones are
  evicted), which is enough for the f+1 round-skip rule.
- All signing goes through ``SignerGuard``; the lock (lockedRound/lockedValue) is restored from it
  after a restart, with the locked value and its polka (stored as the lock's proof) as
  validValue/validRound, and a restarted validator re-enters the round it last signed in.
- The paper assumes reliable gossip; a driver over a lossy network re-sends ``gossip_messages()``
  when progress stalls (proposals, every vote held for the height, or the decision).
- A validator that signs two values for one step is reported once per step (``EvidenceFound``)
  and counted for each value it signed (bounded), as CometBFT's vote sets do.
- A proposal counts only if signed by ``committee.proposer(height, round)``; others are dropped
  and counted (``ignored_proposals``). ``value_proposer`` (optional) names the proposer a value
  records (a block header's); a fresh proposal (pol_round -1) whose value names anyone but its
  signer gets a nil prevote (``wrong_value_proposer``). A re-proposal (pol_round >= 0) keeps its
  original proposer: its polka vouches for it (the first polka for a value needs honest prevotes
  under the fresh-proposal rule). A second, different proposal from the round's proposer is
  counted (``proposal_equivocations``) and reported once per round as ``EvidenceFound`` with
  ``DoubleProposalEvidence`` (docs/adr/0144, 0165).
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from consensus.committee import ValidatorSet
from consensus.messages import (
    DoubleProposalEvidence,
    DoubleVoteEvidence,
    Evidence,
    MessageError,
    Proposal,
    Vote,
    VoteType,
    decode_vote_list,
    encode_vote_list,
    value_id,
    verify_proposal,
    verify_vote,
    vote_from_sign_bytes,
)
from consensus.signer import DoubleSignRefused, Lock, SignerGuard, Step

NIL = b""
MAX_FUTURE_ROUNDS_PER_VALIDATOR = 2
MAX_VALUES_PER_VALIDATOR_STEP = 3
MAX_BUFFERED_PER_SENDER = 8
MAX_BUFFERED_SENDERS = 1024


@dataclass(frozen=True)
class TimeoutConfig:
    """Timeouts in seconds, growing linearly with the round: base + delta * round."""

    propose: float = 1.0
    propose_delta: float = 0.5
    prevote: float = 0.5
    prevote_delta: float = 0.25
    precommit: float = 0.5
    precommit_delta: float = 0.25

    def delay(self, step: Step, round_: int) -> float:
        if step is Step.PROPOSE:
            return self.propose + self.propose_delta * round_
        if step is Step.PREVOTE:
            return self.prevote + self.prevote_delta * round_
        return self.precommit + self.precommit_delta * round_


@dataclass(frozen=True)
class Broadcast:
    message: Proposal | Vote


@dataclass(frozen=True)
class ScheduleTimeout:
    step: Step
    height: int
    round: int
    delay: float


@dataclass(frozen=True)
class Commit:
    height: int
    round: int
    value: bytes
    certificate: tuple[Vote, ...]


@dataclass(frozen=True)
class EvidenceFound:
    evidence: Evidence


@dataclass(frozen=True)
class PersistSignerState:
    state: bytes


_Signable = TypeVar("_Signable", Proposal, Vote)
Output = Broadcast | ScheduleTimeout | Commit | EvidenceFound | PersistSignerState


def encode_lock_proof(value: bytes, prevotes: list[Vote]) -> bytes:
    """The locked value and the prevotes (a polka) that justified the lock."""
    return b"".join([struct.pack(">IH", len(value), len(prevotes)), value, encode_vote_list(prevotes)])


def decode_lock_proof(data: bytes) -> tuple[bytes, list[Vote]]:
    try:
        value_len, count = struct.unpack_from(">IH", data, 0)
        pos = 6
        value = data[pos:pos + value_len]
        pos += value_len
        votes, pos = decode_vote_list(data, pos, count)
    except struct.error as exc:
        raise MessageError("lock proof truncated") from exc
    if pos != len(data) or len(value) != value_len:
        raise MessageError("lock proof truncated or has trailing bytes")
    return value, votes


class _Tally:
    """The votes of one (round, type): each validator's first vote, and per value every
    validator that signed it (a double-voter counts for each value it signed, as in CometBFT,
    so a polka or commit that includes it is still recognised by every honest node)."""

    __slots__ = ("votes", "by_value", "power_by_value", "total", "quorum_value")

    def __init__(self) -> None:
        self.votes: dict[str, Vote] = {}  # first vote per validator
        self.by_value: dict[bytes, dict[str, Vote]] = {}
        self.power_by_value: dict[bytes, int] = {}
        self.total = 0  # power of distinct validators that voted
        self.quorum_value: bytes | None = None  # the first value with more than 2/3

    def has(self, vote: Vote) -> bool:
        return vote.validator in self.by_value.get(vote.value_id, ())

    def values_signed_by(self, validator: str) -> int:
        return sum(1 for voters in self.by_value.values() if validator in voters)

    def votes_for(self, vid: bytes) -> list[Vote]:
        return list(self.by_value.get(vid, {}).values())

    def add(self, vote: Vote, power: int, validators: ValidatorSet) -> None:
        if vote.validator not in self.votes:
            self.votes[vote.validator] = vote
            self.total += power
        self.by_value.setdefault(vote.value_id, {})[vote.validator] = vote
        p = self.power_by_value.get(vote.value_id, 0) + power
        self.power_by_value[vote.value_id] = p
        if self.quorum_value is None and validators.is_quorum(p):
            self.quorum_value = vote.value_id

    def remove(self, validator: str, power: int) -> None:
        if self.votes.pop(validator, None) is None:
            return
        self.total -= power
        for vid in [vid for vid, voters in self.by_value.items() if validator in voters]:
            del self.by_value[vid][validator]
            left = self.power_by_value[vid] - power
            if left:
                self.power_by_value[vid] = left
            else:
                del self.power_by_value[vid]
                del self.by_value[vid]


@dataclass
class _RoundState:
    prevotes: _Tally = field(default_factory=_Tally)
    precommits: _Tally = field(default_factory=_Tally)
    senders: set[str] = field(default_factory=set)
    sender_power: int = 0
    prevote_timeout_scheduled: bool = False
    precommit_timeout_scheduled: bool = False
    polka_seen: bool = False  # the upon-rule of line 36 fired for this round


class TendermintCore:
    """One validator's (or observer's, when ``signer`` is None) Tendermint state machine."""

    # per-height state, (re)set by _reset_height_state
    locked_value_id: bytes | None
    valid_value: bytes | None
    valid_value_id: bytes | None

    def __init__(
        self,
        chain_id: str,
        signer: SignerGuard | None,
        get_value: Callable[[int], bytes],
        is_valid: Callable[[int, bytes], bool],
        timeouts: TimeoutConfig = TimeoutConfig(),
        verifier: Callable[[Proposal | Vote], bool] | None = None,
        value_proposer: Callable[[bytes], str | None] | None = None,
    ) -> None:
        self.chain_id = chain_id
        self.signer = signer
        self.get_value = get_value
        self.is_valid = is_valid
        self.timeouts = timeouts
        self._verifier = verifier or self._verify_signature
        self._value_proposer = value_proposer
        self.ignored_proposals = 0  # signed by a committee member that is not the round's proposer
        self.wrong_value_proposer = 0  # fresh proposals whose value names another proposer
        self.proposal_equivocations = 0  # a second, different proposal for one round
        self.height = -1
        self.round = 0
        self.step = Step.PROPOSE
        self.decided = False
        self.validators: ValidatorSet | None = None
        self._next_height_buffer: dict[str, list[Proposal | Vote]] = {}
        self._reset_height_state()

    # ------------------------------------------------------------------ inputs
    def start_height(self, height: int, validators: ValidatorSet, round_: int = 0) -> list[Output]:
        """Enter ``height`` with its committee; replays buffered messages for it."""
        buffered = self._next_height_buffer if height == self.height + 1 else {}
        self._next_height_buffer = {}
        self.height = height
        self.validators = validators
        self.decided = False
        self._reset_height_state()
        if self.signer is not None:
            lock = self.signer.lock_for(height)
            if lock is not None:
                self._restore_lock(lock)
            last = self.signer.last_hrs
            if last is not None and last[0] == height:
                round_ = max(round_, last[1])
        out: list[Output] = []
        self._start_round(out, round_)
        if self.signer is not None:
            self._readopt_signed_votes()
        self._run_rules(out)
        for messages in buffered.values():
            for message in messages:
                out.extend(self.on_message(message))
        return out

    def needs_validation(self, proposal: Proposal) -> bool:
        """True if ``is_valid`` has not yet been decided for this proposal's value at this height
        (a driver may then run it off the event loop and hand the result to ``record_validity``).
        False for a proposal not signed by the round's proposer: it is dropped unvalidated."""
        return proposal.height == self.height and self.validators is not None \
            and proposal.proposer == self.validators.proposer(self.height, proposal.round) \
            and proposal.value_id not in self._validity

    def record_validity(self, height: int, vid: bytes, ok: bool) -> None:
        """Cache an ``is_valid`` result computed elsewhere (e.g. in a worker thread)."""
        if height == self.height:
            self._validity[vid] = bool(ok)

    def on_message(self, message: Proposal | Vote) -> list[Output]:
        if isinstance(message, Vote):
            return self.on_vote(message)
        if isinstance(message, Proposal):
            return self.on_proposal(message)
        return []

    def on_proposal(self, proposal: Proposal) -> list[Output]:
        if not self._admit_height(proposal, proposal.proposer):
            return []
        r = proposal.round
        if proposal.proposer != self._committee.proposer(self.height, r):
            if proposal.proposer in self._committee:
                self.ignored_proposals += 1
            return []
        known = self.proposals.get(r)
        if known is not None:
            if known != proposal and self._verifier(proposal):
                self.proposal_equivocations += 1
                if r not in self._proposal_offences:
                    self._proposal_offences.add(r)
                    return [EvidenceFound(DoubleProposalEvidence.of(known, proposal))]
            return []
        if not self._verifier(proposal) or not self._admit_round(proposal.proposer, r):
            return []
        self._record_proposal(proposal)
        out: list[Output] = []
        self._note_sender(r, proposal.proposer)
        quorum_round = self._precommit_quorum_rounds.get(proposal.value_id)
        if quorum_round is not None:
            self._try_commit(out, quorum_round)
        self._after_event(out, r)
        return out

    def on_vote(self, vote: Vote) -> list[Output]:
        if not self._admit_height(vote, vote.validator):
            return []
        power = self._committee.power(vote.validator)
        if power == 0:
            return []
        r = vote.round
        rs = self.rounds.get(r)
        if rs is not None:
            tally = rs.prevotes if vote.type is VoteType.PREVOTE else rs.precommits
            if tally.has(vote):
                return []
            existing = tally.votes.get(vote.validator)
            if existing is not None:
                return self._conflicting_vote(existing, vote, tally, power)
        if not self._verifier(vote) or not self._admit_round(vote.validator, r):
            return []
        out: list[Output] = []
        self._add_vote(vote, power)
        self._note_sender(r, vote.validator)
        self._after_event(out, r)
        return out

    def on_timeout(self, step: Step, height: int, round_: int) -> list[Output]:
        if height != self.height or round_ != self.round or self.decided:
            return []
        out: list[Output] = []
        if step is Step.PROPOSE and self.step is Step.PROPOSE:
            self._prevote(out, NIL)
        elif step is Step.PREVOTE and self.step is Step.PREVOTE:
            self._precommit(out, NIL)
        elif step is Step.PRECOMMIT:
            self._start_round(out, round_ + 1)
        else:
            return out
        self._run_rules(out)
        return out

    def _readopt_signed_votes(self) -> None:
        """After a restart inside a round it already voted in: count and re-send those votes
        and continue from the step they reached (the guard refuses to sign them differently)."""
        signer = self.signer
        if signer is None:
            return
        for entry in signer.signed_at(self.height):
            if entry.round != self.round or entry.step is Step.PROPOSE:
                continue
            try:
                vote = vote_from_sign_bytes(entry.sign_bytes, self.chain_id, entry.signature)
            except MessageError:
                continue
            power = self._committee.power(vote.validator)
            if power and vote.validator == signer.peer_id:
                self._add_vote(vote, power)
                self._note_sender(self.round, vote.validator)
                self.step = max(self.step, entry.step)

    def _restore_lock(self, lock: Lock) -> None:
        """After a restart: lock again, and take the locked value and its polka from the proof
        as validValue/validRound so this validator can still lead the others to it."""
        self.locked_round, self.locked_value_id = lock.round, lock.value_id
        try:
            value, prevotes = decode_lock_proof(lock.proof)
        except MessageError:
            return
        if value_id(value) != lock.value_id:
            return
        self.values[lock.value_id] = value
        self.valid_value, self.valid_value_id, self.valid_round = value, lock.value_id, lock.round
        for vote in prevotes:
            power = self._committee.power(vote.validator)
            if (power and vote.type is VoteType.PREVOTE and vote.height == self.height
                    and vote.round == lock.round and vote.value_id == lock.value_id
                    and not self._round_state(lock.round).prevotes.has(vote)
                    and self._verifier(vote)):
                self._add_vote(vote, power)

    def gossip_messages(self) -> list[Proposal | Vote]:
        """What to re-send when progress stalls, standing in for the paper's reliable gossip
        (a message any correct node received reaches every correct node): the current round's
        proposal, the proposal of validValue's round, and every vote held for this height (own
        and relayed: a peer behind may need a byzantine validator's vote only we saw). Bounded
        by the per-round memory limits. After the decision: a proposal of the decided value and
        the commit's precommits, so peers still at this height decide too."""
        if self.validators is None:
            return []
        out: list[Proposal | Vote] = []
        if self.decided and self._decision is not None:
            r, vid = self._decision
            out.extend(p for p in self.proposals.values() if p.value_id == vid)
            out.extend(self.rounds[r].precommits.votes_for(vid))
            return out
        for r in (self.round, self.valid_round):
            proposal = self.proposals.get(r)
            if proposal is not None and proposal not in out:
                out.append(proposal)
        for r in sorted(self.rounds):
            rs = self.rounds[r]
            for tally in (rs.prevotes, rs.precommits):
                out.extend(v for voters in tally.by_value.values() for v in voters.values())
        return out

    # ------------------------------------------------------------------ state
    def _reset_height_state(self) -> None:
        self.round = 0
        self.step = Step.PROPOSE
        self.locked_round = -1
        self.locked_value_id = None
        self.valid_round = -1
        self.valid_value = None
        self.valid_value_id = None
        self.proposals: dict[int, Proposal] = {}
        self._proposal_offences: set[int] = set()  # rounds of this height whose equivocation was reported
        self.values: dict[bytes, bytes] = {}
        self.rounds: dict[int, _RoundState] = {}
        self._validity: dict[bytes, bool] = {}
        self._future_rounds: dict[str, set[int]] = {}
        self._precommit_quorum_rounds: dict[bytes, int] = {}
        self._decision: tuple[int, bytes] | None = None
        self._equivocators: set[tuple[str, int, VoteType]] = set()

    @property
    def _committee(self) -> ValidatorSet:
        """This height's validators: set by ``start_height`` before any message is admitted."""
        validators = self.validators
        if validators is None:
            raise RuntimeError("TendermintCore: no height started")
        return validators

    def _round_state(self, r: int) -> _RoundState:
        rs = self.rounds.get(r)
        if rs is None:
            rs = self.rounds[r] = _RoundState()
        return rs

    def _verify_signature(self, message: Proposal | Vote) -> bool:
        if isinstance(message, Vote):
            return verify_vote(message, self.chain_id)
        return verify_proposal(message, self.chain_id)

    def _admit_height(self, message: Proposal | Vote, sender: str) -> bool:
        """True for messages of the current undecided height; buffers the next height's."""
        if self.validators is None:
            return False
        if message.height == self.height:
            return not self.decided
        if message.height == self.height + 1:
            queue = self._next_height_buffer.get(sender)
            if queue is None:
                if len(self._next_height_buffer) >= MAX_BUFFERED_SENDERS:
                    return False
                queue = self._next_height_buffer[sender] = []
            if len(queue) < MAX_BUFFERED_PER_SENDER and message not in queue:
                queue.append(message)
        return False

    def _admit_round(self, sender: str, r: int) -> bool:
        """Bound memory: keep each validator's messages for its highest few future rounds only."""
        if r <= self.round:
            return True
        rounds = self._future_rounds.setdefault(sender, set())
        if r in rounds:
            return True
        if len(rounds) >= MAX_FUTURE_ROUNDS_PER_VALIDATOR:
            lowest = min(rounds)
            if r < lowest:
                return False
            rounds.discard(lowest)
            self._evict(sender, lowest)
        rounds.add(r)
        return True

    def _evict(self, sender: str, r: int) -> None:
        """Forget ``sender``'s messages of future round ``r`` (it has since sent higher rounds).
        A future round never holds a quorum (f+1 senders would have made us skip to it)."""
        rs = self.rounds.get(r)
        if rs is None:
            return
        power = self._committee.power(sender)
        rs.prevotes.remove(sender, power)
        rs.precommits.remove(sender, power)
        if sender in rs.senders:
            rs.senders.discard(sender)
            rs.sender_power -= power
        proposal = self.proposals.get(r)
        if proposal is not None and proposal.proposer == sender:
            del self.proposals[r]
            if all(p.value_id != proposal.value_id for p in self.proposals.values()):
                self.values.pop(proposal.value_id, None)
                self._validity.pop(proposal.value_id, None)
        if not rs.senders:
            del self.rounds[r]

    def _record_proposal(self, proposal: Proposal) -> None:
        self.proposals[proposal.round] = proposal
        self.values.setdefault(proposal.value_id, proposal.value)

    def _add_vote(self, vote: Vote, power: int) -> None:
        rs = self._round_state(vote.round)
        if vote.type is VoteType.PREVOTE:
            rs.prevotes.add(vote, power, self._committee)
        else:
            rs.precommits.add(vote, power, self._committee)
            qv = rs.precommits.quorum_value
            if qv and qv not in self._precommit_quorum_rounds:
                self._precommit_quorum_rounds[qv] = vote.round

    def _note_sender(self, r: int, sender: str) -> None:
        rs = self._round_state(r)
        if sender not in rs.senders:
            rs.senders.add(sender)
            rs.sender_power += self._committee.power(sender)

    def _conflicting_vote(self, first: Vote, vote: Vote, tally: _Tally, power: int) -> list[Output]:
        """A second vote for another value in one step: evidence (once per step), and the vote
        still counts for its value if that value matters here (nil, a proposed value) or the
        validator has signed only a few values in this step (bounded memory)."""
        if not self._verifier(vote):
            return []
        out: list[Output] = []
        key = (vote.validator, vote.round, vote.type)
        if key not in self._equivocators:
            self._equivocators.add(key)
            out.append(EvidenceFound(DoubleVoteEvidence(first, vote)))
        if vote.is_nil or vote.value_id in self.values \
                or tally.values_signed_by(vote.validator) < MAX_VALUES_PER_VALIDATOR_STEP:
            self._add_vote(vote, power)
            self._after_event(out, vote.round)
        return out

    def _valid(self, vid: bytes) -> bool:
        known = self._validity.get(vid)
        if known is None:
            value = self.values.get(vid)
            known = value is not None and bool(self.is_valid(self.height, value))
            if value is not None:
                self._validity[vid] = known
        return known

    def _names_signer(self, proposal: Proposal) -> bool:
        """A fresh proposal's value must name its signer (the round's proposer) as proposer."""
        if self._value_proposer is None:
            return True
        if self._value_proposer(proposal.value) == proposal.proposer:
            return True
        self.wrong_value_proposer += 1
        return False

    # ------------------------------------------------------------------ rules
    def _after_event(self, out: list[Output], r: int) -> None:
        if self.decided:
            return
        self._try_commit(out, r)  # line 49: any round
        if self.decided:
            return
        if r > self.round and self._committee.is_one_third(self.rounds[r].sender_power):
            self._start_round(out, r)  # line 55: f+1 messages of a higher round
        self._run_rules(out)

    def _try_commit(self, out: list[Output], r: int) -> None:
        rs = self.rounds.get(r)
        if rs is None or self.decided:
            return
        vid = rs.precommits.quorum_value
        if not vid or not self._valid(vid):
            return
        self.decided = True
        self._decision = (r, vid)
        certificate = tuple(rs.precommits.votes_for(vid))
        out.append(Commit(self.height, r, self.values[vid], certificate))

    def _run_rules(self, out: list[Output]) -> None:
        """Apply the upon-rules of the current round until none fires."""
        while not self.decided:
            r, step = self.round, self.step
            rs = self._round_state(r)
            proposal = self.proposals.get(r)
            if step is Step.PROPOSE and proposal is not None:
                vid = proposal.value_id
                if proposal.pol_round == -1:  # line 22
                    ok = self._valid(vid) and self._names_signer(proposal) \
                        and (self.locked_round == -1 or self.locked_value_id == vid)
                    self._prevote(out, vid if ok else NIL)
                    continue
                pol = self.rounds.get(proposal.pol_round)
                if pol is not None and self._committee.is_quorum(
                        pol.prevotes.power_by_value.get(vid, 0)):  # line 28
                    ok = self._valid(vid) and (self.locked_round <= proposal.pol_round
                                               or self.locked_value_id == vid)
                    self._prevote(out, vid if ok else NIL)
                    continue
            if step is not Step.PROPOSE:
                qv = rs.prevotes.quorum_value
                if step is Step.PREVOTE and not rs.prevote_timeout_scheduled \
                        and self._committee.is_quorum(rs.prevotes.total):  # line 34
                    rs.prevote_timeout_scheduled = True
                    out.append(self._timeout(Step.PREVOTE, r))
                if qv and not rs.polka_seen and self._valid(qv):  # line 36
                    rs.polka_seen = True
                    self.valid_value, self.valid_value_id, self.valid_round = self.values[qv], qv, r
                    if step is Step.PREVOTE:
                        self.locked_value_id, self.locked_round = qv, r
                        self._precommit(out, qv)
                        self._try_commit(out, r)
                        continue
                if step is Step.PREVOTE and qv == NIL:  # line 44
                    self._precommit(out, NIL)
                    self._try_commit(out, r)
                    continue
            if not rs.precommit_timeout_scheduled and self._committee.is_quorum(rs.precommits.total):
                rs.precommit_timeout_scheduled = True  # line 47
                out.append(self._timeout(Step.PRECOMMIT, r))
            return

    def _timeout(self, step: Step, r: int) -> ScheduleTimeout:
        return ScheduleTimeout(step, self.height, r, self.timeouts.delay(step, r))

    def _start_round(self, out: list[Output], r: int) -> None:
        self.round = r
        self.step = Step.PROPOSE
        for rounds in self._future_rounds.values():
            rounds.difference_update([x for x in rounds if x <= r])
        if self.signer is not None and self._committee.proposer(self.height, r) == self.signer.peer_id:
            signed = None
            if self.valid_value is None:
                proposal = Proposal(self.height, r, -1, self.get_value(self.height), self.signer.peer_id)
                signed = self._sign(out, proposal, Step.PROPOSE)
            elif self.valid_round < r:  # (== r only when restarted inside the round it locked in)
                proposal = Proposal(self.height, r, self.valid_round, self.valid_value, self.signer.peer_id)
                signed = self._sign(out, proposal, Step.PROPOSE)
            if signed is not None:
                self._validity.setdefault(signed.value_id, True)  # built by get_value: trusted
                self._record_proposal(signed)
                self._note_sender(r, signed.proposer)
                out.append(Broadcast(signed))
        out.append(self._timeout(Step.PROPOSE, r))

    def _prevote(self, out: list[Output], vid: bytes) -> None:
        self.step = Step.PREVOTE
        self._cast(out, VoteType.PREVOTE, vid)

    def _precommit(self, out: list[Output], vid: bytes) -> None:
        self.step = Step.PRECOMMIT
        self._cast(out, VoteType.PRECOMMIT, vid)

    def _cast(self, out: list[Output], vtype: VoteType, vid: bytes) -> None:
        if self.signer is None or self.signer.peer_id not in self._committee:
            return
        vote = Vote(vtype, self.height, self.round, vid, self.signer.peer_id)
        if vtype is VoteType.PREVOTE:
            signed = self._sign(out, vote, Step.PREVOTE)
        elif vid:
            polka = self.rounds[self.round].prevotes.votes_for(vid)
            proof = encode_lock_proof(self.values[vid], polka)
            signed = self._sign(out, vote, Step.PRECOMMIT, lock=vid, lock_proof=proof)
        else:
            signed = self._sign(out, vote, Step.PRECOMMIT)
        if signed is None:
            return
        self._add_vote(signed, self._committee.power(signed.validator))
        self._note_sender(self.round, signed.validator)
        out.append(Broadcast(signed))

    def _sign(self, out: list[Output], message: _Signable, step: Step, lock: bytes | None = None,
              lock_proof: bytes = b"") -> _Signable | None:
        signer = self.signer
        if signer is None:
            return None
        try:
            signature = signer.sign(message.height, message.round, step,
                                         message.sign_bytes(self.chain_id), lock_value_id=lock,
                                         lock_proof=lock_proof)
        except DoubleSignRefused:
            return None
        out.append(PersistSignerState(signer.to_bytes()))
        return message.with_signature(signature)
