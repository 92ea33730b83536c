"""Certificates stored once and bounded history (docs/adr/0199): the certificate of block h lives in
block h + 1 (only the tip's is a WAL record), and a ChainStore with ``retain_blocks`` prunes older
blocks, their hash index and WAL records in the commit's own batch, keeping the epoch's committee;
a crash at the commit leaves the old or the new retained range, on RocksDB across a restart too."""
import pytest

from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.tx import build_tx
from consensus.validator.chainstore import (
    CERTIFICATE_TAG,
    ChainStore,
    decode_certificate,
    encode_certificate,
)
from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import Storage
from node.identity import Identity

VALS = [Identity.from_seed(bytes([70 + i]) * 32) for i in range(3)]
USER = Identity.from_seed(b"\x56" * 32)
GENESIS = Genesis("pruning-test", 0, {USER.peer_id: 10**9},
                  tuple(GenesisValidator(v.peer_id, 2000 + i) for i, v in enumerate(VALS)),
                  Params(committee_size=3, epoch_length=4, min_fee=0))


class Crash(Exception):
    pass


def precommits(height, block_raw):
    vid = value_id(block_raw)
    return [sign_vote(v, GENESIS.chain_id, Vote(VoteType.PRECOMMIT, height, 0, vid, v.peer_id)) for v in VALS]


def commit_next(store, ledger, last_cert, txs=()):
    """Commit the next block as a validator does: certificate saved first, the block carrying the
    previous block's certificate; returns this block's certificate (encoded)."""
    block = build_block(GENESIS.chain_id, ledger.height + 1, ledger.height + 1, ledger.last_block_hash,
                        ledger.app_hash, VALS[0], ledger.beacon, txs, (), last_cert)
    cert = store.save_certificate(block.height, precommits(block.height, block.encode()))
    store.commit(block, ledger.apply_block(block))
    store.committee_for(block.height + 1, ledger)
    return cert


def grow(store, blocks):
    ledger, cert = store.storage.load_ledger(), store.certificate_bytes(store.storage.height) or b""
    for _ in range(blocks):
        cert = commit_next(store, ledger, cert)
    return ledger


def certificate_records(storage):
    return [h for h in range(0, storage.height + 2)
            for record in storage.wal_records(h) if record[:1] == CERTIFICATE_TAG]


def test_each_certificate_is_stored_once_and_every_height_still_has_one():
    store = ChainStore(Storage.create("mem", MemoryKV(), GENESIS))
    store.committee_for(1, store.storage.load_ledger())
    grow(store, 9)
    assert certificate_records(store.storage) == [9]       # only the tip's: the others live in the next block
    for height in range(1, 10):
        votes = decode_certificate(store.certificate_bytes(height))
        block = store.block(height)
        assert votes and all(v.value_id == value_id(block.encode()) and v.height == height for v in votes)
        stored = store.stored_commit(height)
        assert stored is not None and stored.value == block.encode()
    assert store.certificate_bytes(10) is None and store.stored_commit(10) is None


def test_pruning_keeps_the_last_blocks_the_epoch_committee_and_a_consistent_database():
    store = ChainStore(Storage.create("mem", MemoryKV(), GENESIS), retain_blocks=5)
    ledger = store.storage.load_ledger()
    store.committee_for(1, ledger)
    hashes = {}
    for _ in range(14):
        grow(store, 1)
        hashes[store.storage.height] = store.block(store.storage.height).hash
    storage = store.storage
    # the last 5 would be 10..14; the older kept snapshot (8; epochs of 4) keeps its next block, 9
    assert (storage.base, storage.height) == (9, 14) and storage.snapshot_heights() == [8, 12]
    for height in range(1, 9):
        assert storage.block_by_height(height) is None and storage.is_pruned(height)
        assert storage.block_by_hash(hashes[height]) is None and store.stored_commit(height) is None
    for height in range(9, 15):
        assert storage.block_by_hash(hashes[height]).height == height and store.stored_commit(height) is not None
    assert not storage.is_pruned(15) and not storage.is_pruned(0)
    storage.check_integrity()
    # WAL: nothing below the kept range except what the tip's epoch needs (its committee, at 13)
    assert all(h >= 9 for h in range(0, 15) if storage.wal_records(h))
    assert store.committee_for(14, ledger).start_height == 13


def test_pruning_deletes_a_pruned_blocks_receipts_but_not_one_a_later_copy_wrote():
    store = ChainStore(Storage.create("mem", MemoryKV(), GENESIS), retain_blocks=3)
    ledger = store.storage.load_ledger()
    store.committee_for(1, ledger)
    transfer = [build_tx(USER, GENESIS.chain_id, n, "transfer", {"to": VALS[1].peer_id, "amount": 1}, fee=0)
                for n in range(3)]
    cert = commit_next(store, ledger, b"", [transfer[0].raw])              # 1: executed
    cert = commit_next(store, ledger, cert, [transfer[2].raw])             # 2: a nonce gap, not executed
    cert = commit_next(store, ledger, cert, [transfer[1].raw, transfer[2].raw])   # 3: both executed
    storage = store.storage

    def heights():
        return [None if storage.receipt(tx.hash) is None else storage.receipt(tx.hash).height for tx in transfer]

    assert heights() == [1, 3, 3]
    cert = commit_next(store, ledger, cert)
    assert storage.base == 2 and heights() == [None, 3, 3]                 # block 1's receipt went with it
    cert = commit_next(store, ledger, cert)
    assert storage.base == 3 and heights() == [None, 3, 3]                 # block 2's copy left block 3's receipt
    commit_next(store, ledger, cert)
    assert storage.base == 4 and heights() == [None, None, None]
    storage.check_integrity()


def test_turning_pruning_on_for_a_long_chain_prunes_a_bounded_amount_per_commit():
    store = ChainStore(Storage.create("mem", MemoryKV(), GENESIS))
    store.committee_for(1, store.storage.load_ledger())
    grow(store, 20)
    store.retain_blocks = 2
    import consensus.validator.chainstore as chainstore
    limit, chainstore.PRUNE_PER_COMMIT = chainstore.PRUNE_PER_COMMIT, 4
    try:
        grow(store, 1)
        assert store.storage.base == 5                         # 4 of the 19 prunable blocks
        grow(store, 3)
        assert store.storage.base == 17                        # still catching up, 4 a commit
        grow(store, 1)
        assert store.storage.base == 21                        # caught up: from the snapshot at 20's next block
    finally:
        chainstore.PRUNE_PER_COMMIT = limit
    store.storage.check_integrity()


def test_a_crash_in_the_pruning_commit_leaves_the_old_range():
    kv = MemoryKV()
    store = ChainStore(Storage.create("mem", kv, GENESIS), retain_blocks=3)
    store.committee_for(1, store.storage.load_ledger())
    grow(store, 6)
    assert (store.storage.base, store.storage.height) == (4, 6)     # last 3 (the snapshot at 4 needs 5)

    def crash(ops):
        if any(key == b"M/base" for key, _ in ops):
            raise Crash()
    kv.before_write = crash
    with pytest.raises(Crash):
        grow(store, 1)
    kv.before_write = None
    kv.crash()
    kv.reopen()
    again = ChainStore(Storage.create("mem", kv, GENESIS), retain_blocks=3)
    assert (again.storage.base, again.storage.height) == (4, 6)
    again.storage.check_integrity()
    assert again.block(4) is not None and again.block(3) is None
    grow(again, 1)
    assert (again.storage.base, again.storage.height) == (5, 7)


def test_pruned_rocksdb_reopens_and_keeps_going(tmp_path):
    path = str(tmp_path / "db")
    store = ChainStore(Storage.open(path, GENESIS), retain_blocks=4)
    store.committee_for(1, store.storage.load_ledger())
    grow(store, 11)
    tip_cert = store.certificate_bytes(11)
    store.storage.close()

    reopened = ChainStore(Storage.open(path, GENESIS), retain_blocks=4)
    storage = reopened.storage
    assert (storage.base, storage.height) == (5, 11)          # snapshots 4 and 8 kept, with block 5 on
    storage.verify(None)
    storage.verify(2)
    assert reopened.certificate_bytes(11) == tip_cert
    assert reopened.committee_for(12, storage.load_ledger()).start_height == 9
    ledger = grow(reopened, 3)
    assert (storage.base, storage.height, ledger.height) == (9, 14, 14)
    assert encode_certificate(decode_certificate(reopened.certificate_bytes(13))) == reopened.block(14).last_commit
    storage.close()
