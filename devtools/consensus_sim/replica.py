"""One simulated validator: the real driver, core, signer guard, ledger, mempool and storage.

What a ``Replica`` wires together mirrors ``consensus.validator.role.ValidatorRole`` (the production
role), minus the node around it: ``Storage`` over the replica's ``MemoryKV`` (its "disk", which
survives crashes), ``ChainStore`` for certificates and committees, ``Ledger`` loaded from storage,
``SignerGuard`` restored from storage, ``Mempool``, ``TendermintCore`` and ``ConsensusDriver``
(on the simulated network endpoint and virtual clock). Block building, proposal checks and
commit execution follow ``ValidatorRole._propose``/``_is_valid``/``_on_commit``/``_execute``, run
inline (the simulation has no threads); with ``SimConfig.empty_block_wait`` set, the next proposer
paces as ``ValidatorRole._pace`` does (waits that long for a ready transaction before proposing, or
``idle_block_wait`` when nothing is in flight, every replica granting round 0's proposer that wait).
A replica can also boot from an empty disk by state sync from the others' stores (docs/adr/0199).
Each stored commit is reported to the ``Checker``.
"""
from __future__ import annotations

from consensus.block import Block, BlockError, build_block
from consensus.committee import ValidatorSet
from consensus.driver import ConsensusDriver
from consensus.genesis import Genesis
from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, Evidence, value_id
from consensus.signer import SignerGuard
from consensus.statesync import StoreSource, state_sync
from consensus.tendermint import Commit, TendermintCore, TimeoutConfig
from consensus.txcodes import TxError
from consensus.validator.block_check import check_proposed_block
from consensus.validator.chainstore import (
    CertificateError,
    ChainStore,
    encode_certificate,
)
from consensus.validator.memkv import MemoryKV
from consensus.validator.mempool import Mempool
from consensus.validator.storage import Storage, StorageError
from node.identity import Identity

PROPOSAL_BYTES_HEADROOM = 64 * 1024
MAX_BLOCK_TXS = 200


class SimulatedCrash(Exception):
    """Raised by a replica's disk at the write where the simulator crashes it."""


class Replica:
    def __init__(self, sim, index: int, identity: Identity, genesis: Genesis) -> None:
        self.sim = sim
        self.index = index
        self.identity = identity
        self.peer_id = identity.peer_id
        self.genesis = genesis
        self.kv = MemoryKV()
        self.up = False
        self.incarnation = 0
        self.driver: ConsensusDriver | None = None
        self.crash_at_write: int | None = None  # crash before this many more writes (torn crash)
        self.state_synced_to = 0                 # the height a state sync brought it to (0: none)

    # ------------------------------------------------------------------ lifecycle
    async def boot(self, timeouts: TimeoutConfig, byzantine: bool, sync_from: list[Replica] | None = None) -> None:
        """Start from the replica's disk; with ``sync_from``, from an empty disk (only the signer
        state kept) by state sync from those replicas' stores, then block sync by the driver."""
        if sync_from is not None:
            self.kv.reopen()
            signer_state = self.kv.get(b"V/signer")   # the signer state is kept apart from the chain
            self.kv = MemoryKV()
        self.kv.reopen()
        self.kv.before_write = None
        storage = Storage.create(f"sim-node-{self.index}", self.kv, self.genesis)
        self.store = ChainStore(storage, retain_blocks=self.sim.cfg.retain_blocks)
        if sync_from is not None:
            if signer_state is not None:
                storage.save_signer_state(signer_state)
            trusted = self.store.committee_for(1, storage.load_ledger())
            _, report = state_sync(self.store, trusted, [StoreSource(f"node-{r.index}", r.store) for r in sync_from])
            self.sim.record_fault("state_sync", self.index)
            self.state_synced_to = report.height
        self.ledger = storage.load_ledger()
        signer = SignerGuard.restore(self.identity, storage.load_signer_state())
        height = self.ledger.height
        self.committee = self.store.committee_for(height + 1, self.ledger)
        self.prev_committee: ValidatorSet | None = None
        self.last_value_id = b""
        self.last_certificate = b""
        if height > 0:
            self.prev_committee = self.store.committee_for(height, self.ledger)
            self.last_value_id = value_id(self.store.block(height).encode())
            self.last_certificate = self.store.certificate_bytes(height) or b""
        self.mempool = Mempool(self.ledger)
        self.evidence: dict[bytes, bytes] = {}
        self.incarnation += 1
        self.up = True
        self.kv.before_write = self._before_write
        sim = self.sim
        core = TendermintCore(self.genesis.chain_id, signer, self._propose, self._is_valid, timeouts,
                              verifier=sim.verifier, value_proposer=self._block_proposer)
        endpoint = sim.net.endpoint(self.index, self.identity if byzantine else None, self.genesis.chain_id)
        self.driver = ConsensusDriver(
            None, core, peers=self._peers, persist=self._persist, commit=self._on_commit,
            get_block=self.store.stored_commit, on_evidence=self._on_evidence,
            network=endpoint, clock=sim.clock, gossip_interval=sim.gossip_interval, sync_delay=sim.sync_delay,
            propose_grace=self._propose_grace)
        await self.driver.start(height + 1, self.committee)

    def crash(self) -> None:
        """Power loss: the process and its memory are gone, unsynced writes with them."""
        if not self.up:
            return
        self.up = False
        self.crash_at_write = None
        self.sim.net.detach(self.index)
        self.kv.before_write = None
        self.kv.crash()
        driver, self.driver = self.driver, None
        if driver is not None:
            self.sim.spawn(driver.stop())

    def _before_write(self, ops) -> None:
        if self.crash_at_write is None:
            return
        self.crash_at_write -= 1
        if self.crash_at_write <= 0:
            self.sim.record_fault("torn_crash", self.index)
            self.crash()
            raise SimulatedCrash(f"node {self.index} crashed at a storage write")

    # ------------------------------------------------------------------ driver hooks
    def _peers(self) -> tuple[str, ...]:
        return self.committee.peer_ids

    async def _persist(self, state: bytes) -> None:
        self.store.storage.save_signer_state(state)

    def _on_evidence(self, evidence: Evidence) -> None:
        if len(self.evidence) < 64:
            self.evidence[evidence.evidence_id] = evidence.encode()
            self.sim.record_fault("evidence_seen", self.index)

    def _propose(self, height: int) -> bytes:
        self.sim.note_proposal(height)
        ledger, params = self.ledger, self.ledger.params
        evidence = list(self.evidence.values())
        budget = min(params.max_block_bytes, MAX_PROPOSAL_VALUE_BYTES - PROPOSAL_BYTES_HEADROOM)
        budget -= sum(map(len, evidence)) + len(self.last_certificate)
        txs = self.mempool.reap(budget, min(params.max_block_txs, MAX_BLOCK_TXS))
        block_time = max(self.sim.now_ms(), ledger.state.last_block_time_ms, self.genesis.genesis_time_ms)
        block = build_block(self.genesis.chain_id, height, block_time, ledger.last_block_hash, ledger.app_hash,
                            self.identity, ledger.beacon, txs, evidence, self.last_certificate)
        return block.encode()

    def _block_proposer(self, value: bytes) -> str | None:
        try:
            return Block.decode(value, MAX_PROPOSAL_VALUE_BYTES).header.proposer
        except BlockError:
            return None

    def _is_valid(self, height: int, value: bytes) -> bool:
        try:
            check_proposed_block(
                value, height, ledger=self.ledger, committee=self.committee, prev_committee=self.prev_committee,
                chain_id=self.genesis.chain_id, last_value_id=self.last_value_id, now_ms=self.sim.now_ms(),
                verifier=self.sim.verifier)
        except (BlockError, CertificateError):
            return False
        return True

    async def _on_commit(self, commit: Commit) -> ValidatorSet:
        block = Block.decode(commit.value, MAX_PROPOSAL_VALUE_BYTES)
        self.store.save_certificate(block.height, commit.certificate)
        result = self.ledger.apply_block(block, known_txs=self.mempool.known_txs)
        self.store.commit(block, result)
        self.mempool.update(r.tx_hash for r in result.receipts)
        next_committee = self.store.committee_for(block.height + 1, self.ledger)
        self.sim.checker.on_commit(self, block, commit, result)
        self.prev_committee, self.committee = self.committee, next_committee
        self.last_value_id = value_id(commit.value)
        self.last_certificate = encode_certificate(commit.certificate)
        included = set(block.evidence)
        self.evidence = {k: v for k, v in self.evidence.items() if v not in included}
        await self._pace(block.height + 1)
        return next_committee

    def _block_wait(self) -> float | None:
        """``ValidatorRole._block_wait``: the idle pace while nothing is in flight (docs/adr/0213)."""
        cfg = self.sim.cfg
        if cfg.idle_block_wait is not None and not self.ledger.busy:
            return cfg.idle_block_wait
        return cfg.empty_block_wait

    def _propose_grace(self, height: int) -> float:
        """``ValidatorRole._propose_grace``: round 0's proposer may wait that long for a transaction."""
        wait = self._block_wait()
        return 0.0 if wait is None or self.mempool.has_ready() else wait

    async def _pace(self, next_height: int) -> None:
        wait = self._block_wait()
        if wait is None or self.committee.proposer(next_height, 0) != self.peer_id:
            return
        clock = self.sim.clock
        deadline = clock.now() + wait
        while not self.mempool.has_ready() and clock.now() < deadline:
            await clock.sleep(min(0.01, deadline - clock.now()))

    # ------------------------------------------------------------------ transactions
    def submit(self, raw: bytes) -> bool:
        """The node's transaction entry (``mempool.add``); False if the mempool refused it."""
        if not self.up:
            return False
        try:
            self.mempool.add(raw)
        except TxError:
            return False
        return True

    @property
    def height(self) -> int:
        try:
            return self.store.storage.height
        except (AttributeError, StorageError):
            return 0
