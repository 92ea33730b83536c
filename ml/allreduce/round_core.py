"""Sans-I/O core of an all-reduce round: attempts, VIEW agreement, adoption of pushed results.

No sockets, tasks or clocks here. The driver (group.py in production, devtools/allreduce_sim in
simulation) feeds a `RoundCore` events as method calls and carries out the actions they return:

  events in:   start()                       the local contribution is ready (or faulty)
               attempt_succeeded(result)     the attempt's data flow finished here
               attempt_failed(...)           it failed (a stalled/bad member, a VIEW, a plan mismatch)
               view_received(...) / view_missing(...)   a member's VIEW arrived / never will
               adopted(committed)            a result another member committed was received intact
               distrust(peer)                `peer` sent bad data this round
               gave_up()                     no result reached this member while it asked (AwaitResult)
  actions out: StartAttempt(attempt, members)   run the data flow over exactly these members
               SendView(to, ...)                 tell `to` this attempt failed here and who is alive
               AwaitViews(attempt, members)      report each member's VIEW (or its absence)
               AwaitResult(attempt, members, ...) this live member cannot go on (left out, or its links
                                                 down): ask `members` for the result they commit (a
                                                 VIEW of `attempt`, one never run) and adopt it
               CommitRound(committed)            the round's result and participant set
               FailRound(error)                  raise it (too few members, excluded, no agreement)

`CommittedRounds` keeps the last committed rounds and decides when a straggler gets one pushed
(COMMITTED). The rules are those of docs/adr/0033, 0090, 0092 and 0093; docs/adr/0115 explains the
split. A member that cannot go on while it has a valid contribution (the others left it out, or its own
links failed and it was left alone: a home link that dropped for a moment) is not done: it adopts the
result the others commit without it and stays in the job (docs/adr/0242); one with a local fault
(non-finite values) or another tensor layout fails the round.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

KEEP_COMMITTED_ROUNDS = 2


class AllReduceError(RuntimeError):
    """The round cannot finish: too few members left, or too many failed attempts."""


class ExcludedFromRound(AllReduceError):
    """The other members excluded this peer from the round (its reason is in `reason`)."""

    def __init__(self, round_id: int, reason: str):
        super().__init__(f"excluded from round {round_id}: {reason}")
        self.reason = reason


@dataclass
class Committed:
    """A round's outcome: the attempt that produced it, whose contributions it averages, and the
    result itself (opaque here: a tensor in production, an array in the simulator)."""
    attempt: int
    participants: tuple[str, ...]
    excluded: dict[str, str]
    result: Any
    rates: dict[str, float] = field(default_factory=dict)
    pushed_to: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class StartAttempt:
    attempt: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class SendView:
    to: str
    attempt: int
    alive: tuple[str, ...]
    why: dict[str, str]


@dataclass(frozen=True)
class AwaitViews:
    attempt: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class AwaitResult:
    attempt: int                 # asks go as this member's VIEW of this attempt, one no round runs
    members: tuple[str, ...]     # who to ask: every other peer (this member's view may be the wrong one)
    alive: tuple[str, ...]       # that VIEW: who this member saw alive,
    why: dict[str, str]          # and why it left the others out


@dataclass(frozen=True)
class CommitRound:
    committed: Committed


@dataclass(frozen=True)
class FailRound:
    error: AllReduceError


Action = StartAttempt | SendView | AwaitViews | AwaitResult | CommitRound | FailRound
View = tuple[set[str], dict[str, str], str]  # alive, reasons for those left out, shape digest


class RoundCore:
    """One round at one member. `peers`: the group (sorted); `shape`: digest of the tensor layout
    (travels in VIEWs); `fault`: why this member cannot contribute (it then fails every attempt
    and says so in its VIEW)."""

    def __init__(self, me: str, peers: list[str], round_id: int, shape: str, *, min_participants: int = 2,
                 fault: str | None = None):
        self.me = me
        self.peers = sorted(peers)
        self.round_id = round_id
        self.shape = shape
        self.min_participants = min_participants
        self.fault = fault
        self.members: list[str] = list(self.peers)
        self.excluded: dict[str, str] = {}
        self.attempt = -1
        self.distrusted: set[str] = set()  # caught sending bad data this round (docs/adr/0092)
        self.outcome: Committed | AllReduceError | None = None
        self._views: dict[str, View] = {}
        self._silent: dict[str, str] = {}
        self._awaiting: set[str] = set()
        self.shut_out: AllReduceError | None = None   # why this live member cannot go on (AwaitResult)

    @property
    def max_attempts(self) -> int:
        return len(self.peers) + 2

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def in_view_exchange(self) -> bool:
        return bool(self._awaiting)

    # -- events ----------------------------------------------------------------------------

    def start(self) -> list[Action]:
        if self.attempt != -1:
            raise RuntimeError("round already started")
        return self._next_attempt()

    def attempt_succeeded(self, result: Any, rates: dict[str, float] | None = None) -> list[Action]:
        self._check_running()
        return self._commit(Committed(self.attempt, tuple(self.members), dict(self.excluded), result,
                                      dict(rates or {})))

    def attempt_failed(self, suspects: dict[str, str], their_members: list[str] | None = None) -> list[Action]:
        """The attempt failed here: `suspects` (member -> why), or a member planned over
        `their_members`. Starts the VIEW exchange."""
        self._check_running()
        alive = set(self.members) - set(suspects)
        if their_members is not None:
            alive &= set(their_members)
        others = tuple(m for m in self.members if m != self.me)
        self._views = {self.me: (alive, dict(suspects), self.shape)}
        self._silent = {}
        self._awaiting = set(others)
        actions: list[Action] = [SendView(m, self.attempt, tuple(sorted(alive)), dict(suspects)) for m in others]
        actions.append(AwaitViews(self.attempt, others))
        return actions + self._settle_if_complete()

    def view_received(self, sender: str, attempt: int, view: View) -> list[Action]:
        if self.done or attempt != self.attempt or sender not in self._awaiting:
            return []
        self._awaiting.discard(sender)
        self._views[sender] = view
        return self._settle_if_complete()

    def view_missing(self, sender: str, attempt: int, reason: str) -> list[Action]:
        if self.done or attempt != self.attempt or sender not in self._awaiting:
            return []
        self._awaiting.discard(sender)
        self._silent[sender] = f"no view after failed attempt: {reason}"
        return self._settle_if_complete()

    def distrust(self, peer: str) -> None:
        self.distrusted.add(peer)

    def may_adopt(self, sender: str) -> bool:
        """Whether a COMMITTED result from `sender` may be taken now (never from a member caught
        sending bad data this round, docs/adr/0092)."""
        return not self.done and sender not in self.distrusted and sender != self.me

    def adopted(self, sender: str, committed: Committed) -> list[Action]:
        if not self.may_adopt(sender):
            raise RuntimeError(f"adopting from {sender} is not allowed now")
        self._awaiting.clear()
        return self._commit(committed)

    def gave_up(self) -> list[Action]:
        """No other member's result reached this member in time: the round fails here, as it would have
        without the wait (ExcludedFromRound, or too few members)."""
        if self.done or self.shut_out is None:
            raise RuntimeError("not waiting for a result")
        return self._fail(self.shut_out)

    # -- decisions -------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self.done or self.attempt < 0 or self._awaiting or self.shut_out is not None:
            raise RuntimeError("no attempt is running")

    def _commit(self, committed: Committed) -> list[Action]:
        self.outcome = committed
        return [CommitRound(committed)]

    def _fail(self, error: AllReduceError) -> list[Action]:
        self.outcome = error
        return [FailRound(error)]

    def _settle_if_complete(self) -> list[Action]:
        if self._awaiting or self.done:
            return []
        members, dropped = settle_views(list(self.members), self._views, self._silent)
        self.members = members
        self.excluded.update(dropped)
        return self._next_attempt()

    def _next_attempt(self) -> list[Action]:
        self.attempt += 1
        if self.attempt >= self.max_attempts:
            return self._fail(AllReduceError(
                f"round {self.round_id}: no agreement after {self.max_attempts} attempts"))
        if self.me not in self.members:
            return self._cannot_go_on(ExcludedFromRound(
                self.round_id, self.excluded.get(self.me, "dropped by the other members")))
        if len(self.members) < self.min_participants:
            return self._cannot_go_on(AllReduceError(
                f"round {self.round_id}: only {len(self.members)} members left "
                f"(minimum {self.min_participants}); excluded: {self.excluded}"))
        return [StartAttempt(self.attempt, tuple(self.members))]

    def _cannot_go_on(self, error: AllReduceError) -> list[Action]:
        """The round cannot go on here: left out by the others, or (its links down) left with too few.
        A live member with a valid contribution asks every other peer for a result they may commit
        without it (docs/adr/0242), and fails with `error` only if none comes (`gave_up`); a member with
        a local fault, or whose tensor layout is not the majority's, has no use for their result."""
        others = tuple(p for p in self.peers if p != self.me)
        if self.fault is not None or not others or self.me not in self._views \
                or self.shape != common_shape(self._views):
            return self._fail(error)
        self.shut_out = error
        alive, why, _ = self._views[self.me]
        # a VIEW of attempt `max_attempts` (never run): a member still settling the failed attempt does not
        # take it for this member's view of it (a view arriving late at some members and not at others
        # would make their member sets differ), and one that committed the round answers with the result
        return [AwaitResult(self.max_attempts, others, tuple(sorted(alive)), dict(why))]


def common_shape(views: dict[str, View]) -> str:
    """The tensor layout most views carry (ties: the smallest digest)."""
    votes = collections.Counter(shape for _, _, shape in views.values())
    return min(votes, key=lambda shape: (-votes[shape], shape))


def settle_views(members: list[str], views: dict[str, View],
                 silent: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Turn the views of a failed attempt into the next member set, the same on every member that
    holds the same views. Members whose view is missing are dropped, and so are authors whose
    tensor shapes differ from the most common shapes (ties: smallest digest). Then authors are
    taken from the least accused to the most (ties by id); each author still trusted drops the
    members its view excludes. A faulty member that accuses everyone is itself accused by all the
    others and so loses its say before it can drop honest members.
    """
    accused = {m: 0 for m in members}
    for alive, _, _ in views.values():
        for peer in members:
            if peer not in alive:
                accused[peer] += 1
    trusted = set(members) - set(silent)
    dropped = {}
    for peer, reason in silent.items():  # prefer a reason someone gave over "no view"
        given = [r[peer] for _, r, _ in views.values() if peer in r]
        dropped[peer] = given[0] if given else reason
    majority = common_shape(views)
    for author, (_, _, shape) in views.items():
        if shape != majority and author in trusted:
            trusted.discard(author)
            dropped[author] = "wrong-shape contribution (tensor layout differs from the majority)"
    for author in sorted(views, key=lambda m: (accused[m], m)):
        if author not in trusted:
            continue
        alive, reasons, _ = views[author]
        for peer in members:
            if peer not in alive and peer in trusted:
                trusted.discard(peer)
                dropped[peer] = reasons.get(peer, f"dropped by {author}")
    return sorted(trusted), dropped


class CommittedRounds:
    """The last few rounds this member committed, and to whom each was pushed.

    A member that gave up on a round this one committed (it sends a VIEW of that round, or a PART of
    a later attempt) gets the result pushed once (docs/adr/0033, 0090)."""

    def __init__(self, me: str, keep: int = KEEP_COMMITTED_ROUNDS):
        self.me = me
        self.keep = keep
        self._rounds: dict[int, Committed] = {}

    def remember(self, round_id: int, committed: Committed) -> None:
        self._rounds[round_id] = committed
        for old in sorted(self._rounds)[:-self.keep]:
            del self._rounds[old]

    def get(self, round_id: int) -> Committed | None:
        return self._rounds.get(round_id)

    @staticmethod
    def asks_for_result(committed: Committed, is_view: bool, is_part: bool, attempt: int) -> bool:
        """Whether a frame of a committed round shows its sender still trying that round."""
        return is_view or (is_part and attempt > committed.attempt)

    def claim_push(self, round_id: int, peer: str) -> Committed | None:
        """The committed round to push to `peer` now, or None (not committed, or already pushed)."""
        committed = self._rounds.get(round_id)
        if committed is None or peer in committed.pushed_to or peer == self.me:
            return None
        committed.pushed_to.add(peer)
        return committed


def next_rates(previous: dict[str, float], peers: list[str], outcome: Committed | None) -> dict[str, float]:
    """The upload-rate table for the next round after this one's outcome (None: the round failed).

    After a failure, or a round that left someone out (a member that did not commit kept its old
    table), every member starts over from even shards, so the next plans agree. Otherwise the
    agreed table is averaged with the new agreed measurements (same inputs, same bits everywhere).
    """
    if outcome is None or outcome.participants != tuple(peers):
        return {}
    if not outcome.rates:
        return dict(previous)
    return {p: round(0.5 * previous[p] + 0.5 * r) if p in previous else r for p, r in sorted(outcome.rates.items())}
