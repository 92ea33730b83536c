"""Shared helpers for the ledger tests: deterministic identities and a one-node test chain
(devtools/ledger_chain.py, also used by the verification lab)."""
from consensus.genesis import Params
from consensus.txcodes import TxCode
from devtools.ledger_chain import Chain as LabChain
from devtools.ledger_chain import ident
from node.identity import Identity

CHAIN = "dekube-test"


class Chain(LabChain):
    """The lab chain with the ledger tests' defaults: audits_per_worker=0, so tests of other task rules
    finalize without audit slots (test_audit_slots.py has them)."""

    def __init__(self, balances=None, validators=(0,), params=None, balance=1_000_000, block_ms=1000):
        params = params or Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0,
                                  audits_per_worker=0, max_audit_share_bps=10_000)
        super().__init__(balances, validators, params, balance, chain_id=CHAIN, block_ms=block_ms)


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
    """``verifier`` (a peer ID) commits its answer for ``slot`` (audit_commit); every sealed answer whose
    slot then opens its reveals is revealed in the next block (ADR 0202). Returns the commit's receipt."""
    receipt = chain.block([chain.seal(identity_of(verifier), task_id, slot, match, evidence, step)]).receipts[0]
    chain.reveal_all(task_id)
    run_scheduled_draws(chain, task_id)
    return receipt


def run_until(chain, condition, limit=200):
    """Empty blocks until ``condition()`` holds (at most ``limit``)."""
    for _ in range(limit):
        if condition():
            return
        chain.block()
    raise AssertionError("condition not reached")


def run_scheduled_draws(chain, task_id: bytes):
    """Empty blocks until no slot of the task waits for a draw (they wait beacon_delay blocks, ADR 0202);
    the last block's result (None when nothing waited)."""
    result = None
    while any(slot.get("draw") for slot in chain.ledger.state.tasks[task_id].slots):
        result = chain.block()
    return result


def answer_all_slots(chain, task_id: bytes, match=True, evidence=HONEST_EVIDENCE):
    """Every drawn verifier of every pending slot commits (match, evidence) in one block, then reveals in
    the next; returns the reveals' block result."""
    task = chain.ledger.state.tasks[task_id]
    txs = [chain.seal(identity_of(v["verifier"]), task_id, slot["slot"], match, evidence, 0 if match else 1)
           for slot in task.slots if slot["outcome"] == "pending"
           for v in slot["verifiers"] if v.get("commitment") is None]
    result = chain.block(txs)
    assert all(r.code == TxCode.OK for r in result.receipts), result.receipts
    return chain.reveal_all(task_id) or result


def crew_chain(workers, verifier, hardware, audits_per_worker=1) -> Chain:
    """A chain of short tasks (12 s minimum, no slack, one audit slot a worker unless told and no second
    verifier, no stake cover) with ``workers`` registered as compute nodes bonded 3000, 2000, 1000 and
    ``verifier`` bonded 500."""
    chain = Chain(params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0,
                                audits_per_worker=audits_per_worker, audit_double_bps=0, stake_cover_bps=0,
                                max_audit_share_bps=10_000))
    for worker, bond in zip(workers, (3000, 2000, 1000)):
        chain.ok(worker, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                           "hardware": hardware})
        chain.ok(worker, "bond", {"amount": bond})
    chain.ok(verifier, "register_node", {"roles": ["verifier"], "listen_addrs": [], "relay_addrs": [],
                                         "hardware": hardware})
    chain.ok(verifier, "bond", {"amount": 500})
    return chain
