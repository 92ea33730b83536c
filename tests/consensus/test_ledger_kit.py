"""Shared helpers for the ledger tests: deterministic identities and a one-node test chain."""
from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.state.ledger import Ledger
from consensus.tx import build_tx
from consensus.txcodes import TxCode
from node.identity import Identity

CHAIN = "dekube-test"


def ident(i: int) -> Identity:
    return Identity.from_seed(i.to_bytes(32, "big"))


class Chain:
    """A ledger plus block production: every helper call makes blocks the way a node would."""

    def __init__(self, balances=None, validators=(0,), params=None, balance=1_000_000):
        self.proposer = ident(validators[0]).peer_id if validators else ident(999).peer_id
        if balances is None:
            balances = {ident(i).peer_id: balance for i in range(1, 10)}
        # audits_per_worker=0: tests of other task rules finalize without audit slots (test_audit_slots.py has them)
        self.params = params or Params(unbonding_period=3, task_timeout=12, audit_window=2, min_fee=0,
                                       audits_per_worker=0)
        self.genesis = Genesis(CHAIN, 0, balances,
                               tuple(GenesisValidator(ident(v).peer_id, 10_000) for v in validators), self.params)
        self.ledger = Ledger.from_genesis(self.genesis)
        self.nonces: dict[str, int] = {}

    def tx(self, who: Identity, tx_type: str, payload: dict, fee: int = 0, nonce: int | None = None):
        if nonce is None:
            nonce = self.nonces.get(who.peer_id, self.ledger.nonce(who.peer_id))
            self.nonces[who.peer_id] = nonce + 1
        return build_tx(who, CHAIN, nonce, tx_type, payload, fee)

    def block(self, txs=(), evidence=(), last_commit=b""):
        led = self.ledger
        block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                            self.proposer, [t if isinstance(t, bytes) else t.raw for t in txs], evidence,
                            last_commit)
        result = led.apply_block(block)
        led.check_invariants()
        self.nonces.clear()
        return result

    def run(self, who: Identity, tx_type: str, payload: dict, fee: int = 0):
        """Execute one tx in its own block and return its receipt."""
        return self.block([self.tx(who, tx_type, payload, fee)]).receipts[0]

    def ok(self, who: Identity, tx_type: str, payload: dict, fee: int = 0):
        receipt = self.run(who, tx_type, payload, fee)
        assert receipt.code == TxCode.OK, receipt
        return receipt

    def empty_blocks(self, n: int):
        for _ in range(n):
            self.block()


def test_kit_chain_starts_at_genesis():
    chain = Chain()
    assert chain.ledger.height == 0
    assert chain.ledger.balance(ident(1).peer_id) == 1_000_000
    chain.empty_blocks(2)
    assert chain.ledger.height == 2


# ---- audit slots (ADR 0168) -------------------------------------------------------------------

HONEST_EVIDENCE = b"\xe0" * 32   # what an honest replay of any slot yields in these tests


def identity_of(peer_id: str) -> Identity:
    """The test identity ``ident(i)`` (i < 64) with this peer ID."""
    return next(ident(i) for i in range(64) if ident(i).peer_id == peer_id)


def answer_slot(chain, task_id: bytes, slot: int, verifier: str, match=True, evidence=HONEST_EVIDENCE, step=0):
    """``verifier`` (a peer ID) sends audit_result for ``slot``; returns the receipt."""
    return chain.run(identity_of(verifier), "audit_result", {"task_id": task_id, "slot": slot, "match": match,
                                                             "evidence": evidence, "step": step})


def answer_all_slots(chain, task_id: bytes, match=True, evidence=HONEST_EVIDENCE):
    """Every drawn verifier of every pending slot answers (match, evidence), in one block."""
    task = chain.ledger.state.tasks[task_id]
    txs = [chain.tx(identity_of(v["verifier"]), "audit_result",
                    {"task_id": task_id, "slot": slot["slot"], "match": match, "evidence": evidence,
                     "step": 0 if match else 1})
           for slot in task.slots if slot["outcome"] == "pending"
           for v in slot["verifiers"] if v["answer"] is None]
    result = chain.block(txs)
    assert all(r.code == TxCode.OK for r in result.receipts), result.receipts
    return result
