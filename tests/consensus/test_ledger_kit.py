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
        self.params = params or Params(unbonding_period=3, task_timeout=12, audit_window=2, min_fee=0)
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
