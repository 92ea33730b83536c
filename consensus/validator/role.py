"""The validator role: storage + ledger + mempool + SDBFT driver + transaction gossip in one node.

On start it opens the RocksDB in ``<home>/data/chain`` for the genesis in ``<home>/<genesis_file>``
(a corrupt or foreign database stops the node with a clear error), loads the ledger, restores the
double-sign guard and starts the ``ConsensusDriver`` at the next height with that height's
committee. As proposer it builds blocks from the mempool (and pending equivocation evidence); it
accepts a proposal only if the block extends its chain and carries a valid certificate of the
previous block. Each commit is executed and stored in one worker thread (signature checks in a
small pool, fsync'd RocksDB batch), after which the mempool is updated, ``newHeads``, the block's
task events (``tasks``) and receipts (``txs``, keyed by sender; consensus/ledger_events.py) are
published and the next committee is returned to the driver. The role is also the node's local
ledger (``call``): it attaches itself to ``node.ledger`` so the node's reads and transactions
stay in-process (docs/adr/0100). All ledger and mempool mutations happen in that
one worker thread; the event loop only reads (``_pool_lock`` guards its reads of the mempool).

A node whose key is not in the committee follows the chain (full node): it asks committee members
for blocks and applies those with valid certificates; one that starts with an empty database first
restores the committee's latest state snapshot (``/dekube/snapshots/1.0.0``, served by every
validator; docs/adr/0199) when there is one, so it replays only the blocks after it. A proposer
with no ready transaction (``Mempool.has_ready``) waits up to ``empty_block_wait`` for one before it
proposes while a task or serving dispute is in flight, and ``idle_block_wait`` when nothing is (an idle
chain makes an empty block every couple of seconds instead of a few a second; docs/adr/0213); every
validator adds that wait to its round-0 proposal timeout, and a transaction ends the wait at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from consensus.block import Block, BlockError, build_block
from consensus.committee import ValidatorSet
from consensus.driver import PROTOCOL as CONSENSUS_PROTOCOL
from consensus.driver import ConsensusDriver, encode_sync_request, frame
from consensus.genesis import Genesis, GenesisError
from consensus.ledger_events import TASKS_TOPIC, TXS_TOPIC, task_events, tx_events
from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, DoubleProposalEvidence, Evidence, value_id
from consensus.signer import SignerGuard, SignerStateError
from consensus.state.ledger import BlockResult, Ledger
from consensus.statesync import SnapshotSource, StateSyncError, StoreSource, left_behind, state_sync
from consensus.tendermint import Commit, TendermintCore, TimeoutConfig
from consensus.tx import decode_tx
from consensus.txcodes import TxCode, TxError
from consensus.txgossip import TxGossip
from consensus.validator.block_check import check_proposed_block
from consensus.validator.chainstore import (
    CertificateError,
    ChainStore,
    decode_certificate,
    encode_certificate,
)
from consensus.validator.mempool import Mempool
from consensus.validator.metrics import ConsensusMetrics
from consensus.validator.rpc_methods import LedgerMethods, parse_height
from consensus.validator.snapshot_wire import RemoteSource, SnapshotServer
from consensus.validator.storage import CorruptDatabase, ForeignDatabase, Storage, StorageError
from node.p2p.multiaddr import Multiaddr
from node.roles import Role, RoleStartError
from node.rpc.errors import MethodNotFound, ResourceNotFound, ResourceUnavailable

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

NEW_HEADS = "newHeads"
PROPOSAL_BYTES_HEADROOM = 64 * 1024
FOLLOW_INTERVAL = 0.5
STATE_SYNC_TIMEOUT = 5.0   # seconds per snapshot request to one peer
MAX_SYNC_SOURCES = 32       # peers state sync asks at most
RECOVERY_PROBES = 5        # committee members asked whether they still keep a restarted node's next block
LEFT_BEHIND_CHECK_S = 30.0   # a chain that has not moved this long here is checked for having left us behind


# start-up check of the chain database (docs/adr/0142): every key up to this size, else the recent blocks
FULL_VERIFY_MAX_BYTES = 512 << 20
RECENT_BLOCKS_VERIFIED = 1000


class ValidatorStartError(RoleStartError):
    """The validator cannot start (missing genesis, corrupt or foreign database, bad signer state)."""


def database_error(path: str, exc: StorageError) -> ValidatorStartError:
    """The one-line report of a chain database the validator cannot use, with what to do about it."""
    if isinstance(exc, CorruptDatabase):
        advice = ("restore it from a backup, or move it aside and restart the node to resync the chain "
                  "from the other validators")
    elif isinstance(exc, ForeignDatabase):
        advice = "check [consensus] chain_id and genesis_file, or move the database aside"
    else:
        advice = "stop the other process or fix the directory, then restart"
    detail = str(exc).removeprefix(f"{path}: ")
    return ValidatorStartError(f"cannot open the chain database at {path}: {detail}: {advice}")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ChainState:
    """What `prepare()` opens: the chain the role runs on, complete from then on (the committees and
    the last commit's value id and certificate move with each commit)."""

    genesis: Genesis
    store: ChainStore
    ledger: Ledger
    mempool: Mempool
    signer: SignerGuard
    committee: ValidatorSet
    prev_committee: ValidatorSet | None = None
    last_value_id: bytes = b""
    last_certificate: bytes = b""


class ValidatorRole(Role):
    name = "validator"

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.peer_id = node.peer_id
        self.settings = node.config["consensus"]
        self._chain: ChainState | None = None       # set by prepare()
        self.driver: ConsensusDriver | None = None
        self.gossip: TxGossip | None = None
        self._snapshots: SnapshotServer | None = None
        self.ready = asyncio.Event()
        self._blocks: dict[bytes, Block] = {}
        self._evidence: dict[bytes, bytes] = {}
        self._pool_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="dekube-ledger")
        self._verify_pool = ThreadPoolExecutor(2, thread_name_prefix="dekube-verify")
        self._tx_arrived = asyncio.Event()
        self._submissions: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._fatal: asyncio.Future[None] | None = None
        self.last_commit_monotonic: float | None = None
        self._methods = LedgerMethods(self).register(node.rpc)
        for topic in (NEW_HEADS, TASKS_TOPIC, TXS_TOPIC):
            node.hub.add_topic(topic)
        node.ledger.attach_local(self)
        node.status.add_section("consensus", self.status)
        node.add_json_get("/block", self._http_block)
        self.consensus_metrics = ConsensusMetrics(
            node.metrics, lambda: self._chain.ledger.height if self._chain is not None else 0,
            lambda: len(self._chain.mempool) if self._chain is not None else 0)

    # ------------------------------------------------------------------ the chain, once prepared
    @property
    def chain(self) -> ChainState:
        """The chain state `prepare()` opened; ResourceUnavailable before."""
        if self._chain is None:
            raise ResourceUnavailable("the chain is still loading")
        return self._chain

    @property
    def genesis(self) -> Genesis:
        return self.chain.genesis

    @property
    def store(self) -> ChainStore:
        return self.chain.store

    @property
    def ledger(self) -> Ledger:
        return self.chain.ledger

    @property
    def mempool(self) -> Mempool:
        return self.chain.mempool

    @property
    def committee(self) -> ValidatorSet:
        return self.chain.committee

    # ------------------------------------------------------------------ role interface
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        try:
            # the node awaits prepare() first; a test may call run() alone
            chain = self._chain if self._chain is not None else await self.prepare()
            self._add_genesis_addresses(chain.genesis)
            self._snapshots = SnapshotServer(self.node.host, chain.store)
            self._snapshots.start()
            if self.settings["state_sync"] and chain.ledger.height == 0 and self.peer_id not in chain.committee:
                await self._state_sync()
            elif self.settings["state_sync"] and chain.ledger.height > 0:
                await self._recover_if_left_behind()
            self.gossip = TxGossip(self.node.host, self.peer_id, self._peers, self._admit_from_peers,
                                   members=self._is_member)
            await self.gossip.start()
            self.ready.set()  # ledger loaded: queries and submissions are served from here on
            while True:
                chain = self.chain
                driver = await self._start_consensus(chain)
                log.info("validator started", extra={"height": chain.ledger.height,
                                                     "chain_id": chain.genesis.chain_id})
                follower = loop.create_task(self._follow(driver))
                watchdog = loop.create_task(self._watch_progress(driver))
                try:
                    waiters: list[asyncio.Future[Any]] = [self._fatal, watchdog]
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                    if self._fatal.done():
                        self._fatal.result()   # raises the failure
                        return
                finally:
                    follower.cancel()
                    watchdog.cancel()
                # left behind while running (docs/adr/0214): stop consensus, join from a snapshot, start again
                await driver.stop()
                self.driver = None
                await self._recover_if_left_behind(watchdog.result())
        finally:
            if self._snapshots is not None:
                self._snapshots.stop()
            if self.gossip is not None:
                await self.gossip.stop()
            if self.driver is not None:
                await self.driver.stop()
            await loop.run_in_executor(self._worker, self._close)
            self._worker.shutdown(wait=False)
            self._verify_pool.shutdown(wait=False)

    async def prepare(self) -> ChainState:
        """Open and check the chain database before the node listens (docs/adr/0142); the chain state."""
        self._chain = await asyncio.get_running_loop().run_in_executor(self._worker, self._open)
        self._protect_committee()
        return self._chain

    # ------------------------------------------------------------------ start and stop
    def _open(self) -> ChainState:
        """Worker thread: read the genesis, open and verify the database, load the ledger and signer."""
        home, data_dir = self.node.home, self.node.data_dir
        if home is None or data_dir is None:
            raise ValidatorStartError("the validator role needs a node home directory")
        path = home / self.settings["genesis_file"]
        try:
            genesis = Genesis.from_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValidatorStartError(f"cannot read genesis {path}: {exc.strerror or exc} "
                                      f"(write one with 'dekube-node testnet up' or copy the chain's)") from None
        except GenesisError as exc:
            raise ValidatorStartError(f"genesis {path} is invalid: {exc}") from None
        if genesis.chain_id != self.settings["chain_id"]:
            raise ValidatorStartError(f"genesis {path} is for chain {genesis.chain_id!r} but [consensus] "
                                      f"chain_id is {self.settings['chain_id']!r}")
        data_dir.mkdir(parents=True, exist_ok=True)
        db_path = str(data_dir / "chain")
        try:
            storage = Storage.open(db_path, genesis)
        except StorageError as exc:
            raise database_error(db_path, exc) from None
        try:
            self._verify(storage)
        except StorageError as exc:
            storage.close()
            raise database_error(db_path, exc) from None
        store = ChainStore(storage, retain_blocks=self.settings["retain_blocks"])
        try:
            ledger = storage.load_ledger()
            signer = SignerGuard.restore(self.node.identity, storage.load_signer_state())
            height = ledger.height
            chain = ChainState(genesis, store, ledger, Mempool(ledger, max_txs=self.settings["mempool_max_txs"]),
                               signer, store.committee_for(height + 1, ledger))
            if height > 0:
                last = store.block(height)
                if last is None:
                    raise StorageError(f"{db_path}: block {height} is missing")
                chain.prev_committee = store.committee_for(height, ledger)
                chain.last_value_id = value_id(last.encode())
                chain.last_certificate = store.certificate_bytes(height) or b""
        except StorageError as exc:
            storage.close()
            raise database_error(db_path, exc) from None
        except SignerStateError as exc:
            storage.close()
            raise ValidatorStartError(f"{storage.path}: {exc}") from None
        return chain

    def _protect_committee(self) -> None:
        """The committee's connections are never evicted for inbound newcomers (ADR 0145)."""
        committee = self.chain.committee
        self.node.host.set_protected("committee", [p for p in committee.peer_ids if p != self.peer_id])

    def _verify(self, storage: Storage) -> None:
        """Read back the database so that RocksDB checks its checksums: all of it when
        [consensus] verify_db is "full", or "auto" and the database is at most 512 MiB; else the
        metadata, state, WAL, signer state and the last 1000 blocks."""
        mode = self.settings["verify_db"]
        size = storage.size_bytes()
        full = mode == "full" or (mode == "auto" and size <= FULL_VERIFY_MAX_BYTES)
        started = time.monotonic()
        storage.verify(None if full else RECENT_BLOCKS_VERIFIED)
        log.info("chain database verified", extra={
            "height": storage.height, "scope": "all" if full else f"last {RECENT_BLOCKS_VERIFIED} blocks",
            "mib": round(size / 2**20, 1), "seconds": round(time.monotonic() - started, 3)})

    def _close(self) -> None:
        if self._chain is not None:
            self._chain.store.storage.close()

    def _add_genesis_addresses(self, genesis: Genesis) -> None:
        book = self.node.host.peerbook
        for v in genesis.validators:
            if v.peer_id == self.peer_id:
                continue
            for addr in v.listen_addrs:
                with contextlib.suppress(ValueError):
                    book.add_addrs(v.peer_id, [Multiaddr.parse(addr)])

    async def _start_consensus(self, chain: ChainState) -> ConsensusDriver:
        s = self.settings
        propose, vote = s["timeout_propose"], s["timeout_vote"]
        timeouts = TimeoutConfig(propose=propose, propose_delta=propose / 2, prevote=vote, prevote_delta=vote / 2,
                                 precommit=vote, precommit_delta=vote / 2)
        core = TendermintCore(chain.genesis.chain_id, chain.signer, self._propose, self._is_valid, timeouts,
                              value_proposer=self._block_proposer)
        self.driver = driver = ConsensusDriver(
            self.node.host, core, peers=self._peers, persist=self._persist_signer, commit=self._on_commit,
            get_block=self._stored_commit, on_evidence=self._on_evidence, on_failure=self._fail,
            members=self._is_member, propose_grace=self._propose_grace)
        await driver.start(chain.ledger.height + 1, chain.committee)
        return driver

    async def _state_sync(self) -> None:
        """A node outside the committee with an empty database starts from the committee's latest
        state snapshot (checked against the genesis committee's signatures, docs/adr/0199); with no
        usable snapshot it block-syncs from height 1."""
        loop = asyncio.get_running_loop()
        # the committee it knows, then the peers it is connected to (the genesis committee may have left)
        known = list(self.committee.peer_ids) + [p for p in self.node.peers() if p not in self.committee]
        sources = self._snapshot_sources([p for p in known if p != self.peer_id][:MAX_SYNC_SOURCES])
        started = time.monotonic()
        try:
            ledger, report = await loop.run_in_executor(self._worker, state_sync, self.store, self.committee, sources)
        except StateSyncError as exc:
            log.info("no state sync, block sync from height 1: %s", exc)
            return
        await loop.run_in_executor(self._worker, self._adopt, ledger)
        log.info("state synced", extra={"height": report.height, "chunks": report.chunks, "hops": report.hops,
                                        "mib": round(report.state_bytes / 2**20, 2), "rejected": report.rejected,
                                        "seconds": round(time.monotonic() - started, 3)})

    async def _probe_left_behind(self) -> int | None:
        """The snapshot to join from when no committee member asked (up to ``RECOVERY_PROBES``) still
        keeps this node's next block and one offers a snapshot past it; else None."""
        peers = [p for p in self.committee.peer_ids if p != self.peer_id]
        sources = self._snapshot_sources(random.sample(peers, min(RECOVERY_PROBES, len(peers))))
        # network requests only: not on the ledger worker, which must stay free to execute blocks
        found: int | None = await asyncio.get_running_loop().run_in_executor(
            None, left_behind, sources, self.committee, self.chain.genesis.chain_id, self.chain.ledger.height + 1)
        return found

    def _snapshot_sources(self, peers: list[str]) -> list[SnapshotSource]:
        """``peers`` as snapshot sources, bridged to this event loop for a worker thread."""
        loop = asyncio.get_running_loop()
        return [RemoteSource(self.node.host, p, loop, STATE_SYNC_TIMEOUT) for p in peers]

    async def _watch_progress(self, driver: ConsensusDriver) -> int:
        """Return the snapshot to join from once the chain has not moved for ``LEFT_BEHIND_CHECK_S`` and
        the peers no longer keep our next block (a node cut off for longer than their retention)."""
        height, since = driver.height, time.monotonic()
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            if driver.height != height:
                height, since = driver.height, time.monotonic()
            elif time.monotonic() - since >= LEFT_BEHIND_CHECK_S:
                try:
                    snapshot = await self._probe_left_behind()
                except Exception as exc:  # a failed probe is no verdict: ask again later
                    log.warning("checking whether the peers left us behind failed: %s", exc)
                    snapshot = None
                if snapshot is not None:
                    return snapshot
                since = time.monotonic()

    async def _recover_if_left_behind(self, snapshot: int | None = None) -> None:
        """A node that was away longer than its peers keep blocks (``retain_blocks``) cannot block-sync:
        no peer serves its next block. When the committee members asked all lack it and one offers a
        snapshot past it, the node sets its database aside and joins from that snapshot (docs/adr/0214).
        Heights it signed before all lie below the snapshot, so it cannot double-sign."""
        loop = asyncio.get_running_loop()
        if snapshot is None:
            snapshot = await self._probe_left_behind()
        if snapshot is None:
            return
        height = self.chain.ledger.height
        log.warning("left behind: no peer keeps block %d any more; joining from the snapshot at %d", height + 1,
                    snapshot, extra={"height": height, "snapshot": snapshot})
        self._chain = await loop.run_in_executor(self._worker, self._set_aside_and_reopen, height)
        if self._snapshots is not None:
            self._snapshots.source = StoreSource("self", self._chain.store)
        await self._state_sync()

    def _set_aside_and_reopen(self, height: int) -> ChainState:
        """Worker thread: close the database, move it aside (``chain.left-behind-<height>``, removed once the
        new one is open), open a fresh one for the genesis."""
        assert self.node.data_dir is not None
        self.chain.store.storage.close()
        path = self.node.data_dir / "chain"
        aside = path.with_name(f"chain.left-behind-{height}")
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
        chain = self._open()
        shutil.rmtree(aside, ignore_errors=True)
        return chain

    def _adopt(self, ledger: Ledger) -> None:
        """Worker thread: run from a ledger state sync restored."""
        chain, height = self.chain, ledger.height
        last = chain.store.block(height)
        if last is None:
            raise StorageError(f"state sync stored no block {height}")
        chain.ledger = ledger
        chain.committee = chain.store.committee_for(height + 1, ledger)
        chain.prev_committee = chain.store.committee_for(height, ledger)
        chain.last_value_id = value_id(last.encode())
        chain.last_certificate = chain.store.certificate_bytes(height) or b""
        chain.mempool = Mempool(ledger, max_txs=self.settings["mempool_max_txs"])

    def _fail(self, exc: BaseException) -> None:
        """A storage or execution failure: stop the node rather than diverge from the chain."""
        log.critical("validator failed: %s", exc)
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(exc)

    async def _follow(self, driver: ConsensusDriver) -> None:
        """Outside the committee nobody sends us votes, so the driver never sees that it is behind:
        ask a random committee member for the blocks from our height every ``FOLLOW_INTERVAL``
        (they arrive as sync frames and are applied by the driver after checking their certificate)."""
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            committee = self.chain.committee
            if self.peer_id in committee:
                continue
            peer = random.choice(committee.peer_ids)
            try:
                stream = await asyncio.wait_for(self.node.host.open_stream(peer, CONSENSUS_PROTOCOL), 3.0)
                await stream.write(frame(encode_sync_request(driver.height)))
                await stream.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # that member is unreachable; another is asked next time
                log.debug("sync request to %s failed: %s", peer, exc)

    # ------------------------------------------------------------------ driver hooks
    def _peers(self) -> tuple[str, ...]:
        return self._chain.committee.peer_ids if self._chain is not None else ()

    def _is_member(self, peer: str) -> bool:
        """May ``peer`` send votes, proposals and tx gossip: a member of this height's or the last
        height's committee (a member one block behind or ahead still gets through)."""
        chain = self._chain
        return chain is not None and any(c is not None and peer in c.peer_ids
                                         for c in (chain.committee, chain.prev_committee))

    async def _persist_signer(self, state: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.chain.store.storage.save_signer_state, state)

    def _stored_commit(self, height: int) -> Commit | None:
        try:
            return self.chain.store.stored_commit(height)
        except StorageError as exc:
            log.error("cannot serve block %d to a syncing peer: %s", height, exc)
            return None

    def _on_evidence(self, evidence: Evidence) -> None:
        if len(self._evidence) < 64:
            raw = evidence.encode()
            self._evidence[evidence.evidence_id] = raw
            kind = "proposal" if isinstance(evidence, DoubleProposalEvidence) else "vote"
            log.warning("double %s by %s at height %d", kind, evidence.validator, evidence.height)

    def _propose(self, height: int) -> bytes:
        chain = self.chain
        ledger, params = chain.ledger, chain.ledger.params
        evidence = list(self._evidence.values())
        budget = min(params.max_block_bytes, MAX_PROPOSAL_VALUE_BYTES - PROPOSAL_BYTES_HEADROOM)
        budget -= sum(map(len, evidence)) + len(chain.last_certificate)
        with self._pool_lock:
            txs = chain.mempool.reap(budget, min(params.max_block_txs, self.settings["max_block_txs"]))
        block_time = max(now_ms(), ledger.state.last_block_time_ms, chain.genesis.genesis_time_ms)
        block = build_block(chain.genesis.chain_id, height, block_time, ledger.last_block_hash, ledger.app_hash,
                            self.node.identity, ledger.beacon, txs, evidence, chain.last_certificate)
        raw = block.encode()
        self._remember(raw, block)
        return raw

    def _remember(self, raw: bytes, block: Block) -> None:
        if len(self._blocks) >= 16:
            self._blocks.pop(next(iter(self._blocks)))
        self._blocks[value_id(raw)] = block

    def _is_valid(self, height: int, value: bytes) -> bool:
        chain = self.chain
        try:
            block = check_proposed_block(
                value, height, ledger=chain.ledger, committee=chain.committee, prev_committee=chain.prev_committee,
                chain_id=chain.genesis.chain_id, last_value_id=chain.last_value_id, now_ms=now_ms())
        except (BlockError, CertificateError) as exc:
            log.info("rejecting proposed block at height %d: %s", height, exc)
            return False
        self._remember(value, block)
        return True

    def _block_proposer(self, value: bytes) -> str | None:
        """The proposer a proposed block names (the core requires a fresh proposal's block to name
        its signer, the round's proposer; ``_is_valid`` only checks committee membership, which is
        all a re-proposed block from an earlier round can be held to)."""
        block = self._blocks.get(value_id(value))
        if block is None:
            try:
                block = Block.decode(value, MAX_PROPOSAL_VALUE_BYTES)
            except BlockError:
                return None
        return block.header.proposer

    async def _on_commit(self, commit: Commit) -> ValidatorSet:
        vid = value_id(commit.value)
        block = self._blocks.pop(vid, None) or Block.decode(commit.value, MAX_PROPOSAL_VALUE_BYTES)
        loop = asyncio.get_running_loop()
        want_txs = self.node.hub.has_subscribers(TXS_TOPIC)
        try:
            result, next_committee, receipts = await loop.run_in_executor(
                self._worker, self._execute, block, commit, want_txs)
        except Exception as exc:
            self._fail(exc)
            raise
        self._blocks.clear()
        chain = self.chain
        previous = chain.committee
        chain.prev_committee, chain.committee = previous, next_committee
        self._protect_committee()
        chain.last_value_id = vid
        chain.last_certificate = encode_certificate(commit.certificate)
        included = set(block.evidence)
        self._evidence = {k: v for k, v in self._evidence.items() if v not in included}
        self.last_commit_monotonic = time.monotonic()
        self.consensus_metrics.on_commit(block.height, commit.round, len(block.txs),
                                         [pid for pid, _ in previous.items()],
                                         [vote.validator for vote in commit.certificate])
        self.node.hub.publish(NEW_HEADS, {**block.header.to_json(), "txs": len(block.txs),
                                          "next_app_hash": result.app_hash.hex()})
        for event in task_events(result):
            self.node.hub.publish(TASKS_TOPIC, event)
        for sender, receipt in receipts:
            self.node.hub.publish(TXS_TOPIC, receipt, key=sender)
        await self._pace(block.height + 1)
        return next_committee

    def _execute(self, block: Block, commit: Commit,
                 want_txs: bool) -> tuple[BlockResult, ValidatorSet, list[tuple[str, dict[str, Any]]]]:
        """Worker thread: store the certificate, execute and store the block, update the mempool;
        with ``want_txs``, also pair the receipts with their senders for the ``txs`` topic."""
        store, ledger, mempool = self.chain.store, self.chain.ledger, self.chain.mempool
        store.save_certificate(block.height, commit.certificate)
        with self._pool_lock:  # txs this node already decoded and checked are neither decoded nor verified again
            known = mempool.known_txs
        result = ledger.apply_block(block, executor=self._verify_pool, known_txs=known)
        store.commit(block, result)
        with self._pool_lock:
            mempool.update(r.tx_hash for r in result.receipts)
        receipts = tx_events(result, list(block.txs), known) if want_txs else []
        return result, store.committee_for(block.height + 1, ledger), receipts

    def _block_wait(self) -> float:
        """How long a proposer with nothing ready waits before an empty block: ``empty_block_wait`` while
        a task or serving dispute is in flight (its deadlines and draws need blocks), ``idle_block_wait``
        on an idle chain (docs/adr/0213)."""
        return self.settings["empty_block_wait" if self.chain.ledger.busy else "idle_block_wait"]

    def _propose_grace(self, height: int) -> float:
        """Extra time every validator gives round 0's proposer of ``height``: the wait it may take for a
        transaction (none when one is ready here: the proposer has it too, gossip permitting)."""
        return 0.0 if self.chain.mempool.has_ready() else self._block_wait()

    async def _pace(self, next_height: int) -> None:
        """As the next proposer with nothing ready to propose, wait a little for a ready transaction
        (one held behind a nonce gap does not count: it cannot go in a block)."""
        chain = self.chain
        if chain.committee.proposer(next_height, 0) != self.peer_id:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._block_wait()
        while not chain.mempool.has_ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._tx_arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._tx_arrived.wait(), remaining)

    # ------------------------------------------------------------------ transactions
    def _admit_batch(self, raws: list[bytes], check_committed: bool) -> list[Any]:
        """Worker thread: add each raw tx to the mempool; a Tx or the TxError per input. The lock is
        taken per transaction, so the event loop never waits for a whole batch."""
        out: list[Any] = []
        storage, mempool = self.chain.store.storage, self.chain.mempool
        for raw in raws:
            try:
                with self._pool_lock:
                    tx = mempool.add(raw)
            except TxError as exc:
                if check_committed and exc.code == TxCode.NONCE_TOO_LOW:
                    exc = self._committed_error(storage, raw) or exc
                out.append(exc)
            else:
                out.append(tx)
        return out

    async def read_state(self, fn, *args):
        """Run ``fn(*args)`` in the worker thread, for reads that iterate the ledger state (which the
        worker mutates while executing a block)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    @staticmethod
    def _committed_error(storage: Storage, raw: bytes) -> TxError | None:
        receipt = storage.receipt(hashlib.sha256(raw).digest())
        if receipt is None:
            return None
        return TxError(TxCode.ALREADY_KNOWN, f"transaction already committed in block {receipt.height}")

    async def submit(self, raw: bytes):
        """Admit one client transaction; returns the Tx or raises TxError. Accepted ones are gossiped.

        Submissions arriving in the same event-loop iteration (e.g. a JSON-RPC batch) are admitted
        by one job of the worker thread."""
        if not self.ready.is_set():
            raise ResourceUnavailable("the chain is still loading")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._submissions:
            loop.call_soon(self._flush_submissions)
        self._submissions.append((raw, future))
        result = await future
        if isinstance(result, TxError):
            raise result
        return result

    def _flush_submissions(self) -> None:
        batch, self._submissions = self._submissions, []
        job = asyncio.get_running_loop().run_in_executor(self._worker, self._admit_batch, [r for r, _ in batch], True)
        job.add_done_callback(lambda done: self._submissions_admitted(batch, done))

    def _submissions_admitted(self, batch, done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None:
            error = done.exception() if not done.cancelled() else asyncio.CancelledError()
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        accepted = []
        for (raw, future), result in zip(batch, done.result()):
            if not isinstance(result, TxError):
                accepted.append(raw)
            if not future.done():
                future.set_result(result)
        if accepted and self.gossip is not None:
            self.gossip.broadcast(accepted)
            self._tx_arrived.set()

    async def _admit_from_peers(self, raws: list[bytes]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._worker, self._admit_batch, raws, False)
        self._tx_arrived.set()

    # ------------------------------------------------------------------ queries
    async def call(self, method: str, *params: Any) -> Any:
        """The ``dkb_*`` ledger method ``method`` answered in-process (the node's LocalLedger)."""
        fn = self._methods.get(method)
        if fn is None:
            raise MethodNotFound(f"Method not found: {method}")
        return await fn(*params)

    def require_ready(self) -> ChainState:
        """The chain state once queries are served; ResourceUnavailable while it loads."""
        if not self.ready.is_set():
            raise ResourceUnavailable("the chain is still loading")
        return self.chain

    def pending_nonce(self, address: str) -> int:
        with self._pool_lock:
            return self.chain.mempool.pending_nonce(address)

    def is_catching_up(self) -> bool:
        driver = self.driver
        return driver is not None and getattr(driver, "_behind_since", None) is not None

    def status(self) -> dict[str, Any]:
        if not self.ready.is_set() or self.driver is None:
            return {"ready": False}
        chain, core = self.chain, self.driver.core
        connected = set(self.node.peers())
        return {
            "ready": True,
            "chain_id": chain.genesis.chain_id,
            "height": chain.ledger.height,
            "round": core.round,
            "step": core.step.name.lower(),
            "app_hash": chain.ledger.app_hash.hex(),
            "last_block_hash": chain.ledger.last_block_hash.hex(),
            "catching_up": self.is_catching_up(),
            "in_committee": self.peer_id in chain.committee,
            "committee": len(chain.committee),
            "committee_peers_connected": sum(1 for p in chain.committee.peer_ids if p in connected),
            "mempool_txs": len(chain.mempool),
            "seconds_since_commit": (None if self.last_commit_monotonic is None
                                     else round(time.monotonic() - self.last_commit_monotonic, 3)),
        }

    def block_json(self, height: int, full: bool = False) -> dict | None:
        """A stored block as JSON (header, tx hashes or decoded txs, evidence, certificates); None if
        there is no such block yet; ResourceNotFound naming the first kept block if it was pruned."""
        store = self.chain.store
        block = store.block(height)
        if block is None:
            storage = store.storage
            if storage.is_pruned(height):
                raise ResourceNotFound(
                    f"block {height} is pruned: this node keeps blocks {storage.base}..{storage.height} "
                    f"([consensus] retain_blocks = {self.store.retain_blocks})",
                    data={"pruned": True, "first_block": storage.base})
            return None
        doc = block.header.to_json()
        if full:
            txs = []
            for raw in block.txs:
                try:
                    txs.append(decode_tx(raw, max_bytes=len(raw)).to_json())
                except TxError as exc:
                    txs.append({"hash": hashlib.sha256(raw).hexdigest(), "error": exc.message})
            doc["transactions"] = txs
        else:
            doc["transactions"] = [hashlib.sha256(raw).hexdigest() for raw in block.txs]
        doc["evidence"] = [raw.hex() for raw in block.evidence]
        doc["last_commit"] = _votes_json(block.last_commit)
        doc["commit"] = _votes_json(store.certificate_bytes(height) or b"")
        return doc

    async def _http_block(self, query: Mapping[str, str]) -> dict[str, Any]:
        chain = self.require_ready()
        height = parse_height(query.get("height", "latest"), chain.ledger.height)
        doc = await asyncio.get_running_loop().run_in_executor(None, self.block_json, height, False)
        if doc is None:
            raise ResourceNotFound(f"no block at height {height}")
        return doc


def _votes_json(certificate: bytes) -> list[dict]:
    if not certificate:
        return []
    try:
        votes = decode_certificate(certificate)
    except CertificateError:
        return [{"error": "undecodable certificate"}]
    return [{"type": vote.type.name.lower(), "height": vote.height, "round": vote.round,
             "value_id": vote.value_id.hex(), "validator": vote.validator, "signature": vote.signature.hex()}
            for vote in votes]
