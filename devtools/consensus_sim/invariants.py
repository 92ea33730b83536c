"""What the simulator checks, as each replica stores a commit and at the end of a run.

Safety (checked during both phases, honest replicas only): one block per height (by hash, across
replicas and across restarts), one app hash per height, the ledger's supply invariant after every
block, a valid commit certificate (>2/3 of that height's committee) for every stored block, and no
honest validator ever sending two different votes for one (height, round, type). Anything the
driver logs at ERROR level (a bug it swallowed to stay up) is a violation too. The checker also
times each honest commit (virtual seconds from the height's first proposal), for the WAN figures.
"""
from __future__ import annotations

import hashlib
import logging

from consensus.messages import VOTE_TAG, decode_message, value_id
from consensus.state.supply import SupplyInvariantError


class Checker:
    def __init__(self, sim) -> None:
        self.sim = sim
        self.blocks: dict[int, bytes] = {}      # height -> block hash first stored
        self.app_hashes: dict[int, bytes] = {}  # height -> app hash after it
        self.signed: dict[tuple, bytes] = {}    # (validator, height, round, type) -> value id
        self.violations: list[str] = []
        self.trace = hashlib.sha256()
        self.commits = 0
        self.max_round = 0
        self.finality: list[float] = []          # honest commits: seconds from the height's first proposal
        self.rounds: dict[int, int] = {}          # height -> highest round it was committed in
        self.first_commit: dict[int, float] = {}  # height -> when the first honest replica stored it
        self._seen_votes: set[bytes] = set()      # vote payloads already checked by on_send

    def violation(self, text: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(f"t={self.sim.loop.time():.3f} {text}")

    def on_commit(self, replica, block, commit, result) -> None:
        height = block.height
        self.commits += 1
        self.max_round = max(self.max_round, commit.round)
        self.trace.update(b"C%d/%d/%d/" % (replica.index, height, commit.round) + block.hash + result.app_hash)
        if replica.index in self.sim.byzantine:
            return
        now = self.sim.loop.time()
        self.finality.append(now - self.sim.proposed_at.get(height, now))
        self.rounds[height] = max(self.rounds.get(height, 0), commit.round)
        self.first_commit.setdefault(height, now)
        first = self.blocks.setdefault(height, block.hash)
        if first != block.hash:
            self.violation(f"SAFETY: node {replica.index} stored block {block.hash.hex()[:16]} at height "
                           f"{height}, another node stored {first.hex()[:16]}")
        app = self.app_hashes.setdefault(height, result.app_hash)
        if app != result.app_hash:
            self.violation(f"STATE: node {replica.index} app hash {result.app_hash.hex()[:16]} at height "
                           f"{height} differs from {app.hex()[:16]}")
        try:
            replica.ledger.check_invariants()
        except SupplyInvariantError as exc:
            self.violation(f"SUPPLY: node {replica.index} at height {height}: {exc}")
        if not replica.committee.verify_commit(replica.genesis.chain_id, height, value_id(commit.value),
                                               commit.certificate, self.sim.verifier):
            self.violation(f"CERTIFICATE: node {replica.index} stored height {height} without a valid certificate")

    def on_send(self, index: int, payload: bytes) -> None:
        """Every payload an honest endpoint sends (its votes are checked for double signing)."""
        if payload[0] != VOTE_TAG or payload in self._seen_votes:
            return  # a vote is sent to every peer: check each payload once
        if len(self._seen_votes) > 200_000:
            self._seen_votes.clear()
        self._seen_votes.add(payload)
        vote = decode_message(payload)
        if vote.validator != self.sim.replicas[index].peer_id:
            return  # gossip relays others' votes (a byzantine peer's conflicting ones included)
        key = (vote.validator, vote.height, vote.round, int(vote.type))
        previous = self.signed.setdefault(key, vote.value_id)
        if previous != vote.value_id:
            self.violation(f"DOUBLE-SIGN: honest node {index} sent two votes for {key[1:]}")


class DriverErrorLog(logging.Handler):
    """Collects what ``consensus.*`` loggers report at ERROR or above, except the simulator's crashes."""

    def __init__(self, checker: Checker) -> None:
        super().__init__(logging.ERROR)
        self.checker = checker

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if "SimulatedCrash" in text or "crashed at a storage write" in text or \
                (exc is not None and type(exc).__name__ == "SimulatedCrash"):
            return
        self.checker.violation(f"DRIVER ERROR: {text} {exc!r}" if exc else f"DRIVER ERROR: {text}")
