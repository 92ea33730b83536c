"""Mempool: entry checks, nonce gaps and promotion, replacement, bounds, fair eviction, reap, update."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger_kit import CHAIN, Chain, ident

from consensus.block import build_block
from consensus.encoding import decode, encode
from consensus.tx import build_tx
from consensus.txcodes import TxCode, TxError
from consensus.validator.mempool import Mempool

A, B, C, D = ident(1), ident(2), ident(3), ident(4)


def transfer(who, nonce, amount=1, fee=0, to=B):
    return build_tx(who, CHAIN, nonce, "transfer", {"to": to.peer_id, "amount": amount}, fee)


def code_of(pool, raw):
    with pytest.raises(TxError) as info:
        pool.add(raw)
    return info.value.code


def test_entry_checks_give_clear_codes():
    chain = Chain(balances={A.peer_id: 1000, B.peer_id: 10})
    pool = Mempool(chain.ledger, max_nonce_ahead=4)
    good = transfer(A, 0)
    pool.add(good.raw)
    assert code_of(pool, good.raw) == TxCode.ALREADY_KNOWN
    assert code_of(pool, transfer(A, 5).raw) == TxCode.NONCE_TOO_HIGH
    assert code_of(pool, transfer(B, 0, amount=11).raw) == TxCode.INSUFFICIENT_FUNDS
    fields = decode(transfer(A, 1).raw)
    fields[7] = bytes(64)
    assert code_of(pool, encode(fields)) == TxCode.BAD_SIGNATURE
    assert code_of(pool, b"\x00junk") == TxCode.BAD_ENCODING
    assert code_of(pool, b"\x07" * (chain.params.max_tx_bytes + 1)) == TxCode.OVERSIZED
    assert code_of(pool, build_tx(A, "other", 1, "bond", {"amount": 1}).raw) == TxCode.WRONG_CHAIN
    chain.block([good])
    pool.update([good.hash])
    assert code_of(pool, good.raw) == TxCode.NONCE_TOO_LOW


def test_balance_covers_all_queued_spends():
    chain = Chain(balances={A.peer_id: 100})
    pool = Mempool(chain.ledger)
    pool.add(transfer(A, 0, amount=60, fee=5).raw)
    assert code_of(pool, transfer(A, 1, amount=40).raw) == TxCode.INSUFFICIENT_FUNDS
    pool.add(transfer(A, 1, amount=35).raw)
    assert len(pool) == 2


def test_gap_holds_back_later_nonces_until_filled():
    chain = Chain()
    pool = Mempool(chain.ledger)
    pool.add(transfer(A, 2).raw)
    pool.add(transfer(A, 1).raw)
    assert pool.reap(10**6, 100) == []
    assert pool.pending_nonce(A.peer_id) == 0
    pool.add(transfer(A, 0).raw)
    assert pool.pending_nonce(A.peer_id) == 3
    reaped = pool.reap(10**6, 100)
    assert [decode(raw)[3] for raw in reaped] == [0, 1, 2]


def test_replacement_needs_a_higher_fee():
    chain = Chain()
    pool = Mempool(chain.ledger)
    first = pool.add(transfer(A, 0, fee=5).raw)
    assert code_of(pool, transfer(A, 0, fee=5, amount=2).raw) == TxCode.REPLACEMENT_UNDERPRICED
    better = pool.add(transfer(A, 0, fee=6).raw)
    assert first.hash not in pool and better.hash in pool and len(pool) == 1


def test_reap_orders_by_fee_across_accounts_and_respects_limits():
    chain = Chain()
    pool = Mempool(chain.ledger)
    pool.add(transfer(A, 0, fee=1).raw)
    pool.add(transfer(A, 1, fee=9).raw)   # high fee but behind A's nonce 0
    pool.add(transfer(B, 0, fee=5, to=A).raw)
    pool.add(transfer(C, 0, fee=3).raw)
    order = [(decode(raw)[2], decode(raw)[3]) for raw in pool.reap(10**6, 100)]
    assert order == [(B.peer_id, 0), (C.peer_id, 0), (A.peer_id, 0), (A.peer_id, 1)]
    assert len(pool.reap(10**6, 2)) == 2
    one = len(transfer(A, 0).raw)
    assert len(pool.reap(one * 2 + 1, 100)) == 2


def test_bounded_size_evicts_lowest_fee_tail_and_rejects_cheap_newcomers():
    chain = Chain()
    pool = Mempool(chain.ledger, max_txs=3)
    pool.add(transfer(A, 0, fee=4).raw)
    pool.add(transfer(A, 1, fee=2).raw)
    pool.add(transfer(B, 0, fee=3, to=A).raw)
    assert code_of(pool, transfer(C, 0, fee=2).raw) == TxCode.MEMPOOL_FULL
    pool.add(transfer(C, 0, fee=5).raw)  # evicts A's tail (fee 2), never A's nonce 0
    assert len(pool) == 3
    assert transfer(A, 1, fee=2).hash not in pool and transfer(A, 0, fee=4).hash in pool


def test_byte_bound_and_per_account_cap():
    chain = Chain()
    size = len(transfer(A, 0).raw)
    pool = Mempool(chain.ledger, max_bytes=size * 2, max_per_account=2)
    pool.add(transfer(A, 0, fee=1).raw)
    pool.add(transfer(A, 1, fee=1).raw)
    assert code_of(pool, transfer(A, 2, fee=9).raw) == TxCode.MEMPOOL_FULL  # per-account cap
    pool.add(transfer(B, 0, fee=3, to=A).raw)                              # evicts by bytes
    assert pool.size_bytes <= size * 2 and len(pool) == 2


def test_update_after_commit_removes_included_and_rechecks_the_rest():
    chain = Chain(balances={A.peer_id: 100, B.peer_id: 100})
    pool = Mempool(chain.ledger)
    t0 = pool.add(transfer(A, 0, amount=10).raw)
    t1 = pool.add(transfer(A, 1, amount=10).raw)
    t2 = pool.add(transfer(A, 2, amount=10).raw)
    b0 = pool.add(transfer(B, 0, amount=50, to=C).raw)
    # a block (from another proposer) drains A's balance and includes B's tx
    competing = build_tx(A, CHAIN, 0, "transfer", {"to": C.peer_id, "amount": 85})
    result = chain.block([competing, b0])
    pool.update([r.tx_hash for r in result.receipts])
    assert b0.hash not in pool and t0.hash not in pool  # included / stale nonce
    assert t1.hash in pool                               # 10 of the 15 left
    assert t2.hash not in pool                           # no longer affordable
    assert pool.reap(10**6, 10) == [t1.raw]


def test_known_txs_skip_decoding_and_match_a_full_execution():
    fresh, pooled = Chain(), Chain()
    pool = Mempool(pooled.ledger)
    txs = [pool.add(transfer(who, 0, fee=1).raw) for who in (A, B, C)]
    raws = [t.raw for t in txs] + [b"junk", transfer(D, 5).raw]
    one = fresh.block(raws)
    led = pooled.ledger
    block = build_block(CHAIN, 1, 1000, b"", led.app_hash, pooled.proposer_identity, led.beacon, raws)
    two = led.apply_block(block, known_txs=pool.known_txs)
    assert [(r.tx_hash, r.code) for r in one.receipts] == [(r.tx_hash, r.code) for r in two.receipts]
    assert one.app_hash == two.app_hash


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_traffic_keeps_bounds_and_reaped_blocks_execute_cleanly(data):
    people = [ident(i) for i in range(1, 6)]
    chain = Chain(balances={p.peer_id: 400 for p in people})
    pool = Mempool(chain.ledger, max_txs=12, max_bytes=12 * 260, max_per_account=4, max_nonce_ahead=3)
    for _ in range(data.draw(st.integers(1, 6))):
        for _ in range(data.draw(st.integers(0, 15))):
            who = data.draw(st.sampled_from(people))
            nonce = chain.ledger.nonce(who.peer_id) + data.draw(st.integers(-1, 4))
            tx = build_tx(who, CHAIN, max(nonce, 0), "transfer",
                          {"to": data.draw(st.sampled_from(people)).peer_id, "amount": data.draw(st.integers(1, 150))},
                          data.draw(st.integers(0, 9)))
            try:
                pool.add(tx.raw)
            except TxError:
                pass
            assert len(pool) <= 12 and pool.size_bytes <= 12 * 260
        reaped = pool.reap(data.draw(st.integers(200, 4000)), data.draw(st.integers(1, 12)))
        result = chain.block(reaped)
        assert all(r.code == TxCode.OK for r in result.receipts), result.receipts
        pool.update([r.tx_hash for r in result.receipts])
        assert not any(r.tx_hash in pool for r in result.receipts)


def test_rpc_codes_for_wallet_errors():
    assert TxCode.NONCE_TOO_LOW.rpc_code == -32001
    assert TxCode.ALREADY_KNOWN.rpc_code == -32005
    assert TxCode.BAD_PAYLOAD.rpc_code == -32000
    assert TxError(TxCode.NONCE_TOO_HIGH).message == "nonce too high"


def test_gapped_transactions_are_not_ready_and_expire_after_the_gap_ttl():
    chain = Chain()
    pool = Mempool(chain.ledger, gap_ttl_blocks=3)
    gapped = transfer(A, 1)
    pool.add(gapped.raw)
    assert len(pool) == 1 and not pool.has_ready()   # queued, but nothing could go in a block
    ready = transfer(B, 0, to=A)
    pool.add(ready.raw)
    assert pool.has_ready()
    chain.block([ready])
    pool.update([ready.hash])
    assert not pool.has_ready() and gapped.hash in pool
    for _ in range(2):
        chain.block()
        pool.update([])
        assert gapped.hash in pool                   # within 3 blocks of arriving it may still be filled
    chain.block()
    pool.update([])
    assert gapped.hash not in pool and len(pool) == 0 and pool.size_bytes == 0


def test_a_filled_gap_makes_the_waiting_transactions_ready_and_keeps_them():
    chain = Chain()
    pool = Mempool(chain.ledger, gap_ttl_blocks=1)
    later = transfer(A, 1)
    pool.add(later.raw)
    chain.empty_blocks(1)
    pool.update([])
    pool.add(transfer(A, 0).raw)
    assert pool.has_ready()
    chain.empty_blocks(3)
    pool.update([])
    assert later.hash in pool and pool.has_ready()   # no longer behind a gap: the TTL does not apply
    assert len(pool.reap(10**6, 10)) == 2


def test_ready_flag_follows_commits_replacements_and_evictions():
    chain = Chain()
    pool = Mempool(chain.ledger, max_txs=1)
    head = transfer(A, 0, fee=1)
    pool.add(head.raw)
    assert pool.has_ready()
    chain.block([head])
    pool.update([head.hash])
    assert not pool.has_ready() and len(pool) == 0
    gapped = transfer(B, 3, fee=1)
    pool.add(gapped.raw)
    assert not pool.has_ready()
    pool.add(transfer(C, 0, fee=2).raw)                # evicts the cheaper gapped tx
    assert pool.has_ready() and gapped.hash not in pool


def test_a_sender_whose_balance_drained_to_zero_loses_its_queued_fee_free_transactions():
    chain = Chain()                                    # min_fee 0 in the kit: the balance rule still holds
    pool = Mempool(chain.ledger)
    balance = chain.ledger.balance(A.peer_id)
    drain = transfer(A, 0, amount=balance)
    follow = build_tx(A, CHAIN, 1, "cancel_task", {"task_id": bytes(32)}, 0)
    pool.add(drain.raw)
    pool.add(follow.raw)
    chain.block([drain])
    pool.update([drain.hash])
    assert chain.ledger.balance(A.peer_id) == 0
    assert follow.hash not in pool and not pool.has_ready()
