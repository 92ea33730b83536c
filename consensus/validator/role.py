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
for blocks and applies those with valid certificates. A proposer with no ready transaction
(``Mempool.has_ready``) waits up to ``empty_block_wait`` for one before it proposes, so an idle
chain makes a few empty blocks a second instead of spinning.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
from consensus.validator.rpc_methods import parse_height, register_methods
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


class ValidatorRole(Role):
    name = "validator"

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.peer_id = node.peer_id
        self.settings = node.config["consensus"]
        self.genesis: Genesis | None = None
        self.store: ChainStore | None = None
        self.ledger: Ledger | None = None
        self.mempool: Mempool | None = None
        self.driver: ConsensusDriver | None = None
        self.gossip: TxGossip | None = None
        self.committee: ValidatorSet | None = None
        self.ready = asyncio.Event()
        self._prev_committee: ValidatorSet | None = None
        self._last_value_id: bytes = b""
        self._last_certificate: bytes = b""
        self._blocks: dict[bytes, Block] = {}
        self._evidence: dict[bytes, bytes] = {}
        self._pool_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="dekube-ledger")
        self._verify_pool = ThreadPoolExecutor(2, thread_name_prefix="dekube-verify")
        self._tx_arrived = asyncio.Event()
        self._submissions: list[tuple[bytes, asyncio.Future]] = []
        self._fatal: asyncio.Future | None = None
        self.last_commit_monotonic: float | None = None
        self._methods = register_methods(node.rpc, self)
        for topic in (NEW_HEADS, TASKS_TOPIC, TXS_TOPIC):
            node.hub.add_topic(topic)
        node.ledger.attach_local(self)
        node.status.add_section("consensus", self.status)
        node.add_json_get("/block", self._http_block)
        self.consensus_metrics = ConsensusMetrics(
            node.metrics, lambda: self.ledger.height if self.ledger is not None else 0,
            lambda: len(self.mempool) if self.mempool is not None else 0)

    # ------------------------------------------------------------------ role interface
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        try:
            if self.store is None:  # the node awaits prepare() first; a test may call run() alone
                await loop.run_in_executor(self._worker, self._open)
            self._add_genesis_addresses()
            self.gossip = TxGossip(self.node.host, self.peer_id, self._peers, self._admit_from_peers,
                                   members=self._is_member)
            await self.gossip.start()
            self.ready.set()  # ledger loaded: queries and submissions are served from here on
            await self._start_consensus()
            log.info("validator started", extra={"height": self.ledger.height, "chain_id": self.genesis.chain_id})
            follower = loop.create_task(self._follow())
            try:
                await self._fatal
            finally:
                follower.cancel()
        finally:
            if self.gossip is not None:
                await self.gossip.stop()
            if self.driver is not None:
                await self.driver.stop()
            await loop.run_in_executor(self._worker, self._close)
            self._worker.shutdown(wait=False)
            self._verify_pool.shutdown(wait=False)

    async def prepare(self) -> None:
        """Open and check the chain database before the node listens (docs/adr/0142)."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self._open)

    # ------------------------------------------------------------------ start and stop
    def _open(self) -> None:
        if self.node.home is None:
            raise ValidatorStartError("the validator role needs a node home directory")
        path = self.node.home / self.settings["genesis_file"]
        try:
            self.genesis = Genesis.from_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValidatorStartError(f"cannot read genesis {path}: {exc.strerror or exc} "
                                      f"(write one with 'dekube-node testnet up' or copy the chain's)") from None
        except GenesisError as exc:
            raise ValidatorStartError(f"genesis {path} is invalid: {exc}") from None
        if self.genesis.chain_id != self.settings["chain_id"]:
            raise ValidatorStartError(f"genesis {path} is for chain {self.genesis.chain_id!r} but [consensus] "
                                      f"chain_id is {self.settings['chain_id']!r}")
        self.node.data_dir.mkdir(parents=True, exist_ok=True)
        path = str(self.node.data_dir / "chain")
        try:
            storage = Storage.open(path, self.genesis)
        except StorageError as exc:
            raise database_error(path, exc) from None
        try:
            self._verify(storage)
        except StorageError as exc:
            storage.close()
            raise database_error(path, exc) from None
        self.store = ChainStore(storage)
        try:
            self.ledger = storage.load_ledger()
            self.signer = SignerGuard.restore(self.node.identity, storage.load_signer_state())
            height = self.ledger.height
            self.committee = self.store.committee_for(height + 1, self.ledger)
            if height > 0:
                self._prev_committee = self.store.committee_for(height, self.ledger)
                self._last_value_id = value_id(self.store.block(height).encode())
                self._last_certificate = self.store.certificate_bytes(height) or b""
        except StorageError as exc:
            storage.close()
            self.store = None
            raise database_error(path, exc) from None
        except SignerStateError as exc:
            storage.close()
            self.store = None
            raise ValidatorStartError(f"{storage.path}: {exc}") from None
        self.mempool = Mempool(self.ledger, max_txs=self.settings["mempool_max_txs"])
        self._protect_committee()

    def _protect_committee(self) -> None:
        """The committee's connections are never evicted for inbound newcomers (ADR 0145)."""
        if self.committee is not None:
            self.node.host.set_protected("committee", [p for p in self.committee.peer_ids if p != self.peer_id])

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
        if self.store is not None:
            self.store.storage.close()

    def _add_genesis_addresses(self) -> None:
        book = self.node.host.peerbook
        for v in self.genesis.validators:
            if v.peer_id == self.peer_id:
                continue
            for addr in v.listen_addrs:
                with contextlib.suppress(ValueError):
                    book.add_addrs(v.peer_id, [Multiaddr.parse(addr)])

    async def _start_consensus(self) -> None:
        s = self.settings
        propose, vote = s["timeout_propose"], s["timeout_vote"]
        timeouts = TimeoutConfig(propose=propose, propose_delta=propose / 2, prevote=vote, prevote_delta=vote / 2,
                                 precommit=vote, precommit_delta=vote / 2)
        core = TendermintCore(self.genesis.chain_id, self.signer, self._propose, self._is_valid, timeouts,
                              value_proposer=self._block_proposer)
        self.driver = ConsensusDriver(
            self.node.host, core, peers=self._peers, persist=self._persist_signer, commit=self._on_commit,
            get_block=self._stored_commit, on_evidence=self._on_evidence, on_failure=self._fail,
            members=self._is_member)
        await self.driver.start(self.ledger.height + 1, self.committee)

    def _fail(self, exc: BaseException) -> None:
        """A storage or execution failure: stop the node rather than diverge from the chain."""
        log.critical("validator failed: %s", exc)
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(exc)

    async def _follow(self) -> None:
        """Outside the committee nobody sends us votes, so the driver never sees that it is behind:
        ask a random committee member for the blocks from our height every ``FOLLOW_INTERVAL``
        (they arrive as sync frames and are applied by the driver after checking their certificate)."""
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            if self.peer_id in self.committee:
                continue
            peer = random.choice(self.committee.peer_ids)
            try:
                stream = await asyncio.wait_for(self.node.host.open_stream(peer, CONSENSUS_PROTOCOL), 3.0)
                await stream.write(frame(encode_sync_request(self.driver.height)))
                await stream.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # that member is unreachable; another is asked next time
                log.debug("sync request to %s failed: %s", peer, exc)

    # ------------------------------------------------------------------ driver hooks
    def _peers(self) -> tuple[str, ...]:
        return self.committee.peer_ids if self.committee is not None else ()

    def _is_member(self, peer: str) -> bool:
        """May ``peer`` send votes, proposals and tx gossip: a member of this height's or the last
        height's committee (a member one block behind or ahead still gets through)."""
        return any(c is not None and peer in c.peer_ids for c in (self.committee, self._prev_committee))

    async def _persist_signer(self, state: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.store.storage.save_signer_state, state)

    def _stored_commit(self, height: int) -> Commit | None:
        try:
            return self.store.stored_commit(height)
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
        ledger, params = self.ledger, self.ledger.params
        evidence = list(self._evidence.values())
        budget = min(params.max_block_bytes, MAX_PROPOSAL_VALUE_BYTES - PROPOSAL_BYTES_HEADROOM)
        budget -= sum(map(len, evidence)) + len(self._last_certificate)
        with self._pool_lock:
            txs = self.mempool.reap(budget, min(params.max_block_txs, self.settings["max_block_txs"]))
        block_time = max(now_ms(), ledger.state.last_block_time_ms, self.genesis.genesis_time_ms)
        block = build_block(self.genesis.chain_id, height, block_time, ledger.last_block_hash, ledger.app_hash,
                            self.node.identity, ledger.beacon, txs, evidence, self._last_certificate)
        raw = block.encode()
        self._remember(raw, block)
        return raw

    def _remember(self, raw: bytes, block: Block) -> None:
        if len(self._blocks) >= 16:
            self._blocks.pop(next(iter(self._blocks)))
        self._blocks[value_id(raw)] = block

    def _is_valid(self, height: int, value: bytes) -> bool:
        try:
            block = check_proposed_block(
                value, height, ledger=self.ledger, committee=self.committee, prev_committee=self._prev_committee,
                chain_id=self.genesis.chain_id, last_value_id=self._last_value_id, now_ms=now_ms())
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
        self._prev_committee, self.committee = self.committee, next_committee
        self._protect_committee()
        self._last_value_id = vid
        self._last_certificate = encode_certificate(commit.certificate)
        included = set(block.evidence)
        self._evidence = {k: v for k, v in self._evidence.items() if v not in included}
        self.last_commit_monotonic = time.monotonic()
        self.consensus_metrics.on_commit(block.height, commit.round, len(block.txs),
                                         [pid for pid, _ in self._prev_committee.items()],
                                         [vote.validator for vote in commit.certificate])
        self.node.hub.publish(NEW_HEADS, {**block.header.to_json(), "txs": len(block.txs),
                                          "next_app_hash": result.app_hash.hex()})
        for event in task_events(result):
            self.node.hub.publish(TASKS_TOPIC, event)
        for sender, receipt in receipts:
            self.node.hub.publish(TXS_TOPIC, receipt, key=sender)
        await self._pace(block.height + 1)
        return next_committee

    def _execute(self, block: Block, commit: Commit, want_txs: bool) -> tuple[BlockResult, ValidatorSet, list]:
        """Worker thread: store the certificate, execute and store the block, update the mempool;
        with ``want_txs``, also pair the receipts with their senders for the ``txs`` topic."""
        self.store.save_certificate(block.height, commit.certificate)
        with self._pool_lock:  # txs this node already decoded and checked are neither decoded nor verified again
            known = self.mempool.known_txs
        result = self.ledger.apply_block(block, executor=self._verify_pool, known_txs=known)
        self.store.storage.commit_block(block, result)
        with self._pool_lock:
            self.mempool.update(r.tx_hash for r in result.receipts)
        receipts = tx_events(result, block.txs, known) if want_txs else []
        return result, self.store.committee_for(block.height + 1, self.ledger), receipts

    async def _pace(self, next_height: int) -> None:
        """As the next proposer with nothing ready to propose, wait a little for a ready transaction
        (one held behind a nonce gap does not count: it cannot go in a block)."""
        if self.committee.proposer(next_height, 0) != self.peer_id:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings["empty_block_wait"]
        while not self.mempool.has_ready():
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
        storage = self.store.storage
        for raw in raws:
            try:
                with self._pool_lock:
                    tx = self.mempool.add(raw)
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
        if accepted:
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

    def require_ready(self) -> None:
        if not self.ready.is_set():
            raise ResourceUnavailable("the chain is still loading")

    def pending_nonce(self, address: str) -> int:
        with self._pool_lock:
            return self.mempool.pending_nonce(address)

    def is_catching_up(self) -> bool:
        driver = self.driver
        return driver is not None and getattr(driver, "_behind_since", None) is not None

    def status(self) -> dict[str, Any]:
        if not self.ready.is_set():
            return {"ready": False}
        core = self.driver.core
        connected = set(self.node.peers())
        return {
            "ready": True,
            "chain_id": self.genesis.chain_id,
            "height": self.ledger.height,
            "round": core.round,
            "step": core.step.name.lower(),
            "app_hash": self.ledger.app_hash.hex(),
            "last_block_hash": self.ledger.last_block_hash.hex(),
            "catching_up": self.is_catching_up(),
            "in_committee": self.peer_id in self.committee,
            "committee": len(self.committee),
            "committee_peers_connected": sum(1 for p in self.committee.peer_ids if p in connected),
            "mempool_txs": len(self.mempool),
            "seconds_since_commit": (None if self.last_commit_monotonic is None
                                     else round(time.monotonic() - self.last_commit_monotonic, 3)),
        }

    def block_json(self, height: int, full: bool = False) -> dict | None:
        """A stored block as JSON (header, tx hashes or decoded txs, evidence, certificates)."""
        block = self.store.block(height)
        if block is None:
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
        doc["commit"] = _votes_json(self.store.certificate_bytes(height) or b"")
        return doc

    async def _http_block(self, query: dict[str, str]) -> dict:
        self.require_ready()
        height = parse_height(query.get("height", "latest"), self.ledger.height)
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
