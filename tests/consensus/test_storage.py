"""Storage: blocks/state/receipts/WAL/signer persistence, foreign and corrupt databases,
and recovery after SIGKILL of a writer process at random instants."""
import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from test_ledger_kit import CHAIN, Chain, ident

from consensus.block import build_block
from consensus.genesis import Genesis
from consensus.state.ledger import Ledger
from consensus.txcodes import TxCode
from consensus.validator.storage import (
    CorruptDatabase,
    ForeignDatabase,
    Storage,
    StorageError,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def grow(chain, storage, blocks, txs_per_block=5):
    for _ in range(blocks):
        txs = [chain.tx(ident(1 + i % 5), "transfer", {"to": ident(6).peer_id, "amount": 3})
               for i in range(txs_per_block)]
        led = chain.ledger
        block = build_block(CHAIN, led.height + 1, led.height, led.last_block_hash, led.app_hash,
                            chain.proposer_identity, led.beacon, [tx.raw for tx in txs])
        result = led.apply_block(block)
        chain.nonces.clear()
        storage.commit_block(block, result)
    return result


def test_commit_reopen_and_query(tmp_path):
    chain = Chain()
    path = str(tmp_path / "db")
    with Storage.open(path, chain.genesis) as storage:
        assert storage.height == 0
        assert storage.load_ledger().app_hash == chain.ledger.app_hash
        last = grow(chain, storage, 4)
        storage.wal_append(5, b"proposal")
        storage.wal_append(5, b"prevote")
        storage.save_signer_state(b"guard-state")
    with Storage.open(path, chain.genesis) as storage:
        assert storage.height == 4
        storage.check_integrity()
        ledger = storage.load_ledger()
        assert ledger.app_hash == chain.ledger.app_hash == last.app_hash
        assert ledger.full_state_hash() == chain.ledger.full_state_hash()
        block = storage.block_by_height(4)
        assert block.hash == last.block_hash == storage.block_by_hash(block.hash).hash
        assert storage.block_by_height(5) is None and storage.block_by_hash(b"\x00" * 32) is None
        receipt = storage.receipt(last.receipts[2].tx_hash)
        assert (receipt.height, receipt.index, receipt.code) == (4, 2, 0)
        assert storage.wal_records(5) == [b"proposal", b"prevote"]
        storage.wal_append(5, b"precommit")
        storage.wal_append(6, b"next")
        assert storage.wal_records(5) == [b"proposal", b"prevote", b"precommit"]
        storage.wal_prune(6)
        assert storage.wal_records(5) == [] and storage.wal_records(6) == [b"next"]
        assert storage.load_signer_state() == b"guard-state"
        with pytest.raises(StorageError, match="on top of"):
            storage.commit_block(block, last)


def test_verify_reads_recent_blocks_or_everything(tmp_path):
    chain = Chain()
    path = str(tmp_path / "db")
    with Storage.open(path, chain.genesis) as storage:
        grow(chain, storage, 12)
        storage.verify(5)
        storage.verify(None)
        assert storage.size_bytes() > 0
        storage._kv.write([(b"B/" + (12).to_bytes(8, "big"), None)])  # the last block lost
        storage.height = 12
        with pytest.raises(CorruptDatabase, match="block 12"):
            storage.verify(5)


def test_foreign_chain_or_genesis_is_refused(tmp_path):
    chain = Chain()
    path = str(tmp_path / "db")
    Storage.open(path, chain.genesis).close()
    other_chain = Genesis("another-chain", 0, chain.genesis.balances, chain.genesis.validators)
    with pytest.raises(ForeignDatabase, match="another-chain"):
        Storage.open(path, other_chain)
    same_id_other_genesis = Genesis(CHAIN, 0, {ident(1).peer_id: 5}, chain.genesis.validators)
    with pytest.raises(ForeignDatabase, match="genesis"):
        Storage.open(path, same_id_other_genesis)


def test_open_twice_is_a_clear_error(tmp_path):
    chain = Chain()
    path = str(tmp_path / "db")
    with Storage.open(path, chain.genesis):
        with pytest.raises(StorageError, match="in use"):
            Storage.open(path, chain.genesis)


def test_directory_that_is_not_a_database(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CorruptDatabase, match="not a RocksDB"):
        Storage.open(str(tmp_path), Chain().genesis)


def test_damaged_manifest_or_table_file_is_reported(tmp_path):
    chain = Chain()
    path = str(tmp_path / "db")
    with Storage.open(path, chain.genesis) as storage:
        grow(chain, storage, 30, txs_per_block=20)
    for name in glob.glob(os.path.join(path, "*.sst")) + glob.glob(os.path.join(path, "*.log")):
        data = bytearray(open(name, "rb").read())
        for i in range(64, len(data) - 64, 5):
            data[i] ^= 0x5A
        open(name, "wb").write(bytes(data))
    with pytest.raises(CorruptDatabase):
        storage = Storage.open(path, chain.genesis)
        try:
            storage.load_ledger()
            storage.check_integrity()
        finally:
            storage.close()
    current = os.path.join(path, "CURRENT")
    open(current, "w").write("MANIFEST-999999\n")
    with pytest.raises(CorruptDatabase):
        Storage.open(path, chain.genesis)


WRITER = r"""
import sys
from consensus.block import build_block
from consensus.validator.storage import Storage
from tests.consensus.test_ledger_kit import CHAIN, Chain, ident
chain = Chain()
storage = Storage.open(sys.argv[1], chain.genesis)
chain.ledger = storage.load_ledger()
print("ready", storage.height, flush=True)
while True:
    led = chain.ledger
    height = led.height + 1
    txs = [chain.tx(ident(1 + i % 5), "transfer", {"to": ident(6).peer_id, "amount": 1}).raw for i in range(10)]
    block = build_block(CHAIN, height, height, led.last_block_hash, led.app_hash, chain.proposer_identity,
                        led.beacon, txs)
    storage.wal_append(height, b"prevote-%d" % height)
    storage.save_signer_state(b"signed-%d" % height)
    result = led.apply_block(block)
    chain.nonces.clear()
    storage.commit_block(block, result)
    print("committed", height, flush=True)
"""


def test_recovery_after_sigkill_at_random_instants(tmp_path):
    kill_and_recover(tmp_path, kills=4, seed=1234)


@pytest.mark.slow
def test_recovery_after_many_sigkills(tmp_path):
    kill_and_recover(tmp_path, kills=60, seed=99)


def kill_and_recover(tmp_path, kills, seed):
    chain = Chain()
    path = str(tmp_path / "db")
    rng = random.Random(seed)
    last_told = 0
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path], cwd=ROOT,   # -c imports from the cwd
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("ready")
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
        complete_lines = out.split("\n")[:-1]  # the kill may cut the last line short
        told = [int(line.split()[1]) for line in complete_lines if line.startswith("committed ")]
        last_told = max([last_told] + told)
        with Storage.open(path, chain.genesis) as storage:
            storage.check_integrity()
            assert storage.height >= last_told  # nothing a client was told is lost
            ledger = storage.load_ledger()
            assert ledger.height == storage.height
            ledger.check_invariants()
            replay = Ledger.from_genesis(chain.genesis)  # replaying the stored blocks gives the stored state
            for height in range(1, storage.height + 1):
                replay.apply_block(storage.block_by_height(height))
            assert replay.app_hash == ledger.app_hash
            assert replay.full_state_hash() == ledger.full_state_hash()
            signer = storage.load_signer_state()
            assert signer is not None and int(signer.split(b"-")[1]) >= storage.height
            # the WAL record for a block is written before it commits (twice if a kill came between)
            records = storage.wal_records(storage.height)
            assert records and set(records) == {b"prevote-%d" % storage.height}
    assert last_told > 0


def test_replayed_transaction_does_not_hide_the_executed_receipt(tmp_path):
    chain = Chain()
    with Storage.open(str(tmp_path / "db"), chain.genesis) as storage:
        tx = chain.tx(ident(1), "transfer", {"to": ident(2).peer_id, "amount": 1})
        ahead = chain.tx(ident(3), "transfer", {"to": ident(2).peer_id, "amount": 1}, nonce=1)
        for txs in ([ahead.raw], [tx.raw, tx.raw], [tx.raw]):  # gap first, then a duplicate, then a replay
            led = chain.ledger
            block = build_block(CHAIN, led.height + 1, led.height, led.last_block_hash, led.app_hash,
                                chain.proposer_identity, led.beacon, txs)
            storage.commit_block(block, led.apply_block(block))
        receipt = storage.receipt(tx.hash)
        assert (receipt.height, receipt.index, receipt.code, receipt.executed) == (2, 0, 0, True)
        assert storage.receipt(ahead.hash).code == TxCode.NONCE_TOO_HIGH  # never executed: still reported
