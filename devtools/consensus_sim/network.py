"""The simulated network: one ``ConsensusNetwork`` endpoint per node, faults drawn from the seed.

Each payload a driver sends is delivered after a random delay, or dropped, or delivered twice, or cut by
a partition, as the ``Faults`` in force say; with a ``WanLatency`` (``wan.py``) the delay is the link's
inter-region latency (and transmission time) instead of ``Faults``' uniform range. Each link (sender,
receiver) is FIFO, as the production transport's one long-lived stream per peer is; messages reorder
across links only; ``heal()`` turns every fault off (the liveness phase). A crashed node's endpoint is
detached: what it sends and what is sent to it is lost. A byzantine node's endpoint equivocates: for each
vote it sends, some peers get a second, conflicting vote signed with the same key (the signer guard is
bypassed on purpose), and each proposal it sends is also re-signed as a fresh proposal for the next
round, where it is usually not the proposer (honest cores drop it; when it is, that is a second proposal
for the round).
Everything honest nodes send is shown to a ``tap`` (the double-sign check).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from consensus.messages import (
    PROPOSAL_TAG,
    VOTE_TAG,
    MessageError,
    Proposal,
    Vote,
    decode_message,
    encode_message,
    sign_proposal,
    sign_vote,
)
from devtools.consensus_sim.wan import WanLatency
from node.identity import Identity


@dataclass
class Faults:
    drop: float = 0.0          # probability a payload is lost
    duplicate: float = 0.0     # probability a payload is delivered twice
    min_delay: float = 0.001   # seconds
    max_delay: float = 0.02
    partition: list[set[int]] | None = None  # groups that can talk among themselves only


@dataclass
class NetStats:
    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    partitioned: int = 0
    rejected: int = 0
    double_votes: int = 0
    wrong_proposals: int = 0
    by_kind: dict[int, int] = field(default_factory=dict)


class SimNetwork:
    def __init__(self, loop, rng: random.Random, faults: Faults, peer_ids: list[str],
                 latency: WanLatency | None = None) -> None:
        self.loop = loop
        self.latency = latency
        self.rng = rng
        self.faults = faults
        self.peer_ids = peer_ids
        self.index = {pid: i for i, pid in enumerate(peer_ids)}
        self.endpoints: dict[int, Endpoint] = {}
        self.stats = NetStats()
        self.tap: Callable[[int, bytes], None] | None = None
        self._link_clear: dict[tuple[int, int], float] = {}  # (src, dst) -> last scheduled arrival

    def endpoint(self, index: int, byzantine: Identity | None = None, chain_id: str = "") -> Endpoint:
        endpoint = Endpoint(self, index, byzantine, chain_id)
        self.endpoints[index] = endpoint
        return endpoint

    def detach(self, index: int) -> None:
        endpoint = self.endpoints.pop(index, None)
        if endpoint is not None:
            endpoint.deliver = None

    def heal(self) -> None:
        self.faults = Faults(min_delay=self.faults.min_delay, max_delay=min(self.faults.max_delay, 0.05))

    def can_reach(self, src: int, dst: int) -> bool:
        groups = self.faults.partition
        return groups is None or any(src in g and dst in g for g in groups)

    def delay(self, src: int, dst: int, size: int) -> float:
        """Seconds from now until a payload of ``size`` bytes sent on (src, dst) arrives (before FIFO order)."""
        now = self.loop.time()
        if self.latency is not None:
            return self.latency.arrival(now, src, dst, size) - now
        return self.rng.uniform(self.faults.min_delay, self.faults.max_delay)

    def transmit(self, src: int, dst: int, payload: bytes) -> None:
        f, stats = self.faults, self.stats
        stats.sent += 1
        stats.by_kind[payload[0]] = stats.by_kind.get(payload[0], 0) + 1
        if not self.can_reach(src, dst):
            stats.partitioned += 1
            return
        if f.drop and self.rng.random() < f.drop:
            stats.dropped += 1
            return
        copies = 2 if f.duplicate and self.rng.random() < f.duplicate else 1
        stats.duplicated += copies - 1
        now = self.loop.time()
        for _ in range(copies):
            # strictly after the link's previous payload: timers due at one instant run in no fixed order
            at = max(now + self.delay(src, dst, len(payload)), self._link_clear.get((src, dst), 0.0) + 1e-6)
            self._link_clear[(src, dst)] = at
            self.loop.call_at(at, self._arrive, src, dst, payload)

    def _arrive(self, src: int, dst: int, payload: bytes) -> None:
        endpoint = self.endpoints.get(dst)
        if endpoint is None or endpoint.deliver is None or src not in self.endpoints:
            return  # the receiver is down (or the sender crashed: its connections are gone)
        try:
            endpoint.deliver(self.peer_ids[src], payload)
        except MessageError:
            self.stats.rejected += 1


class Endpoint:
    """One node's ``ConsensusNetwork`` (see ``consensus.network``)."""

    def __init__(self, net: SimNetwork, index: int, byzantine: Identity | None, chain_id: str) -> None:
        self.net = net
        self.index = index
        self.deliver = None
        self.byzantine = byzantine
        self.chain_id = chain_id

    def start(self, deliver) -> None:
        self.deliver = deliver

    async def stop(self) -> None:
        self.deliver = None

    def prune(self, keep: set[str]) -> None:
        """Nothing to close: simulated links hold no per-peer state."""

    def send(self, peer: str, payload: bytes) -> None:
        net = self.net
        if net.endpoints.get(self.index) is not self:
            return  # this incarnation crashed
        dst = net.index.get(peer)
        if dst is None:
            return
        if self.byzantine is not None and payload[0] == VOTE_TAG:
            for one in self._equivocate(payload):
                net.transmit(self.index, dst, one)
            return
        if self.byzantine is not None and payload[0] == PROPOSAL_TAG and net.rng.random() < 0.5:
            p = decode_message(payload)
            net.stats.wrong_proposals += 1
            net.transmit(self.index, dst, encode_message(sign_proposal(
                self.byzantine, self.chain_id, Proposal(p.height, p.round + 1, -1, p.value, p.proposer))))
        if net.tap is not None:
            net.tap(self.index, payload)
        net.transmit(self.index, dst, payload)

    def _equivocate(self, payload: bytes) -> list[bytes]:
        """The vote, or a conflicting one for the same step instead, or both."""
        net = self.net
        roll = net.rng.random()
        if roll < 0.4:
            return [payload]
        vote = decode_message(payload)
        other = b"" if vote.value_id else net.rng.randbytes(32)
        twin = encode_message(sign_vote(self.byzantine, self.chain_id,
                                        Vote(vote.type, vote.height, vote.round, other, vote.validator)))
        net.stats.double_votes += 1
        return [twin] if roll < 0.8 else [twin, payload]
