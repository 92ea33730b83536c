"""The ledger state machine: genesis, transaction checks, block validation and execution.

``Ledger.apply_block`` runs one committed block: release matured unbonding, apply block
evidence, then each transaction (ante: signature, nonce, fee -- then the type's handler),
then assign workers to open tasks; one block before every ``epoch_length``-th it elects the next
committee and commits it in the app hash (the epoch's last block, certified by the outgoing
committee, carries that hash: a joining node follows committee changes from genesis, docs/adr/0216),
and at the epoch's last block it seats it and commits the whole state in the app hash
(consensus/state/snapshot.py); it returns receipts, events, the sorted change set for storage, the
new app hash and, at those heights, the next committee's proof or the state's snapshot chunks.
Execution is deterministic: identical blocks on identical states give identical results on every
replica.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

from consensus import beacon
from consensus.block import Block, BlockError
from consensus.committee import ValidatorSet
from consensus.encoding import encode
from consensus.genesis import Genesis
from consensus.state import accounts, answers, audits, liveness, nodes, relay, serve_disputes, serving, staking, tasks
from consensus.state.apphash import committee_app_hash, full_state_hash, genesis_app_hash, next_app_hash
from consensus.state.availability import apply_availability_response
from consensus.state.context import BlockContext
from consensus.state.evidence import apply_evidence_bytes, apply_evidence_tx
from consensus.state.records import NodeRecord, Task
from consensus.state.retention import end_block as retire_ended
from consensus.state.snapshot import Manifest, is_snapshot_height, make_manifest, split_chunks, state_root
from consensus.state.store import APP_HASH_KEY, NODE, STAKE, LedgerState
from consensus.state.supply import check_supply
from consensus.tx import Tx, decode_tx, public_key_for
from consensus.txcodes import TxCode, TxError

HANDLERS = {
    "transfer": accounts.apply_transfer,
    "bond": staking.apply_bond,
    "unbond": staking.apply_unbond,
    "register_node": nodes.apply_register_node,
    "submit_task": tasks.apply_submit_task,
    "cancel_task": tasks.apply_cancel_task,
    "stop_task": tasks.apply_stop_task,
    "reject_task": tasks.apply_reject_task,
    "commit_result": tasks.apply_commit_result,
    "commit_epoch": tasks.apply_commit_epoch,
    "audit_commit": answers.apply_audit_commit,
    "audit_result": answers.apply_audit_result,
    "dispute": audits.apply_dispute,
    "referee_commit": answers.apply_referee_commit,
    "referee_vote": answers.apply_referee_vote,
    "availability_response": apply_availability_response,
    "finalize": tasks.apply_finalize,
    "relay_receipt": relay.apply_relay_receipt,
    "serve_deposit": serving.apply_serve_deposit,
    "serve_unlock": serving.apply_serve_unlock,
    "serve_withdraw": serving.apply_serve_withdraw,
    "serve_receipt": serving.apply_serve_receipt,
    "serve_dispute": serve_disputes.apply_serve_dispute,
    "serve_referee_vote": serve_disputes.apply_serve_referee_vote,
    "evidence": apply_evidence_tx,
    "unjail": staking.apply_unjail,
}

VERIFY_CHUNK = 256


def task_json(task_id: bytes, task: Task, block_time_ms: int) -> dict:
    """A task as dkb_getTask shows it: its record, with ``result`` (hex) the current leader among the
    committers until finalize fixes it (ADR 0152), and ``block_time_ms``: the last block's time, which
    its deadlines (block times, ADR 0187) are measured against."""
    return {"task_id": task_id.hex(), **task.to_json(), "result": tasks.current_result(task).hex(),
            "block_time_ms": block_time_ms}


@dataclass(slots=True)
class TxReceipt:
    """The result of one transaction in a block. ``executed``: it passed the ante check, so its
    nonce was consumed and its fee paid (whatever its payload did); the same bytes can never
    execute again."""

    tx_hash: bytes
    height: int
    index: int
    code: TxCode
    log: str = ""
    fee_paid: int = 0
    executed: bool = False

    def to_obj(self) -> list:
        return [self.tx_hash, self.height, self.index, int(self.code), self.log, self.fee_paid, self.executed]

    @classmethod
    def from_obj(cls, obj: list) -> TxReceipt:
        tx_hash, height, index, code, log, fee_paid, executed = obj
        return cls(tx_hash, height, index, TxCode(code), log, fee_paid, executed)

    def to_json(self) -> dict:
        return {"tx_hash": self.tx_hash.hex(), "height": self.height, "index": self.index,
                "code": int(self.code), "status": self.code.name.lower(), "log": self.log,
                "fee_paid": self.fee_paid, "executed": self.executed}


@dataclass
class BlockResult:
    height: int
    block_hash: bytes
    app_hash: bytes                          # state after this block (goes in the next header)
    receipts: list[TxReceipt]
    events: list[dict]
    changes: list[tuple[bytes, bytes | None]] = field(repr=False)  # for Storage.commit_block
    snapshot: tuple[Manifest, list[bytes]] | None = field(default=None, repr=False)  # at snapshot heights
    # where this block elected a committee other than the sitting one: what a committee hop needs to
    # check this app hash ([next_app_hash, committee, state root or b""], docs/adr/0216)
    committee_proof: list | None = field(default=None, repr=False)


def verify_tx_signatures(txs: list[Tx], executor: Executor | None = None) -> list[bool]:
    """Signature validity of each tx; with an executor, chunks verify in parallel threads
    (libsodium releases the GIL)."""
    if executor is None or len(txs) <= VERIFY_CHUNK:
        return [tx.verify_signature() for tx in txs]
    chunks = [txs[i:i + VERIFY_CHUNK] for i in range(0, len(txs), VERIFY_CHUNK)]
    out: list[bool] = []
    for part in executor.map(lambda chunk: [tx.verify_signature() for tx in chunk], chunks):
        out.extend(part)
    return out


class Ledger:
    def __init__(self, genesis: Genesis, state: LedgerState):
        self.genesis = genesis
        self.params = genesis.params
        self.chain_id = genesis.chain_id
        self.state = state
        self._busy: bool | None = None   # work_in_flight after the last block (None: not computed yet)

    @classmethod
    def from_genesis(cls, genesis: Genesis) -> Ledger:
        state = LedgerState()
        for peer_id, amount in sorted(genesis.balances.items()):
            if amount:
                state.credit(peer_id, amount)
        for v in genesis.validators:
            state.stake(v.peer_id).bonded += v.stake
            state.touch(STAKE, v.peer_id)
            state.nodes[v.peer_id] = NodeRecord(["validator"], list(v.listen_addrs), [], {})
            state.touch(NODE, v.peer_id)
        staking.elect_committee(state, genesis.params, 1)
        if genesis.params.epoch_length == 1:   # height 1 ends the first epoch: its successor is elected now
            staking.elect_next_committee(state, genesis.params, 2)
        state.beacon = beacon.genesis_beacon(genesis.hash)
        state.touch_meta()
        state.take_changes()
        state.app_hash = genesis_app_hash(genesis.hash, full_state_hash(state.items()))
        check_supply(state, genesis.total_supply)
        return cls(genesis, state)

    # ---- chain position -------------------------------------------------------------------

    @property
    def height(self) -> int:
        return self.state.height

    @property
    def busy(self) -> bool:
        """Whether a task or a serving dispute is in flight (``tasks.work_in_flight``), as of the last
        block: a proposer keeps the fast block pace while one is (docs/adr/0213)."""
        if self._busy is None:
            self._busy = tasks.work_in_flight(self.state)
        return self._busy

    @property
    def app_hash(self) -> bytes:
        return self.state.app_hash

    @property
    def last_block_hash(self) -> bytes:
        return self.state.last_block_hash

    @property
    def beacon(self) -> bytes:
        """The random beacon after the last block: the next proposer's VRF input (ADR 0202)."""
        return self.state.beacon

    def storage_items(self) -> list[tuple[bytes, bytes]]:
        """The whole state as stored key/values (app hash included), e.g. for genesis."""
        return self.state.items() + [(APP_HASH_KEY, encode(self.state.app_hash))]

    # ---- transactions -----------------------------------------------------------------------

    def decode_tx(self, raw: bytes) -> Tx:
        return decode_tx(raw, max_bytes=self.params.max_tx_bytes, chain_id=self.chain_id)

    def check_tx(self, tx: Tx, verify_signature: bool = True) -> None:
        """Raise TxError unless ``tx`` could execute now as the sender's next transaction.

        (The mempool allows nonces ahead of the account; this is the strict check.)
        """
        if verify_signature and not tx.verify_signature():
            raise TxError(TxCode.BAD_SIGNATURE, "signature does not verify for the sender")
        accounts.check_nonce_and_fee(self.state, self.params, tx)

    # ---- blocks -----------------------------------------------------------------------------

    def validate_block(self, block: Block) -> bytes:
        """Raise BlockError unless ``block`` extends this ledger's chain (header, roots, limits, the
        proposer's beacon proof); return the block's beacon."""
        h = block.header
        if h.chain_id != self.chain_id:
            raise BlockError(f"block is for chain {h.chain_id!r}, not {self.chain_id!r}")
        if h.height != self.state.height + 1:
            raise BlockError(f"block height {h.height}, expected {self.state.height + 1}")
        if h.prev_hash != self.state.last_block_hash:
            raise BlockError("prev_hash does not match the last committed block")
        if h.app_hash != self.state.app_hash:
            raise BlockError("app_hash does not match the state after the previous block")
        floor = max(self.state.last_block_time_ms, self.genesis.genesis_time_ms)
        if h.time_ms < floor:
            raise BlockError(f"block time {h.time_ms} is before the previous block's {floor}")
        proposer_key = public_key_for(h.proposer)
        if proposer_key is None:
            raise BlockError("proposer is not a valid ed25519 peer ID")
        if len(block.txs) > self.params.max_block_txs:
            raise BlockError(f"{len(block.txs)} txs exceeds max_block_txs {self.params.max_block_txs}")
        if sum(map(len, block.txs)) + sum(map(len, block.evidence)) > self.params.max_block_bytes:
            raise BlockError("block exceeds max_block_bytes")
        block.check_roots()
        try:
            return beacon.verify(proposer_key, self.chain_id, h.height, self.state.beacon, h.beacon_proof)
        except beacon.BeaconError as exc:
            raise BlockError(str(exc)) from None

    def apply_block(self, block: Block, executor: Executor | None = None,
                    known_txs: Mapping[bytes, Tx] | None = None) -> BlockResult:
        """Validate and execute ``block``. ``known_txs``: tx hash -> Tx already decoded and
        signature-checked by this node (the mempool's ``known_txs``), so neither decoding nor
        verification is repeated for them; ``executor``: threads for the remaining signature checks."""
        block_beacon = self.validate_block(block)
        state, params = self.state, self.params
        h = block.header
        ctx = BlockContext(h.height, h.time_ms, h.proposer, block.hash, h.prev_hash, block_beacon)
        state.events = []
        staking.release_matured_unbonding(state, ctx.height)
        liveness.record_proposer_slots(state, params, ctx, block.last_commit)
        for raw in block.evidence:
            try:
                apply_evidence_bytes(state, params, ctx, self.chain_id, raw)
            except TxError as exc:
                state.events.append({"type": "evidence_rejected", "code": int(exc.code), "log": exc.message})

        receipts: list[TxReceipt | None] = [None] * len(block.txs)
        decoded: list[tuple[int, Tx]] = []
        to_verify: list[Tx] = []
        sha256 = hashlib.sha256
        for index, raw in enumerate(block.txs):
            if known_txs is not None:
                tx = known_txs.get(sha256(raw).digest())
                if tx is not None:
                    decoded.append((index, tx))
                    continue
            try:
                tx = self.decode_tx(raw)
            except TxError as exc:
                receipts[index] = TxReceipt(sha256(raw).digest(), ctx.height, index, exc.code, exc.message)
                continue
            decoded.append((index, tx))
            to_verify.append(tx)
        bad = {tx.hash for tx, ok in zip(to_verify, verify_tx_signatures(to_verify, executor)) if not ok}
        for index, tx in decoded:
            receipts[index] = self._execute(ctx, index, tx, tx.hash in bad)
        done = [receipt for receipt in receipts if receipt is not None]
        assert len(done) == len(receipts)   # every index is decoded or refused above

        tasks.end_block(state, params, ctx)
        serve_disputes.advance_disputes(state, params, ctx)
        retire_ended(state, params, ctx)   # ended tasks and old evidence leave the state (ADR 0215)
        self._busy = tasks.work_in_flight(state)
        if ctx.height % params.epoch_length == 0:
            staking.seat_next_committee(state, ctx.height + 1)
        elects = (ctx.height + 1) % params.epoch_length == 0
        if elects:
            staking.elect_next_committee(state, params, ctx.height + 2)
        state.height = ctx.height
        state.last_block_hash = block.hash
        state.last_block_time_ms = h.time_ms
        state.beacon = block_beacon
        state.touch_meta()
        changes = state.take_changes()
        state.app_hash = next_app_hash(h.app_hash, ctx.height, changes)
        proof = None
        if elects:   # the app hash commits the next committee
            proof = [state.app_hash, state.next_committee, b""]
            state.app_hash = committee_app_hash(state.app_hash, state.next_committee, ctx.height + 2)
        snapshot = None
        if is_snapshot_height(ctx.height, params.epoch_length):   # the app hash commits the whole state
            chunks = split_chunks(state.items())
            manifest = make_manifest(ctx.height, state.app_hash, chunks)
            state.app_hash = manifest.app_hash
            snapshot = (manifest, chunks)
            if proof is not None:
                proof[2] = state_root(list(manifest.chunk_hashes))
        if proof is not None and proof[1] == state.committee:
            proof = None   # the committee stays: no hop to record
        changes.append((APP_HASH_KEY, encode(state.app_hash)))
        events, state.events = state.events, []
        return BlockResult(ctx.height, block.hash, state.app_hash, done, events, changes, snapshot, proof)

    def _execute(self, ctx: BlockContext, index: int, tx: Tx, bad_signature: bool) -> TxReceipt:
        if bad_signature:
            return TxReceipt(tx.hash, ctx.height, index, TxCode.BAD_SIGNATURE, "signature does not verify")
        try:
            accounts.check_nonce_and_fee(self.state, self.params, tx)
        except TxError as exc:
            return TxReceipt(tx.hash, ctx.height, index, exc.code, exc.message)
        accounts.charge_fee_and_nonce(self.state, ctx, tx)
        try:
            HANDLERS[tx.type](self.state, self.params, ctx, tx)
        except TxError as exc:
            return TxReceipt(tx.hash, ctx.height, index, exc.code, exc.message, tx.fee, True)
        return TxReceipt(tx.hash, ctx.height, index, TxCode.OK, "", tx.fee, True)

    # ---- queries (JSON-friendly) -------------------------------------------------------------

    def balance(self, peer_id: str) -> int:
        acct = self.state.accounts.get(peer_id)
        return acct.balance if acct else 0

    def nonce(self, peer_id: str) -> int:
        acct = self.state.accounts.get(peer_id)
        return acct.nonce if acct else 0

    def stake_info(self, peer_id: str) -> dict:
        stake = self.state.stakes.get(peer_id)
        if stake is None:
            return {"bonded": 0, "unbonding": [], "slashed": 0, "jailed_until": 0, "missed": 0}
        return stake.to_json()

    def node_info(self, peer_id: str) -> dict | None:
        node = self.state.nodes.get(peer_id)
        return None if node is None else {"peer_id": peer_id, **node.to_json()}

    def task_info(self, task_id: bytes) -> dict | None:
        task = self.state.tasks.get(task_id)
        return None if task is None else task_json(task_id, task, self.state.last_block_time_ms)

    def list_tasks(self, status: str | None = None, owner: str | None = None, limit: int = 100) -> list[dict]:
        """Tasks in submission order (newest first), filtered by status and/or owner."""
        found = sorted(self.state.tasks.items(), key=lambda item: -item[1].seq)
        out = []
        for task_id, task in found:
            if (status is None or task.status == status) and (owner is None or task.owner == owner):
                out.append(task_json(task_id, task, self.state.last_block_time_ms))
                if len(out) >= limit:
                    break
        return out

    def validators(self) -> list[tuple[str, int]]:
        """Registered validators with at least min_validator_stake bonded, highest first."""
        return staking.validator_candidates(self.state, self.params)

    def validator_stakes(self) -> dict[str, int]:
        return dict(self.validators())

    def committee(self) -> ValidatorSet:
        """The committee that decides the next height (re-elected every epoch_length blocks)."""
        return ValidatorSet.of(self.state.committee, start_height=self.state.committee_start)

    def check_invariants(self) -> None:
        """Raise SupplyInvariantError if tokens were created or destroyed."""
        check_supply(self.state, self.genesis.total_supply)

    def full_state_hash(self) -> bytes:
        return full_state_hash(self.state.items())

