"""ChainStore: certificates and epoch committees in the WAL, and their recovery after reopening."""
import pytest

from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.tx import build_tx
from consensus.validator.chainstore import (
    CertificateError,
    ChainStore,
    decode_certificate,
    encode_certificate,
    epoch_start,
)
from consensus.validator.storage import CorruptDatabase, Storage
from node.identity import Identity

VALS = [Identity.from_seed(bytes([90 + i]) * 32) for i in range(3)]
USER = Identity.from_seed(b"\x55" * 32)
GENESIS = Genesis("chainstore-test", 0, {USER.peer_id: 10**9, VALS[2].peer_id: 10**9},
                  tuple(GenesisValidator(v.peer_id, 2000 + i) for i, v in enumerate(VALS)),
                  Params(committee_size=2, epoch_length=3, min_fee=0))


def precommits(height, block_raw):
    vid = value_id(block_raw)
    return [sign_vote(v, GENESIS.chain_id, Vote(VoteType.PRECOMMIT, height, 0, vid, v.peer_id)) for v in VALS]


def test_certificate_round_trip_and_junk():
    votes = precommits(1, b"block")
    assert decode_certificate(encode_certificate(votes)) == tuple(votes)
    assert decode_certificate(encode_certificate([])) == ()
    for junk in (b"", b"\xff\xff", encode_certificate(votes)[:-3], b"\x07\x01\x05\x02ab"):
        with pytest.raises(CertificateError):
            decode_certificate(junk)


def test_epoch_start():
    assert [epoch_start(h, 3) for h in range(1, 8)] == [0, 0, 0, 3, 3, 3, 6]


def commit_next(store, ledger, txs=()):
    block = build_block(GENESIS.chain_id, ledger.height + 1, ledger.height + 1, ledger.last_block_hash,
                        ledger.app_hash, VALS[0], ledger.beacon, txs)
    store.save_certificate(block.height, precommits(block.height, block.encode()))
    result = ledger.apply_block(block)
    store.storage.commit_block(block, result)
    return block


def test_committees_follow_stake_per_epoch_and_survive_reopen(tmp_path):
    path = str(tmp_path / "db")
    store = ChainStore(Storage.open(path, GENESIS))
    ledger = store.storage.load_ledger()
    first = store.committee_for(1, ledger)
    assert set(first.peer_ids) == {VALS[1].peer_id, VALS[2].peer_id}      # top-2 by stake
    assert first.start_height == 1
    # VALS[2] doubles its stake in block 1; the committee changes only at the next epoch (height 4)
    commit_next(store, ledger, [build_tx(VALS[2], GENESIS.chain_id, 0, "bond", {"amount": 5000}).raw])
    assert store.committee_for(2, ledger) == first
    commit_next(store, ledger)
    commit_next(store, ledger)
    second = store.committee_for(4, ledger)
    assert second.start_height == 4 and second.power(VALS[2].peer_id) == 7002
    commit_next(store, ledger)
    stored = store.stored_commit(4)
    assert stored.height == 4 and len(stored.certificate) == 3
    assert value_id(stored.value) == stored.certificate[0].value_id
    assert store.stored_commit(5) is None
    store.storage.close()

    reopened = ChainStore(Storage.open(path, GENESIS))                    # mid-epoch: read back, not re-elected
    assert reopened.committee_for(5, reopened.storage.load_ledger()) == second
    assert reopened.committee_for(3, reopened.storage.load_ledger()) == first
    assert reopened.certificate_bytes(2) == encode_certificate(precommits(2, reopened.block(2).encode()))
    reopened.storage.close()


def test_missing_committee_mid_epoch_is_a_clear_error(tmp_path):
    store = ChainStore(Storage.open(str(tmp_path / "db"), GENESIS))
    ledger = store.storage.load_ledger()
    commit_next(store, ledger)                           # committee of epoch 1 never recorded
    with pytest.raises(CorruptDatabase, match="committee"):
        store.committee_for(2, ledger)
    store.storage.close()
