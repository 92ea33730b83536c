"""The validator committee: election by stake, voting-power thresholds and proposer rotation.

``ValidatorSet.elect`` takes the top-K bonded validators (ties broken by peer ID bytes). Quorum
arithmetic is by voting power: a quorum is more than 2/3 of the total, "f+1" is more than 1/3.
The proposer of (height, round) follows CometBFT's proposer-priority algorithm (stake-weighted round
robin): each step adds every validator's power to its priority, picks the highest priority (ties:
smallest peer ID bytes) and subtracts the total power from the winner, after rescaling priorities to
a window of 2x the total power and centring them on zero. Step ``k = height - start_height + round``
picks the proposer of (height, round), as CometBFT increments once per height and once per extra
round. ``verify_commit`` checks a commit certificate. The set is immutable; the proposer schedule
is computed lazily and memoised per set, so a set should live for one epoch (the memo grows with
the heights and rounds asked for).
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from consensus.messages import Vote, VoteType, verify_vote
from node.identity import b58decode, is_valid_peer_id

PRIORITY_WINDOW_FACTOR = 2


class CommitteeError(ValueError):
    """An invalid validator set (bad peer ID, non-positive power, duplicates, empty)."""


class ValidatorSet:
    """An immutable committee: peer ID -> voting power, plus its proposer schedule."""

    def __init__(self, powers: Mapping[str, int] | Iterable[tuple[str, int]], start_height: int = 0):
        items = list(powers.items() if isinstance(powers, Mapping) else powers)
        if not items:
            raise CommitteeError("validator set is empty")
        seen: dict[str, int] = {}
        for peer_id, power in items:
            if peer_id in seen:
                raise CommitteeError(f"duplicate validator {peer_id}")
            if not is_valid_peer_id(peer_id):
                raise CommitteeError(f"invalid validator peer id {peer_id!r}")
            if not isinstance(power, int) or power <= 0:
                raise CommitteeError(f"validator power must be a positive int: {power!r}")
            seen[peer_id] = power
        # canonical order: by peer ID bytes (CometBFT orders by address)
        self._order = sorted(seen, key=b58decode)
        self._powers = {pid: seen[pid] for pid in self._order}
        self.total_power = sum(self._powers.values())
        self.start_height = start_height
        self._priorities = [0] * len(self._order)
        self._schedule: list[int] = []
        self._schedule_lock = threading.Lock()   # shared instances (``of``) are read from the executor too

    @classmethod
    def of(cls, items: Iterable[Iterable[Any]], start_height: int = 0) -> ValidatorSet:
        """The set of ``(peer_id, power)`` pairs ``items``, shared with earlier calls for the same
        pairs and start: the ledger rebuilds its committee from state several times a block, and a
        fresh set pays the peer-ID sort and the proposer schedule from its start again (at 100
        validators, milliseconds a block per node). A ValidatorSet is immutable but for that lazily
        grown schedule, which is a function of the set alone."""
        return _shared_set(tuple((pid, power) for pid, power in items), start_height)

    @classmethod
    def elect(cls, stakes: Mapping[str, int], max_validators: int, start_height: int = 0) -> ValidatorSet:
        """The top ``max_validators`` peers by stake (zero stake never qualifies)."""
        if max_validators < 1:
            raise CommitteeError("committee size must be at least 1")
        ranked = sorted(((pid, s) for pid, s in stakes.items() if s > 0),
                        key=lambda item: (-item[1], b58decode(item[0])))
        return cls(ranked[:max_validators], start_height)

    # membership and power
    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._powers

    def __len__(self) -> int:
        return len(self._order)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ValidatorSet) and self._powers == other._powers
                and self.start_height == other.start_height)

    def __hash__(self) -> int:
        return hash((tuple(self._powers.items()), self.start_height))

    def __repr__(self) -> str:
        return f"ValidatorSet({len(self)} validators, power={self.total_power}, start={self.start_height})"

    @property
    def peer_ids(self) -> tuple[str, ...]:
        return tuple(self._order)

    def power(self, peer_id: str) -> int:
        return self._powers.get(peer_id, 0)

    def items(self) -> list[tuple[str, int]]:
        return list(self._powers.items())

    # thresholds
    def is_quorum(self, power: int) -> bool:
        """More than two thirds of the total power (2f+1)."""
        return 3 * power > 2 * self.total_power

    def is_one_third(self, power: int) -> bool:
        """More than one third of the total power (f+1): at least one honest validator."""
        return 3 * power > self.total_power

    @property
    def quorum_power(self) -> int:
        return 2 * self.total_power // 3 + 1

    def verify_commit(self, chain_id: str, height: int, value_id: bytes, certificate: Iterable[object],
                      verifier: Callable[[Vote], bool] | None = None) -> bool:
        """True if ``certificate`` holds validly signed precommits of one round for ``value_id``
        at ``height`` from distinct members with more than 2/3 of the power. ``verifier``
        replaces the signature check (e.g. a memoised one)."""
        if not value_id:
            return False
        seen: set[str] = set()
        power = 0
        rounds = set()
        for vote in certificate:
            if not isinstance(vote, Vote) or vote.type is not VoteType.PRECOMMIT \
                    or vote.height != height or vote.value_id != value_id \
                    or vote.validator in seen or vote.validator not in self._powers:
                return False
            rounds.add(vote.round)
            ok = verifier(vote) if verifier is not None else verify_vote(vote, chain_id)
            if len(rounds) > 1 or not ok:
                return False
            seen.add(vote.validator)
            power += self._powers[vote.validator]
        return self.is_quorum(power)

    # proposer rotation
    def proposer(self, height: int, round_: int) -> str:
        step = height - self.start_height + round_
        if step < 0:
            raise CommitteeError(f"height {height} is before this set's start {self.start_height}")
        if len(self._schedule) <= step:
            with self._schedule_lock:
                while len(self._schedule) <= step:
                    self._schedule.append(self._next_proposer())
        return self._order[self._schedule[step]]

    def _next_proposer(self) -> int:
        prio = self._priorities
        powers = [self._powers[pid] for pid in self._order]
        total = self.total_power
        window = PRIORITY_WINDOW_FACTOR * total
        spread = max(prio) - min(prio)
        if spread > window:
            ratio = -(-spread // window)
            prio[:] = [p // ratio if p >= 0 else -(-p // ratio) for p in prio]  # truncate like Go
        avg = sum(prio) // len(prio)
        for i, power in enumerate(powers):
            prio[i] += power - avg
        best = 0
        for i in range(1, len(prio)):
            if prio[i] > prio[best]:  # ties keep the earlier (smaller peer ID)
                best = i
        prio[best] -= total
        return best


@functools.lru_cache(maxsize=16)
def _shared_set(items: tuple[tuple[str, int], ...], start_height: int) -> ValidatorSet:
    return ValidatorSet(items, start_height)
