"""Deterministic simulator for the SDBFT core: N real ``TendermintCore``s on a seeded fake network.

Everything random comes from one seeded PRNG, time is virtual, so a seed replays exactly. While the
fault phase lasts (until the chain reaches
``fault_until_height`` or the virtual clock ``fault_max_time``) the network delays, drops and
partitions messages and honest validators crash and restart (a restart rebuilds the core from the
persisted signer state and the committed chain, then catches up by block sync). An optional
byzantine validator double-votes on every vote it casts and sends two different blocks when it
proposes. The application is minimal and
deterministic (``SimApp``): blocks carry evidence and dummy transactions, state is the stake table,
evidence slashes the offender's stake to zero and the next epoch's committee (top-K by stake)
excludes it.

Invariants checked (``SimResult.violations``): safety (no two different values committed at one
height by any honest node; every commit has a valid certificate), no honest validator signs two
different votes for one step (across restarts too), equal app state at equal heights, liveness
(after the faults end every node commits again within ``liveness_bound`` virtual seconds and the run
reaches its target), and with a byzantine validator: its evidence lands on chain and it is slashed
and dropped from the committee. CLI: ``python -m consensus.simulator --seeds 100 --heights 5000``.
"""
from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import struct
import sys
import time
from dataclasses import dataclass, field

from consensus.committee import ValidatorSet
from consensus.messages import (
    DoubleVoteEvidence,
    MessageError,
    Proposal,
    Vote,
    sign_proposal,
    sign_vote,
    value_id,
    verify_proposal,
    verify_vote,
)
from consensus.signer import SignerGuard
from consensus.tendermint import (
    Broadcast,
    Commit,
    EvidenceFound,
    PersistSignerState,
    ScheduleTimeout,
    TendermintCore,
    TimeoutConfig,
)
from node.identity import Identity

CHAIN_ID = "dekube-sim"
MAX_EVIDENCE_PER_BLOCK = 8
MAX_SYNC_BLOCKS = 64
GOSSIP_INTERVAL = 0.5  # virtual seconds; a node that made no progress in one re-sends its gossip
_U32 = struct.Struct(">I")


# ---------------------------------------------------------------------------- the application
@dataclass(frozen=True)
class SimBlock:
    """A block of the simulated app: height, proposer, equivocation evidence, dummy txs."""

    height: int
    proposer: str
    evidence: tuple[DoubleVoteEvidence, ...]
    txs: tuple[bytes, ...]

    def encode(self) -> bytes:
        parts = [struct.pack(">QB", self.height, len(self.proposer)), self.proposer.encode()]
        parts.append(struct.pack(">H", len(self.evidence)))
        for ev in self.evidence:
            raw = ev.encode()
            parts += [_U32.pack(len(raw)), raw]
        parts.append(struct.pack(">H", len(self.txs)))
        for tx in self.txs:
            parts += [_U32.pack(len(tx)), tx]
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> "SimBlock":
        try:
            height, plen = struct.unpack_from(">QB", data, 0)
            pos = 9
            proposer = data[pos:pos + plen].decode()
            pos += plen
            lists = []
            for _ in range(2):
                (count,) = struct.unpack_from(">H", data, pos)
                pos += 2
                items = []
                for _ in range(count):
                    (n,) = _U32.unpack_from(data, pos)
                    items.append(data[pos + 4:pos + 4 + n])
                    pos += 4 + n
                lists.append(items)
            if pos != len(data):
                raise ValueError("trailing bytes")
            evidence = tuple(DoubleVoteEvidence.decode(raw) for raw in lists[0])
        except (struct.error, UnicodeDecodeError, ValueError, MessageError) as exc:
            raise ValueError(f"bad block: {exc}") from exc
        return cls(height, proposer, evidence, tuple(lists[1]))


class SimApp:
    """Deterministic app state: stakes, committees per epoch, evidence already applied."""

    def __init__(self, stakes: dict[str, int], committee_size: int, epoch_length: int) -> None:
        self.stakes = dict(stakes)
        self.committee_size = committee_size
        self.epoch_length = epoch_length
        self.height = 0  # next height to execute
        self.committees = {0: ValidatorSet.elect(self.stakes, committee_size, 0)}
        self.applied_evidence: dict[bytes, int] = {}
        self.slashed_at: dict[str, int] = {}

    @property
    def evidence_max_age(self) -> int:
        return 2 * self.epoch_length

    def validators(self, height: int) -> ValidatorSet:
        return self.committees[height // self.epoch_length]

    def check_block(self, height: int, value: bytes) -> bool:
        try:
            block = SimBlock.decode(value)
        except ValueError:
            return False
        if block.height != height or block.proposer not in self.validators(height):
            return False
        ids = set()
        for ev in block.evidence:
            eid = ev.evidence_id
            if eid in ids or eid in self.applied_evidence or not self._evidence_ok(ev, height):
                return False
            ids.add(eid)
        return len(block.evidence) <= MAX_EVIDENCE_PER_BLOCK

    def _evidence_ok(self, ev: DoubleVoteEvidence, height: int) -> bool:
        if not (height - self.evidence_max_age <= ev.height < height):
            return False
        epoch = ev.height // self.epoch_length
        committee = self.committees.get(epoch)
        return committee is not None and ev.validator in committee and ev.verify(CHAIN_ID)

    def apply(self, height: int, value: bytes) -> SimBlock:
        assert height == self.height, (height, self.height)
        block = SimBlock.decode(value)
        for ev in block.evidence:
            self.applied_evidence[ev.evidence_id] = height
            if self.stakes.get(ev.validator, 0) > 0:
                self.stakes[ev.validator] = 0
                self.slashed_at[ev.validator] = height
        self.height = height + 1
        if self.height % self.epoch_length == 0:
            epoch = self.height // self.epoch_length
            self.committees[epoch] = ValidatorSet.elect(self.stakes, self.committee_size, self.height)
            self.committees.pop(epoch - 3, None)
        floor = height - self.evidence_max_age
        if len(self.applied_evidence) > 64:
            self.applied_evidence = {k: h for k, h in self.applied_evidence.items() if h >= floor}
        return block

    def state_hash(self) -> bytes:
        return hashlib.sha256(json.dumps(sorted(self.stakes.items())).encode()).digest()


# ---------------------------------------------------------------------------- config and result
@dataclass
class SimConfig:
    seed: int = 0
    validators: int = 5
    committee_size: int = 4
    heights: int = 300
    epoch_length: int = 25
    fault_until_height: int | None = None  # default: half of ``heights``
    fault_max_time: float | None = None  # faults also end at this virtual time (default: 0.5 s/height)
    drop_rate: float = 0.05
    min_delay: float = 0.002
    max_delay: float = 0.040
    mean_fault_interval: float = 1.5
    partitions: bool = True
    crashes: bool = True
    byzantine: bool = False
    liveness_bound: float = 30.0
    max_virtual_time: float | None = None
    timeouts: TimeoutConfig = field(default_factory=lambda: TimeoutConfig(
        propose=0.3, propose_delta=0.1, prevote=0.1, prevote_delta=0.05,
        precommit=0.1, precommit_delta=0.05))


@dataclass
class SimResult:
    seed: int
    heights: list[int]
    virtual_time: float
    wall_time: float
    violations: list[str]
    faults: dict[str, int]
    evidence_on_chain: int = 0
    slashed_at: int | None = None
    max_round: int = 0
    proposers: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


# ---------------------------------------------------------------------------- nodes
class SimNode:
    """One simulated validator process: its core plus what survives a crash."""

    def __init__(self, index: int, identity: Identity, app: SimApp) -> None:
        self.index = index
        self.identity = identity
        self.peer_id = identity.peer_id
        self.app = app
        self.chain: list[tuple[bytes, tuple[Vote, ...]]] = []  # persisted
        self.signer_state = b""  # persisted (fsync'd before each send)
        self.core: TendermintCore | None = None
        self.up = False
        self.incarnation = 0
        self.evidence_pool: dict[bytes, DoubleVoteEvidence] = {}
        self.sync_pending = False
        self.seen_height = 0
        self.last_commit_time = 0.0
        self.gossip_mark: tuple | None = None


class Simulator:
    """Runs one seeded scenario; ``run()`` returns a ``SimResult``."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.now = 0.0
        self._queue: list = []
        self._seq = 0
        self._verified: dict = {}
        n = config.validators
        identities = [Identity.from_seed(hashlib.sha256(b"sim-validator-%d" % i).digest()) for i in range(n)]
        stakes = {ident.peer_id: 50 + 10 * (n - i) for i, ident in enumerate(identities)}
        self.nodes = [SimNode(i, ident, SimApp(stakes, config.committee_size, config.epoch_length))
                      for i, ident in enumerate(identities)]
        self.byzantine = 1 if config.byzantine else None
        self.fault_until = config.fault_until_height if config.fault_until_height is not None \
            else config.heights // 2
        self.faults_active = True
        self.fault_end_time: float | None = None
        self._next_liveness_check = 0.0
        self.partition: list[set[int]] | None = None
        self.committed: dict[int, bytes] = {}
        self.app_hashes: dict[int, bytes] = {}
        self.honest_signed: dict[tuple, bytes] = {}
        self.violations: list[str] = []
        self.faults = {"crash": 0, "partition": 0, "dropped": 0, "double_votes": 0,
                       "double_proposals": 0, "syncs": 0}
        self.max_round = 0
        self.evidence_on_chain = 0
        self.slashed_at: int | None = None
        self.proposers: dict[str, int] = {}

    # ------------------------------------------------------------------ event queue
    def _push(self, delay: float, kind: str, payload) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, kind, payload))

    def _verify(self, message) -> bool:
        """Real ed25519 verification, memoised across nodes (all receive the same objects)."""
        known = self._verified.get(message)
        if known is None:
            if len(self._verified) > 50_000:
                self._verified.clear()
            known = verify_vote(message, CHAIN_ID) if isinstance(message, Vote) \
                else verify_proposal(message, CHAIN_ID)
            self._verified[message] = known
        return known

    # ------------------------------------------------------------------ node lifecycle
    def _boot(self, node: SimNode) -> None:
        node.up = True
        node.incarnation += 1
        node.sync_pending = False
        node.evidence_pool = {}
        guard = SignerGuard.restore(node.identity, node.signer_state)
        node.core = TendermintCore(
            CHAIN_ID, guard,
            get_value=lambda h, node=node: self._build_block(node, h),
            is_valid=node.app.check_block,
            timeouts=self.cfg.timeouts,
            verifier=self._verify,
        )
        height = len(node.chain)
        node.last_commit_time = self.now
        self._handle(node, node.core.start_height(height, node.app.validators(height)))
        self._push(self.rng.uniform(0, GOSSIP_INTERVAL), "gossip", (node.index, node.incarnation))

    def _regossip(self, index: int, incarnation: int) -> None:
        node = self.nodes[index]
        if not node.up or node.incarnation != incarnation:
            return
        mark = (node.core.height, node.core.round, node.core.step)
        if mark == node.gossip_mark:  # no progress for a whole interval: re-send (as the driver)
            for message in node.core.gossip_messages():
                for peer in self.nodes:
                    if peer is not node:
                        self._send(index, peer.index, "msg", message)
        node.gossip_mark = mark
        self._push(GOSSIP_INTERVAL, "gossip", (index, incarnation))

    def _crash(self, node: SimNode) -> None:
        node.up = False
        node.core = None
        node.evidence_pool = {}

    def _build_block(self, node: SimNode, height: int) -> bytes:
        evidence = sorted(node.evidence_pool.values(), key=lambda ev: ev.evidence_id)
        usable = [ev for ev in evidence if node.app._evidence_ok(ev, height)
                  and ev.evidence_id not in node.app.applied_evidence][:MAX_EVIDENCE_PER_BLOCK]
        txs = tuple(self.rng.randbytes(16) for _ in range(self.rng.randint(0, 3)))
        return SimBlock(height, node.peer_id, tuple(usable), txs).encode()

    # ------------------------------------------------------------------ outputs
    def _handle(self, node: SimNode, outputs) -> None:
        for out in outputs:
            if not node.up:
                return
            if isinstance(out, PersistSignerState):
                node.signer_state = out.state
            elif isinstance(out, Broadcast):
                self._broadcast(node, out.message)
            elif isinstance(out, ScheduleTimeout):
                self._push(out.delay, "timeout", (node.index, node.incarnation, out.step, out.height, out.round))
            elif isinstance(out, Commit):
                self._on_commit(node, out)
            elif isinstance(out, EvidenceFound):
                if out.evidence.evidence_id not in node.app.applied_evidence:
                    node.evidence_pool[out.evidence.evidence_id] = out.evidence

    def _broadcast(self, node: SimNode, message) -> None:
        if isinstance(message, Vote):
            self.max_round = max(self.max_round, message.round)
            if node.index != self.byzantine:
                key = (message.validator, message.height, message.round, message.type)
                previous = self.honest_signed.setdefault(key, message.value_id)
                if previous != message.value_id:
                    self.violations.append(f"honest {node.index} signed two votes for {key[1:]}")
            else:
                self._double_vote(node, message)
                return
        elif node.index == self.byzantine and message.pol_round == -1:
            self._double_propose(node, message)
            return
        for peer in self.nodes:
            if peer is not node:
                self._send(node.index, peer.index, "msg", message)

    def _double_propose(self, node: SimNode, proposal: Proposal) -> None:
        """Equivocating proposer: a second valid block for the same round to some peers."""
        other = SimBlock(proposal.height, node.peer_id, (), (self.rng.randbytes(16),)).encode()
        twin = sign_proposal(node.identity, CHAIN_ID, Proposal(
            proposal.height, proposal.round, -1, other, node.peer_id))
        self.faults["double_proposals"] += 1
        for peer in self.nodes:
            if peer is not node:
                self._send(node.index, peer.index, "msg", proposal if self.rng.random() < 0.5 else twin)

    def _double_vote(self, node: SimNode, vote: Vote) -> None:
        other_vid = b"" if vote.value_id else hashlib.sha256(b"evil%d" % self.rng.getrandbits(32)).digest()
        twin = sign_vote(node.identity, CHAIN_ID,
                         Vote(vote.type, vote.height, vote.round, other_vid, vote.validator))
        self.faults["double_votes"] += 1
        for peer in self.nodes:
            if peer is not node:
                self._send(node.index, peer.index, "msg", vote if self.rng.random() < 0.5 else twin)
                if self.rng.random() < 0.3:
                    self._send(node.index, peer.index, "msg", twin)

    def _send(self, src: int, dst: int, kind: str, payload) -> None:
        if self.faults_active:
            if self.partition is not None and not any(src in g and dst in g for g in self.partition):
                self.faults["dropped"] += 1
                return
            if self.rng.random() < self.cfg.drop_rate:
                self.faults["dropped"] += 1
                return
        delay = self.rng.uniform(self.cfg.min_delay, self.cfg.max_delay)
        self._push(delay, kind, (src, dst, payload))

    def _on_commit(self, node: SimNode, commit: Commit) -> None:
        self._apply(node, commit.height, commit.value, commit.certificate)
        if node.up:
            self.max_round = max(self.max_round, commit.round)
            nxt = commit.height + 1
            self._handle(node, node.core.start_height(nxt, node.app.validators(nxt)))

    def _apply(self, node: SimNode, height: int, value: bytes, certificate) -> None:
        vid = value_id(value)
        if not node.app.validators(height).verify_commit(CHAIN_ID, height, vid, certificate, self._verify):
            self.violations.append(f"node {node.index} committed height {height} without a valid certificate")
        first = self.committed.setdefault(height, vid)
        if first != vid:
            self.violations.append(f"SAFETY: two different values committed at height {height}")
        block = node.app.apply(height, value)
        if height == len(self.committed) - 1 and first == vid and height not in self.app_hashes:
            self.proposers[block.proposer] = self.proposers.get(block.proposer, 0) + 1
        node.chain.append((value, certificate))
        node.last_commit_time = self.now
        for ev in block.evidence:
            node.evidence_pool.pop(ev.evidence_id, None)
        if node.index != self.byzantine:
            app_hash = node.app.state_hash()
            if self.app_hashes.setdefault(height, app_hash) != app_hash:
                self.violations.append(f"app state differs at height {height}")
            if block.evidence and node.index == self._reference_node():
                self.evidence_on_chain += len(block.evidence)
        if self.byzantine is not None and self.slashed_at is None:
            byz = self.nodes[self.byzantine].peer_id
            if byz in node.app.slashed_at:
                self.slashed_at = node.app.slashed_at[byz]

    def _reference_node(self) -> int:
        return 0 if self.byzantine != 0 else 1

    # ------------------------------------------------------------------ block sync
    def _note_height(self, node: SimNode, height: int, src: int) -> None:
        if height > node.seen_height:
            node.seen_height = height
        if height > len(node.chain) and not node.sync_pending:
            node.sync_pending = True
            self._push(2 * self.cfg.max_delay + 0.05, "sync_check", (node.index, node.incarnation, src))

    def _sync_check(self, index: int, incarnation: int, src: int) -> None:
        node = self.nodes[index]
        if not node.up or node.incarnation != incarnation:
            return
        node.sync_pending = False
        if node.seen_height > len(node.chain) and self.nodes[src].up:
            self.faults["syncs"] += 1
            self._send(index, src, "sync_req", len(node.chain))

    def _serve_sync(self, server: SimNode, requester: int, from_height: int) -> None:
        blocks = server.chain[from_height:from_height + MAX_SYNC_BLOCKS]
        if blocks:
            self._send(server.index, requester, "sync_resp", (from_height, blocks))

    def _apply_synced(self, node: SimNode, from_height: int, blocks) -> None:
        for offset, (value, certificate) in enumerate(blocks):
            height = from_height + offset
            if height != len(node.chain):
                continue
            if not node.app.check_block(height, value):
                self.violations.append(f"node {node.index}: synced block {height} invalid")
                return
            self._apply(node, height, value, certificate)
        height = len(node.chain)
        if node.core.height < height:
            self._handle(node, node.core.start_height(height, node.app.validators(height)))
        if node.seen_height > len(node.chain):
            self._note_height(node, node.seen_height, self._any_up_peer(node))

    def _any_up_peer(self, node: SimNode) -> int:
        peers = [p.index for p in self.nodes if p.up and p is not node]
        return self.rng.choice(peers) if peers else node.index

    # ------------------------------------------------------------------ faults
    def _schedule_fault(self) -> None:
        self._push(self.rng.expovariate(1 / self.cfg.mean_fault_interval), "fault", None)

    def _inject_fault(self) -> None:
        if not self.faults_active:
            return
        choices = []
        if self.cfg.crashes:
            choices.append("crash")
        if self.cfg.partitions and self.partition is None:
            choices.append("partition")
        if choices:
            kind = self.rng.choice(choices)
            if kind == "crash":
                down = sum(1 for n in self.nodes if not n.up)
                candidates = [n for n in self.nodes if n.up and n.index != self.byzantine]
                if candidates and down < max(1, (len(self.nodes) - 1) // 3):
                    victim = self.rng.choice(candidates)
                    self._crash(victim)
                    self.faults["crash"] += 1
                    self._push(self.rng.uniform(0.2, 4.0), "restart", victim.index)
            else:
                members = list(range(len(self.nodes)))
                self.rng.shuffle(members)
                cut = self.rng.randint(1, len(members) - 1)
                self.partition = [set(members[:cut]), set(members[cut:])]
                self.faults["partition"] += 1
                self._push(self.rng.uniform(0.5, 5.0), "heal", None)
        self._schedule_fault()

    def _end_faults(self) -> None:
        self.faults_active = False
        self.partition = None
        self.fault_end_time = self.now
        for node in self.nodes:
            if not node.up:
                self._boot(node)
            node.last_commit_time = self.now

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        started = time.perf_counter()
        cfg = self.cfg
        max_time = cfg.max_virtual_time or (60.0 + cfg.heights * 2.0)
        fault_max_time = cfg.fault_max_time if cfg.fault_max_time is not None \
            else 10.0 + 0.5 * self.fault_until
        for node in self.nodes:
            self._boot(node)
        if cfg.crashes or cfg.partitions:
            self._schedule_fault()
        else:
            self.fault_until = 0
        target = cfg.heights
        while self._queue:
            t, _, kind, payload = heapq.heappop(self._queue)
            self.now = t
            if t > max_time:
                break
            if kind == "msg":
                src, dst, message = payload
                node = self.nodes[dst]
                if node.up:
                    if message.height > len(node.chain):
                        self._note_height(node, message.height, src)
                    self._handle(node, node.core.on_message(message))
            elif kind == "timeout":
                index, incarnation, step, height, round_ = payload
                node = self.nodes[index]
                if node.up and node.incarnation == incarnation:
                    self._handle(node, node.core.on_timeout(step, height, round_))
            elif kind == "sync_req":
                src, dst, from_height = payload
                if self.nodes[dst].up:
                    self._serve_sync(self.nodes[dst], src, from_height)
            elif kind == "sync_resp":
                src, dst, (from_height, blocks) = payload
                if self.nodes[dst].up:
                    self._apply_synced(self.nodes[dst], from_height, blocks)
            elif kind == "sync_check":
                self._sync_check(*payload)
            elif kind == "gossip":
                self._regossip(*payload)
            elif kind == "fault":
                self._inject_fault()
            elif kind == "restart":
                if not self.nodes[payload].up and self.faults_active:
                    self._boot(self.nodes[payload])
            elif kind == "heal":
                self.partition = None
            if self.faults_active and (len(self.committed) >= self.fault_until or t >= fault_max_time):
                self._end_faults()
            if not self.faults_active:
                if t >= self._next_liveness_check:
                    self._next_liveness_check = t + 1.0
                    self._check_liveness()
                if kind == "msg" and len(self.nodes[payload[1]].chain) >= target \
                        and all(len(n.chain) >= target for n in self.nodes):
                    break
            if len(self.violations) > 20:
                break
        return self._result(started, target)

    def _check_liveness(self) -> None:
        for node in self.nodes:
            if len(node.chain) < self.cfg.heights and self.now - node.last_commit_time > self.cfg.liveness_bound:
                self.violations.append(
                    f"LIVENESS: node {node.index} stuck at height {len(node.chain)} for "
                    f"{self.now - node.last_commit_time:.1f}s after faults ended")
                node.last_commit_time = self.now

    def _result(self, started: float, target: int) -> SimResult:
        heights = [len(n.chain) for n in self.nodes]
        if min(heights) < target and not any(v.startswith("LIVENESS") for v in self.violations):
            self.violations.append(f"LIVENESS: run ended at heights {heights} before target {target}")
        if self.byzantine is not None:
            self._check_slashing()
        return SimResult(
            seed=self.cfg.seed, heights=heights, virtual_time=round(self.now, 3),
            wall_time=round(time.perf_counter() - started, 3), violations=self.violations,
            faults=dict(self.faults), evidence_on_chain=self.evidence_on_chain,
            slashed_at=self.slashed_at, max_round=self.max_round, proposers=dict(self.proposers))

    def _check_slashing(self) -> None:
        byz = self.nodes[self.byzantine].peer_id
        if self.evidence_on_chain == 0 or self.slashed_at is None:
            self.violations.append("double votes never produced evidence on chain / slashing")
            return
        for node in self.nodes:
            if node.index == self.byzantine:
                continue
            if node.app.stakes.get(byz, 0) != 0:
                self.violations.append(f"node {node.index} did not slash the double-voter")
            next_epoch_start = (self.slashed_at // self.cfg.epoch_length + 1) * self.cfg.epoch_length
            if len(node.chain) > next_epoch_start and byz in node.app.validators(len(node.chain)):
                self.violations.append(f"node {node.index}: slashed validator still in the committee")


def simulate(config: SimConfig) -> SimResult:
    return Simulator(config).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="SDBFT deterministic simulator soak")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--heights", type=int, default=1000)
    parser.add_argument("--validators", type=int, default=5)
    parser.add_argument("--committee", type=int, default=4)
    parser.add_argument("--no-byzantine", action="store_true")
    args = parser.parse_args(argv)
    failures = 0
    total_heights = 0
    started = time.perf_counter()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        result = simulate(SimConfig(seed=seed, heights=args.heights, validators=args.validators,
                                    committee_size=args.committee, byzantine=not args.no_byzantine))
        total_heights += min(result.heights)
        failures += not result.ok
        print(json.dumps({"seed": seed, "ok": result.ok, "heights": result.heights,
                          "wall_s": result.wall_time, "virtual_s": result.virtual_time,
                          "max_round": result.max_round, "faults": result.faults,
                          "slashed_at": result.slashed_at, "violations": result.violations[:5]}),
              flush=True)
    wall = time.perf_counter() - started
    print(json.dumps({"seeds": args.seeds, "failures": failures, "heights_total": total_heights,
                      "wall_s": round(wall, 2), "heights_per_s": round(total_heights / wall, 1)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
