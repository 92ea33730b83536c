"""One seeded run: the fault profile drawn from the seed, the safety phase, then the liveness phase.

Everything random (the profile, fault timing, message delays, transactions) comes from one
``random.Random(seed)`` and time is virtual, so ``simulate(SimConfig(seed))`` replays exactly;
``SimResult.trace`` is a digest of every commit (node, height, round, block hash, app hash) and
fault, for checking that it does.

Safety phase (``fault_time`` virtual seconds): the network drops, duplicates, delays and reorders
messages and partitions the validators (partitions heal after a while); honest validators crash
and restart (memory lost, storage kept), some at a storage write (a torn crash: the batch is not
applied); a byzantine validator may double-vote throughout. Random signed transfers enter through
random nodes' mempools all along. Liveness phase: faults healed, crashed nodes restarted; every
honest replica must reach the highest honest height at the heal plus ``liveness_heights`` within
``liveness_bound`` virtual seconds. Invariants: ``devtools.consensus_sim.invariants``; a byzantine
validator that double-voted must have been slashed on chain by the end.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from dataclasses import dataclass, field

from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Proposal, Vote, verify_proposal, verify_vote
from consensus.tendermint import TimeoutConfig
from consensus.tx import build_tx
from devtools.consensus_sim.dispute_game import DisputeGame, game_params
from devtools.consensus_sim.invariants import Checker, DriverErrorLog
from devtools.consensus_sim.loop import SimClock, VirtualTimeLoop
from devtools.consensus_sim.network import Faults, SimNetwork
from devtools.consensus_sim.replica import Replica
from devtools.consensus_sim.wan import WanConfig, WanLatency
from node.identity import Identity

CHAIN_ID = "dekube-sim"
GENESIS_TIME_MS = 1_700_000_000_000
VALIDATOR_STAKE = 10_000
USER_BALANCE = 1_000_000
USERS = 6
TIMEOUTS = TimeoutConfig(propose=0.3, propose_delta=0.1, prevote=0.1, prevote_delta=0.05,
                         precommit=0.1, precommit_delta=0.05)


@dataclass
class SimConfig:
    """``None`` fields are drawn from the seed (the fault model is randomised per seed)."""

    seed: int = 0
    validators: int | None = None          # 4..5, all in the committee
    fault_time: float | None = None        # length of the safety phase, virtual seconds
    drop: float | None = None
    duplicate: float | None = None
    max_delay: float | None = None
    partitions: bool | None = None
    crashes: bool | None = None
    torn_crashes: bool | None = None
    byzantine: bool | None = None
    tx_rate: float | None = None           # transfers per virtual second
    epoch_length: int = 8
    liveness_heights: int = 5
    liveness_bound: float = 30.0
    dispute_game: bool = False             # also play the audit dispute game (dispute_game.py, ADR 0170)
    game_bound: float = 120.0              # virtual seconds after the heal for the game's task to be paid
    wan: WanConfig | None = None           # inter-region latencies instead of max_delay (wan.py, ADR 0193)
    timeouts: TimeoutConfig = TIMEOUTS
    empty_block_wait: float | None = None  # the next proposer's wait for a transaction ([consensus] key)
    idle_block_wait: float | None = None   # ... when no task or dispute is in flight (None: empty_block_wait)
    retain_blocks: int = 0                 # [consensus] retain_blocks: blocks each replica keeps (0: all)
    wiped: int | None = None               # this replica loses its disk at the heal, rejoins by state sync


@dataclass
class SimResult:
    seed: int
    profile: dict
    violations: list[str]
    heights: list[int]
    virtual_time: float
    wall_time: float
    faults: dict[str, int]
    network: dict[str, int]
    txs: dict[str, int]
    byzantine_slashed: int = 0
    trace: str = ""
    commits: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def draw_profile(cfg: SimConfig, rng: random.Random) -> SimConfig:
    """``cfg`` with every ``None`` replaced by a value drawn from ``rng`` (always in this order)."""
    drawn = {
        "validators": rng.choice((4, 4, 5)),
        "fault_time": rng.uniform(5.0, 20.0),
        "drop": rng.choice((0.0, rng.uniform(0.0, 0.2))),
        "duplicate": rng.choice((0.0, rng.uniform(0.0, 0.1))),
        "max_delay": rng.choice((0.02, rng.uniform(0.02, 0.4))),
        "partitions": rng.random() < 0.7,
        "crashes": rng.random() < 0.8,
        "torn_crashes": rng.random() < 0.6,
        "byzantine": rng.random() < 0.5,
        "tx_rate": rng.uniform(2.0, 30.0),
    }
    values = {name: getattr(cfg, name) if getattr(cfg, name) is not None else value
              for name, value in drawn.items()}
    return SimConfig(**{**cfg.__dict__, **values})


class Simulation:
    gossip_interval = 0.3
    sync_delay = 0.5
    game_tick = 0.05     # how often the game's parties look at the chain and act

    def __init__(self, config: SimConfig) -> None:
        self.rng = random.Random(config.seed)
        self.cfg = draw_profile(config, self.rng)
        cfg = self.cfg
        self.loop = VirtualTimeLoop()
        self.clock = SimClock()
        validators = [Identity.from_seed(hashlib.sha256(b"sim-validator-%d" % i).digest())
                      for i in range(cfg.validators)]
        self.users = [Identity.from_seed(hashlib.sha256(b"sim-user-%d" % i).digest()) for i in range(USERS)]
        self.game = DisputeGame(cfg.seed) if cfg.dispute_game else None
        self.game_rng = random.Random(cfg.seed * 7919 + 17)   # the game never moves the fault model's draws
        params = Params(committee_size=cfg.validators, epoch_length=cfg.epoch_length)
        balances = {u.peer_id: USER_BALANCE for u in self.users}
        if self.game is not None:
            params = game_params(params)
            balances.update(self.game.balances)
        self.genesis = Genesis(
            CHAIN_ID, GENESIS_TIME_MS, balances,
            tuple(GenesisValidator(v.peer_id, VALIDATOR_STAKE) for v in validators), params)
        self.byzantine = {cfg.validators - 1} if cfg.byzantine else set()
        latency = None if cfg.wan is None else WanLatency(cfg.validators, cfg.wan, self.rng)
        self.net = SimNetwork(self.loop, self.rng, Faults(drop=cfg.drop, duplicate=cfg.duplicate,
                                                          max_delay=cfg.max_delay),
                              [v.peer_id for v in validators], latency)
        self.checker = Checker(self)
        self.net.tap = self.checker.on_send
        self.replicas = [Replica(self, i, ident, self.genesis) for i, ident in enumerate(validators)]
        self.faults_on = True
        self.faults = {"crash": 0, "torn_crash": 0, "partition": 0, "restart": 0, "evidence_seen": 0}
        self.txs = {"submitted": 0, "accepted": 0}
        self._verified: dict = {}
        self.proposed_at: dict[int, float] = {}   # height -> virtual time its first proposal was built
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ helpers for replicas
    def verifier(self, message: Vote | Proposal) -> bool:
        """Real ed25519 verification, memoised across replicas (they all verify the same messages)."""
        known = self._verified.get(message)
        if known is None:
            if len(self._verified) > 100_000:
                self._verified.clear()
            known = verify_vote(message, CHAIN_ID) if isinstance(message, Vote) \
                else verify_proposal(message, CHAIN_ID)
            self._verified[message] = known
        return known

    def note_proposal(self, height: int) -> None:
        self.proposed_at.setdefault(height, self.loop.time())

    def now_ms(self) -> int:
        return GENESIS_TIME_MS + int(self.loop.time() * 1000)

    def spawn(self, coro) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def record_fault(self, kind: str, index: int) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1
        self.checker.trace.update(b"F%s/%d/%.6f" % (kind.encode(), index, self.loop.time()))
        if kind == "torn_crash":
            self.loop.call_later(self.rng.uniform(0.2, 3.0), self._restart, index)

    def honest(self) -> list[Replica]:
        return [r for r in self.replicas if r.index not in self.byzantine]

    # ------------------------------------------------------------------ faults
    def _restart(self, index: int) -> None:
        replica = self.replicas[index]
        if not replica.up and self.faults_on:
            self.faults["restart"] += 1
            self.spawn(replica.boot(self.cfg.timeouts, index in self.byzantine))

    async def _inject_faults(self) -> None:
        cfg = self.cfg
        kinds = [k for k, on in (("crash", cfg.crashes), ("torn_crash", cfg.torn_crashes),
                                 ("partition", cfg.partitions)) if on]
        if not kinds:
            return
        max_down = max(1, (cfg.validators - 1) // 3)
        while self.faults_on:
            await self.clock.sleep(self.rng.expovariate(1 / 1.2))
            if not self.faults_on:
                return
            kind = self.rng.choice(kinds)
            if kind == "partition":
                if self.net.faults.partition is None:
                    members = list(range(cfg.validators))
                    self.rng.shuffle(members)
                    cut = self.rng.randint(1, len(members) - 1)
                    self.net.faults.partition = [set(members[:cut]), set(members[cut:])]
                    self.record_fault("partition", cut)
                    self.loop.call_later(self.rng.uniform(0.5, 4.0), self._heal_partition)
                continue
            down = sum(1 for r in self.replicas if not r.up or r.crash_at_write is not None)
            candidates = [r for r in self.honest() if r.up and r.crash_at_write is None]
            if not candidates or down >= max_down:
                continue
            victim = self.rng.choice(candidates)
            if kind == "crash":
                self.record_fault("crash", victim.index)
                victim.crash()
                self.loop.call_later(self.rng.uniform(0.2, 4.0), self._restart, victim.index)
            else:
                victim.crash_at_write = self.rng.randint(1, 8)  # crashes inside that write

    def _heal_partition(self) -> None:
        self.net.faults.partition = None

    # ------------------------------------------------------------------ transactions
    async def _submit_transactions(self) -> None:
        chain_id = self.genesis.chain_id
        while True:
            await self.clock.sleep(self.rng.expovariate(self.cfg.tx_rate))
            up = [r for r in self.replicas if r.up]
            if not up:
                continue
            entry = self.rng.choice(up)
            sender, to = self.rng.sample(self.users, 2)
            nonce = entry.mempool.pending_nonce(sender.peer_id)
            if self.rng.random() < 0.05:
                nonce = max(0, nonce - 1)  # a stale or replayed nonce: must be refused or fail cleanly
            amount = self.rng.randint(1, USER_BALANCE // 50)
            raw = build_tx(sender, chain_id, nonce, "transfer", {"to": to.peer_id, "amount": amount},
                           fee=self.rng.randint(0, 3)).raw
            self.txs["submitted"] += 1
            if entry.submit(raw):
                self.txs["accepted"] += 1
                for other in self.replicas:  # transaction gossip, subject to the network's faults
                    if other is not entry and self.net.can_reach(entry.index, other.index) \
                            and self.rng.random() >= self.net.faults.drop:
                        self.loop.call_later(self.net.delay(entry.index, other.index, len(raw)), other.submit, raw)

    def _gossip(self, entry: Replica, raw: bytes) -> None:
        for other in self.replicas:  # transaction gossip, subject to the network's faults
            if other is not entry and self.net.can_reach(entry.index, other.index) \
                    and self.game_rng.random() >= self.net.faults.drop:
                delay = self.game_rng.uniform(self.net.faults.min_delay, self.net.faults.max_delay)
                self.loop.call_later(delay, other.submit, raw)

    async def _play_game(self) -> None:
        """Every ``game_tick`` virtual seconds: read the most advanced honest replica's ledger, and send every
        party's moves (nonces from that ledger, so a resent move is the same bytes) to a random up node."""
        game = self.game
        assert game is not None
        chain_id = self.genesis.chain_id
        while True:
            await self.clock.sleep(self.game_tick)
            up = [r for r in self.replicas if r.up]
            honest_up = [r for r in self.honest() if r.up]
            if not up or not honest_up:
                continue
            view = max(honest_up, key=lambda r: r.ledger.height).ledger
            entry = self.game_rng.choice(up)
            sent: dict[str, int] = {}
            for identity, tx_type, payload in game.moves(view.state):
                nonce = view.nonce(identity.peer_id) + sent.get(identity.peer_id, 0)
                sent[identity.peer_id] = sent.get(identity.peer_id, 0) + 1
                raw = build_tx(identity, chain_id, nonce, tx_type, payload, fee=1).raw
                self.game_moves += 1
                if entry.submit(raw):
                    self._gossip(entry, raw)

    async def _finish_game(self) -> None:
        game = self.game
        assert game is not None
        started = self.loop.time()
        while not all(game.finished(r.ledger.state) for r in self.honest()):
            if self.loop.time() - started > self.cfg.game_bound:
                break
            await self.clock.sleep(0.2)
        state = self.honest()[0].ledger.state
        for violation in game.check(state, self.genesis.params):
            self.checker.violation(violation)
        self.game_stats: dict[str, int] = {**game.stats(state), "moves": self.game_moves, "height": state.height}

    # ------------------------------------------------------------------ phases
    async def _main(self) -> None:
        cfg = self.cfg
        for replica in self.replicas:
            await replica.boot(cfg.timeouts, replica.index in self.byzantine)
        self.spawn(self._inject_faults())
        if cfg.tx_rate:   # 0: an idle chain (storage growth of empty blocks)
            self.spawn(self._submit_transactions())
        if self.game is not None:
            self.spawn(self._play_game())
        await self.clock.sleep(cfg.fault_time)
        # liveness phase: heal everything, restart everyone, then require progress
        self.faults_on = False
        self.net.heal()
        for replica in self.replicas:
            replica.crash_at_write = None
            if replica.index == cfg.wiped:
                replica.crash()
                others = [r for r in self.replicas if r.up and r.index != cfg.wiped]
                await replica.boot(cfg.timeouts, replica.index in self.byzantine, sync_from=others)
            elif not replica.up:
                self.faults["restart"] += 1
                await replica.boot(cfg.timeouts, replica.index in self.byzantine)
        heal_time = self.loop.time()
        target = max(r.height for r in self.honest()) + cfg.liveness_heights
        while any(r.height < target for r in self.honest()):
            if self.loop.time() - heal_time > cfg.liveness_bound:
                self.checker.violation(
                    f"LIVENESS: heights {[r.height for r in self.replicas]} short of {target} "
                    f"{cfg.liveness_bound:.0f}s after the faults healed")
                break
            await self.clock.sleep(0.1)
        self.liveness_time = self.loop.time() - heal_time
        if self.game is not None:
            await self._finish_game()
        for replica in self.replicas:
            if replica.driver is not None:
                await replica.driver.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._check_slashing()

    def _check_slashing(self) -> None:
        for index in self.byzantine:
            offender = self.replicas[index].peer_id
            for replica in self.honest():
                stake = replica.ledger.state.stakes.get(offender)
                self.byzantine_slashed = stake.slashed if stake is not None else 0
                if self.net.stats.double_votes >= 30 and not self.byzantine_slashed:
                    self.checker.violation(f"EVIDENCE: node {replica.index} never slashed the double-voter "
                                           f"({self.net.stats.double_votes} double votes sent)")

    def run(self) -> SimResult:
        started = time.perf_counter()
        self.byzantine_slashed = 0
        self.liveness_time = 0.0
        self.game_moves = 0
        self.game_stats = {}
        handler = DriverErrorLog(self.checker)
        loggers = [logging.getLogger("consensus.driver"), logging.getLogger("consensus.network")]
        for logger in loggers:
            logger.addHandler(handler)
        saved_propagate = [logger.propagate for logger in loggers]
        for logger in loggers:
            logger.propagate = False
        try:
            self.loop.run_until_complete(self._main())
        finally:
            for logger, propagate in zip(loggers, saved_propagate):
                logger.removeHandler(handler)
                logger.propagate = propagate
            self.loop.close()
        stats = self.net.stats
        self.checker.trace.update(repr((self.faults, self.txs, stats.sent, stats.dropped)).encode())
        return SimResult(
            seed=self.cfg.seed, profile=profile_of(self.cfg), violations=list(self.checker.violations),
            heights=[r.height for r in self.replicas], virtual_time=round(self.loop.time(), 3),
            wall_time=round(time.perf_counter() - started, 3), faults=dict(self.faults),
            network={"sent": stats.sent, "dropped": stats.dropped, "duplicated": stats.duplicated,
                     "partitioned": stats.partitioned, "rejected": stats.rejected,
                     "double_votes": stats.double_votes, "wrong_proposals": stats.wrong_proposals},
            txs=dict(self.txs), byzantine_slashed=self.byzantine_slashed,
            trace=self.checker.trace.hexdigest(), commits=self.checker.commits,
            extra={"liveness_s": round(self.liveness_time, 3), "max_round": self.checker.max_round,
                   **({"game": self.game_stats} if self.game is not None else {})})


def profile_of(cfg: SimConfig) -> dict:
    return {"validators": cfg.validators, "fault_time": round(cfg.fault_time, 2), "drop": round(cfg.drop, 3),
            "duplicate": round(cfg.duplicate, 3), "max_delay": round(cfg.max_delay, 3),
            "partitions": cfg.partitions, "crashes": cfg.crashes, "torn_crashes": cfg.torn_crashes,
            "byzantine": cfg.byzantine, "tx_rate": round(cfg.tx_rate, 1)}


def simulate(config: SimConfig) -> SimResult:
    return Simulation(config).run()
