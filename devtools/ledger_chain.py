"""A ledger with in-process block production: every call makes blocks the way a node would
(build_block, apply_block, the ledger's invariants checked after each). The ledger tests and the
in-process verification lab (devtools/verification_lab.py) drive the real state machine with it."""
from __future__ import annotations

import hashlib

from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.state.answers import answer_commitment, vote_commitment
from consensus.state.audits import sealed
from consensus.state.ledger import Ledger
from consensus.tx import build_tx
from consensus.txcodes import TxCode
from node.identity import Identity

# Windows short enough for an unbonding period of 4 blocks (it must outlast every window, ADR 0188): for
# tests of unbonding itself.
QUICK_UNBONDING = dict(unbonding_period=4, evidence_max_age=2, serve_dispute_window=2, serve_referee_s=1,
                       audit_redraws=0, dispute_blocks=1, referee_rounds=1)


def ident(i: int) -> Identity:
    """A deterministic identity (seed = i as 32 big-endian bytes)."""
    return Identity.from_seed(i.to_bytes(32, "big"))


class Chain:
    """A ledger plus block production; each block's time is ``block_ms`` after the previous one's (task
    deadlines are block times, ADR 0187: a test sets the block rate it wants)."""

    def __init__(self, balances=None, validators=(0,), params=None, balance=1_000_000, chain_id="dekube-test",
                 block_ms=1000):
        self.chain_id = chain_id
        self.block_ms = block_ms
        self.proposer_identity = ident(validators[0]) if validators else ident(999)
        self.proposer = self.proposer_identity.peer_id
        if balances is None:
            balances = {ident(i).peer_id: balance for i in range(1, 10)}
        self.params = params or Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                       min_fee=0)
        self.genesis = Genesis(chain_id, 0, balances,
                               tuple(GenesisValidator(ident(v).peer_id, 10_000) for v in validators), self.params)
        self.ledger = Ledger.from_genesis(self.genesis)
        self.nonces: dict[str, int] = {}
        self.sealed: dict[tuple[bytes, int, str], tuple[Identity, dict]] = {}   # answers committed, to reveal

    def tx(self, who: Identity, tx_type: str, payload: dict, fee: int = 0, nonce: int | None = None):
        if nonce is None:
            nonce = self.nonces.get(who.peer_id, self.ledger.nonce(who.peer_id))
            self.nonces[who.peer_id] = nonce + 1
        return build_tx(who, self.chain_id, nonce, tx_type, payload, fee)

    def block(self, txs=(), evidence=(), last_commit=b""):
        led = self.ledger
        block = build_block(self.chain_id, led.height + 1, led.state.last_block_time_ms + self.block_ms,
                            led.last_block_hash,
                            led.app_hash, self.proposer_identity, led.beacon,
                            [t if isinstance(t, bytes) else t.raw for t in txs],
                            evidence, last_commit)
        result = led.apply_block(block)
        led.check_invariants()
        self.nonces.clear()
        return result

    def run(self, who: Identity, tx_type: str, payload: dict, fee: int = 0):
        """Execute one tx in its own block and return its receipt."""
        return self.block([self.tx(who, tx_type, payload, fee)]).receipts[0]

    def ok(self, who: Identity, tx_type: str, payload: dict, fee: int = 0):
        receipt = self.run(who, tx_type, payload, fee)
        if receipt.code != TxCode.OK:
            raise AssertionError(f"{tx_type} by {who.peer_id[:12]} failed: {receipt}")
        return receipt

    def empty_blocks(self, n: int):
        for _ in range(n):
            self.block()

    # ---- verifier answers: committed, then revealed (ADR 0202) ----------------------------------

    def seal(self, who: Identity, task_id: bytes, slot: int, match: bool, evidence: bytes, step: int):
        """``who``'s audit_commit for its answer (remembered for ``reveals``)."""
        blinding = hashlib.sha256(b"lab-blinding" + who.seed + task_id + slot.to_bytes(4, "big")).digest()
        answer = {"task_id": task_id, "slot": slot, "match": match, "evidence": evidence, "step": step,
                  "blinding": blinding}
        self.sealed[(task_id, slot, who.peer_id)] = (who, answer)
        commitment = answer_commitment(task_id, slot, who.peer_id, match, evidence, step, blinding)
        return self.tx(who, "audit_commit", {"task_id": task_id, "slot": slot, "commitment": commitment})

    def seal_vote(self, who: Identity, task_id: bytes, slot: int, match: bool, evidence: bytes):
        """``who``'s referee_commit for its vote (remembered for ``reveals``, ADR 0210)."""
        task = self.ledger.state.tasks.get(task_id)
        entries = task.slots[slot]["referees"] if task is not None and slot < len(task.slots) else []
        entry: dict = next((r for r in entries if r["referee"] == who.peer_id), {})   # none: the ledger refuses it
        blinding = hashlib.sha256(b"lab-vote-blinding" + who.seed + task_id + slot.to_bytes(4, "big")).digest()
        vote = {"task_id": task_id, "slot": slot, "match": match, "evidence": evidence, "blinding": blinding}
        self.sealed[(task_id, slot, who.peer_id)] = (who, vote)
        commitment = vote_commitment(task_id, slot, who.peer_id, entry.get("panel", 0), match, evidence, blinding)
        return self.tx(who, "referee_commit", {"task_id": task_id, "slot": slot, "commitment": commitment})

    def reveals(self, task_id: bytes):
        """The audit_result (reveal) of every answer sealed by ``seal``, and the referee_vote of every vote
        sealed by ``seal_vote``, whose slot's reveal window is open."""
        task = self.ledger.state.tasks[task_id]
        out = []
        for slot in task.slots:
            if slot["outcome"] != "pending":
                continue
            if slot.get("reveal_deadline"):
                for v in slot["verifiers"]:
                    held = self.sealed.get((task_id, slot["slot"], v["verifier"]))
                    if held is not None and sealed(v) and v["answer"] is None:
                        out.append(self.tx(held[0], "audit_result", held[1]))
            if slot.get("referee_reveal_deadline"):
                for r in slot["referees"]:
                    held = self.sealed.get((task_id, slot["slot"], r["referee"]))
                    if held is not None and sealed(r) and r["vote"] is None:
                        out.append(self.tx(held[0], "referee_vote", held[1]))
        return out

    def reveal_all(self, task_id: bytes):
        """Reveal, in one block, every sealed answer whose reveal window is open; the block's result."""
        txs = self.reveals(task_id)
        result = self.block(txs) if txs else None
        if result is not None:
            failed = [r for r in result.receipts if r.code != TxCode.OK]
            if failed:
                raise AssertionError(f"reveal failed: {failed}")
        return result
