"""Ledger basics: transfers, nonces, fees, staking, node registry, block validation, app hash."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger_kit import CHAIN, Chain, ident

from consensus.block import Block, BlockError, build_block
from consensus.encoding import decode, encode
from consensus.genesis import Params
from consensus.tx import build_tx
from consensus.txcodes import TxCode, TxError
from devtools.ledger_chain import QUICK_UNBONDING

A, B, C = ident(1), ident(2), ident(3)
HW = {"cpu_cores": 8, "ram_mb": 16000, "gpu": "rtx4090", "gpu_mem_mb": 24000, "bandwidth_mbps": 500}


def test_transfer_moves_funds_and_fee_goes_to_proposer():
    chain = Chain()
    proposer_before = chain.ledger.balance(chain.proposer)
    receipt = chain.ok(A, "transfer", {"to": B.peer_id, "amount": 300}, fee=5)
    assert receipt.fee_paid == 5
    assert chain.ledger.balance(A.peer_id) == 1_000_000 - 305
    assert chain.ledger.balance(B.peer_id) == 1_000_000 + 300
    assert chain.ledger.balance(chain.proposer) == proposer_before + 5
    assert chain.ledger.nonce(A.peer_id) == 1


def test_transfer_to_a_new_account_creates_it():
    chain = Chain()
    newcomer = ident(77).peer_id
    chain.ok(A, "transfer", {"to": newcomer, "amount": 1})
    assert chain.ledger.balance(newcomer) == 1
    assert chain.ledger.nonce(newcomer) == 0


def test_failed_payload_still_takes_fee_and_nonce():
    chain = Chain()
    receipt = chain.run(A, "transfer", {"to": B.peer_id, "amount": 2_000_000}, fee=10)
    assert receipt.code == TxCode.INSUFFICIENT_FUNDS and receipt.fee_paid == 10
    assert chain.ledger.balance(A.peer_id) == 1_000_000 - 10
    assert chain.ledger.nonce(A.peer_id) == 1


def test_nonce_rules_in_a_block():
    chain = Chain()
    txs = [chain.tx(A, "transfer", {"to": B.peer_id, "amount": 1}, nonce=n) for n in (0, 0, 2, 1)]
    codes = [r.code for r in chain.block(txs).receipts]
    assert codes == [TxCode.OK, TxCode.NONCE_TOO_LOW, TxCode.NONCE_TOO_HIGH, TxCode.OK]
    assert chain.ledger.nonce(A.peer_id) == 2


def test_fee_unpayable_and_below_minimum_change_nothing():
    chain = Chain(balances={A.peer_id: 3, B.peer_id: 100})
    before = chain.ledger.full_state_hash()
    receipt = chain.run(A, "transfer", {"to": B.peer_id, "amount": 1}, fee=4)
    assert receipt.code == TxCode.INSUFFICIENT_FUNDS and receipt.fee_paid == 0
    assert chain.ledger.nonce(A.peer_id) == 0 and chain.ledger.balance(A.peer_id) == 3
    assert chain.ledger.full_state_hash() != before  # height moved on, accounts did not


def test_bad_signature_and_junk_in_a_block_get_receipts_not_crashes():
    chain = Chain()
    good = chain.tx(A, "transfer", {"to": B.peer_id, "amount": 1})
    fields = decode(good.raw)
    fields[7] = bytes(64)
    forged = encode(fields)
    result = chain.block([forged, b"\xff\x00junk", good.raw])
    assert [r.code for r in result.receipts] == [TxCode.BAD_SIGNATURE, TxCode.BAD_ENCODING, TxCode.OK]


def test_transaction_for_another_chain_is_rejected_in_block():
    chain = Chain()
    other = build_tx(A, "other-chain", 0, "transfer", {"to": B.peer_id, "amount": 1})
    assert chain.block([other]).receipts[0].code == TxCode.WRONG_CHAIN


def test_bond_unbond_and_release_after_unbonding_period():
    chain = Chain(params=Params(min_fee=0, **QUICK_UNBONDING))  # unbonding_period = 4
    chain.ok(A, "bond", {"amount": 5000})
    assert chain.ledger.stake_info(A.peer_id)["bonded"] == 5000
    assert chain.ledger.balance(A.peer_id) == 1_000_000 - 5000
    assert chain.run(A, "unbond", {"amount": 6000}).code == TxCode.INSUFFICIENT_FUNDS
    unbond_height = chain.ledger.height + 1
    chain.ok(A, "unbond", {"amount": 2000})
    assert chain.ledger.stake_info(A.peer_id) == {"bonded": 3000, "unbonding": [[unbond_height + 4, 2000]],
                                                  "slashed": 0, "jailed_until": 0, "missed": 0}
    chain.empty_blocks(3)
    assert chain.ledger.balance(A.peer_id) == 1_000_000 - 5000
    chain.empty_blocks(1)
    assert chain.ledger.height == unbond_height + 4
    assert chain.ledger.balance(A.peer_id) == 1_000_000 - 3000
    assert chain.ledger.stake_info(A.peer_id)["unbonding"] == []
    assert chain.run(A, "bond", {"amount": 10**7}).code == TxCode.INSUFFICIENT_FUNDS


def test_register_node_and_validator_candidates():
    chain = Chain()
    payload = {"roles": ["compute", "validator"], "listen_addrs": ["/ip4/127.0.0.1/tcp/4001"],
               "relay_addrs": [], "hardware": HW}
    chain.ok(A, "register_node", payload)
    node = chain.ledger.node_info(A.peer_id)
    assert node["roles"] == ["compute", "validator"] and node["hardware"]["gpu"] == "rtx4090"
    assert A.peer_id not in chain.ledger.validator_stakes()  # registered but not bonded enough
    chain.ok(A, "bond", {"amount": 20_000})
    assert chain.ledger.validators()[0] == (A.peer_id, 20_000)  # above the genesis validator's 10_000
    chain.ok(A, "register_node", {**payload, "roles": ["compute"]})
    assert A.peer_id not in chain.ledger.validator_stakes()
    assert chain.ledger.node_info(A.peer_id)["registered_height"] == 1
    assert chain.ledger.node_info(ident(55).peer_id) is None


@pytest.mark.parametrize("field, value, error", [
    ("chain_id", "other", "chain"),
    ("height", 5, "height"),
    ("prev_hash", b"\x01" * 32, "prev_hash"),
    ("app_hash", b"\x02" * 32, "app_hash"),
    ("time_ms", 999, "before the previous"),
    ("prev_beacon", b"\x07" * 32, "beacon proof"),
])
def test_block_that_does_not_extend_the_chain_is_refused(field, value, error):
    chain = Chain()
    chain.empty_blocks(1)
    led = chain.ledger
    args = dict(chain_id=CHAIN, height=2, time_ms=2000, prev_hash=led.last_block_hash, app_hash=led.app_hash,
                proposer=chain.proposer_identity, prev_beacon=led.beacon, txs=[])
    args[field] = value
    with pytest.raises(BlockError, match=error):
        led.apply_block(build_block(**args))
    assert led.height == 1


def test_tampered_tx_list_fails_root_check():
    chain = Chain()
    led = chain.ledger
    block = build_block(CHAIN, 1, 1, b"", led.app_hash, chain.proposer_identity, led.beacon,
                        [chain.tx(A, "bond", {"amount": 1}).raw])
    tampered = type(block)(block.header, (chain.tx(B, "bond", {"amount": 1}).raw,))
    with pytest.raises(BlockError, match="txs_root"):
        led.apply_block(tampered)


def test_replicas_agree_on_app_hash_and_diverge_on_different_history():
    one, two, three = Chain(), Chain(), Chain()
    for chain in (one, two):
        chain.ok(A, "transfer", {"to": B.peer_id, "amount": 10})
        chain.ok(B, "bond", {"amount": 100})
    three.ok(A, "transfer", {"to": B.peer_id, "amount": 11})
    three.ok(B, "bond", {"amount": 100})
    assert one.ledger.app_hash == two.ledger.app_hash
    assert one.ledger.full_state_hash() == two.ledger.full_state_hash()
    assert three.ledger.app_hash != one.ledger.app_hash


def test_block_result_lists_sorted_changes_with_app_hash_last():
    chain = Chain()
    result = chain.block([chain.tx(A, "transfer", {"to": B.peer_id, "amount": 1})])
    keys = [k for k, _ in result.changes]
    assert keys[-1] == b"meta/app_hash"
    assert keys[:-1] == sorted(keys[:-1])
    assert b"acct/" + A.peer_id.encode() in keys and b"acct/" + B.peer_id.encode() in keys


def test_block_encoding_round_trip_and_hash():
    chain = Chain()
    led = chain.ledger
    block = build_block(CHAIN, 1, 5, b"", led.app_hash, chain.proposer_identity, led.beacon,
                        [chain.tx(A, "bond", {"amount": 1}).raw], [b"ev"], b"commit-cert")
    again = Block.decode(block.encode(), max_bytes=10**6)
    assert again == block and again.hash == block.hash
    again.check_roots()
    assert block.header.to_json()["hash"] == block.hash.hex()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_junk_block_bytes_raise_block_error_only(junk):
    try:
        Block.decode(junk, max_bytes=10**6)
    except BlockError:
        pass


def test_oversized_block_is_refused():
    with pytest.raises(BlockError, match="exceeds"):
        Block.decode(b"\x07" * 100, max_bytes=50)


def test_threaded_signature_checks_match_inline_ones():
    from concurrent.futures import ThreadPoolExecutor

    from consensus.state.ledger import VERIFY_CHUNK
    inline, threaded = Chain(), Chain()
    txs = [inline.tx(ident(1 + i % 9), "transfer", {"to": A.peer_id, "amount": 1}) for i in range(VERIFY_CHUNK + 40)]
    fields = decode(txs[VERIFY_CHUNK + 3].raw)
    fields[7] = bytes(64)
    raws = [tx.raw for tx in txs]
    raws[VERIFY_CHUNK + 3] = encode(fields)
    one = inline.block(raws)
    with ThreadPoolExecutor(2) as pool:
        led = threaded.ledger
        block = build_block(CHAIN, 1, 1000, b"", led.app_hash, threaded.proposer_identity, led.beacon, raws)
        two = led.apply_block(block, executor=pool)
    assert [r.code for r in one.receipts] == [r.code for r in two.receipts]
    assert one.receipts[VERIFY_CHUNK + 3].code == TxCode.BAD_SIGNATURE
    assert one.app_hash == two.app_hash


def test_check_tx_is_the_strict_next_nonce_check():
    chain = Chain()
    tx = chain.tx(A, "transfer", {"to": B.peer_id, "amount": 1}, nonce=1)
    with pytest.raises(TxError) as info:
        chain.ledger.check_tx(tx)
    assert info.value.code == TxCode.NONCE_TOO_HIGH
    chain.ledger.check_tx(chain.tx(A, "transfer", {"to": B.peer_id, "amount": 1}, nonce=0))


def test_committee_is_top_k_and_changes_only_at_epoch_boundaries():
    from consensus.genesis import Params
    chain = Chain(validators=(0, 10, 11), params=Params(committee_size=2, epoch_length=3, min_fee=0))
    first = chain.ledger.committee()
    assert len(first) == 2 and first.start_height == 1
    payload = {"roles": ["validator"], "listen_addrs": [], "relay_addrs": [], "hardware": HW}
    chain.ok(A, "register_node", payload)   # height 1
    chain.ok(A, "bond", {"amount": 50_000})  # height 2
    assert chain.ledger.committee() == first  # mid-epoch: unchanged
    chain.empty_blocks(1)                      # height 3 ends the epoch
    second = chain.ledger.committee()
    assert second.start_height == 4 and A.peer_id in second and second.power(A.peer_id) == 50_000
    chain.ok(A, "unbond", {"amount": 50_000})
    chain.empty_blocks(2)                      # height 6: A is no longer a candidate
    assert A.peer_id not in chain.ledger.committee() and len(chain.ledger.committee()) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_junk_transactions_in_a_block_never_crash_execution(junk):
    chain = Chain()
    before = chain.ledger.balance(A.peer_id)
    result = chain.block(junk)
    assert len(result.receipts) == len(junk)
    assert all(r.code != TxCode.OK and not r.executed for r in result.receipts)
    assert chain.ledger.balance(A.peer_id) == before
