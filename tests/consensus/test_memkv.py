"""MemoryKV: Storage runs unchanged over it; a crash keeps synced writes only; a write can be torn off."""
import pytest
from test_ledger_kit import Chain
from test_storage import grow

from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import ForeignDatabase, Storage


def test_storage_over_memory_kv_survives_a_crash_and_reloads_the_same_ledger():
    chain, kv = Chain(), MemoryKV()
    storage = Storage.create("mem", kv, chain.genesis)
    result = grow(chain, storage, 4)
    storage.save_signer_state(b"signer")
    kv.crash()
    kv.reopen()
    again = Storage.create("mem", kv, chain.genesis)
    assert again.height == 4 and again.load_signer_state() == b"signer"
    ledger = again.load_ledger()
    assert ledger.app_hash == result.app_hash == chain.ledger.app_hash
    assert ledger.full_state_hash() == chain.ledger.full_state_hash()
    assert again.receipt(result.receipts[0].tx_hash).height == 4


def test_unsynced_writes_are_lost_in_a_crash_and_reads_see_them_before():
    kv = MemoryKV()
    kv.write([(b"a/1", b"x"), (b"a/2", b"y")], sync=True)
    kv.write([(b"a/3", b"z"), (b"a/1", None)], sync=False)
    assert [k for k, _ in kv.scan(b"a/")] == [b"a/2", b"a/3"] and kv.last_key(b"a/") == b"a/3"
    kv.crash()
    kv.reopen()
    assert list(kv.scan(b"a/")) == [(b"a/1", b"x"), (b"a/2", b"y")]
    kv.delete_range(b"a/", b"a/2")
    assert list(kv.scan(b"a/")) == [(b"a/2", b"y")]


def test_a_torn_write_applies_nothing_of_its_batch():
    chain, kv = Chain(), MemoryKV()
    storage = Storage.create("mem", kv, chain.genesis)
    grow(chain, storage, 1)

    def crash(ops):
        raise RuntimeError("power cut")

    kv.before_write = crash
    with pytest.raises(RuntimeError):
        grow(chain, storage, 1)
    kv.before_write = None
    kv.crash()
    kv.reopen()
    assert Storage.create("mem", kv, chain.genesis).height == 1


def test_memory_kv_of_another_chain_is_refused():
    kv = MemoryKV()
    Storage.create("mem", kv, Chain().genesis)
    other = Chain(validators=(0, 1)).genesis
    assert other.hash != Chain().genesis.hash
    with pytest.raises(ForeignDatabase):
        Storage.create("mem", kv, other)
