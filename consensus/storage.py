"""Node storage in RocksDB (rocksdict): blocks, receipts, ledger state, consensus WAL, signer state.

One database, key prefixes:
    M/<name>               meta: format, chain_id, genesis_hash, height
    B/<height u64>         block bytes            H/<block hash>   height u64
    R/<tx hash>            the receipt (an executed one is never replaced by a later copy's)
    S/<state key>          ledger state (consensus.state.store keys)
    W/<height u64><seq u64> consensus write-ahead log records (opaque bytes)
    V/signer               signer (double-sign guard) state (opaque bytes)

A committed block, its receipts, its state changes and the new height go in ONE
WriteBatch written with sync, so after a crash (kill -9 at any instant) the database is
at the previous or the new height, never between. WAL and signer writes are synced too.
Opening a database of another chain, or one that is damaged, raises a clear StorageError.
"""
from __future__ import annotations

import os

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from consensus.block import Block, BlockError
from consensus.encoding import EncodingError, decode, encode
from consensus.genesis import Genesis
from consensus.state.ledger import BlockResult, Ledger, TxReceipt
from consensus.state.store import LedgerState

FORMAT = 1
_META = b"M/"
_BLOCK, _BLOCK_HASH, _RECEIPT, _STATE, _WAL, _SIGNER = b"B/", b"H/", b"R/", b"S/", b"W/", b"V/signer"
MAX_BLOCK_BYTES_ON_DISK = 64 * 1024 * 1024


class StorageError(Exception):
    """The database cannot be used."""


class CorruptDatabase(StorageError):
    """The database is damaged or is not a dekube database."""


class ForeignDatabase(StorageError):
    """The database belongs to another chain (chain_id or genesis hash differ)."""


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class Storage:
    def __init__(self, path: str, db: Rdict, genesis: Genesis):
        self.path = path
        self.genesis = genesis
        self._db = db
        self._sync = WriteOptions()
        self._sync.sync = True
        self.height = self._meta_int(b"height")
        last_wal = self._last_key(_WAL)
        self._wal_seq = int.from_bytes(last_wal[10:18], "big") + 1 if last_wal else 0

    # ---- open / close ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, genesis: Genesis) -> "Storage":
        """Open (or create, writing the genesis state) the database at ``path`` for ``genesis``."""
        existed = os.path.isdir(path) and bool(os.listdir(path))
        if existed and not os.path.exists(os.path.join(path, "CURRENT")):
            raise CorruptDatabase(f"{path} is not empty and is not a RocksDB database")
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        try:
            db = Rdict(path, options)
        except Exception as exc:  # rocksdict raises a bare Exception for corruption and I/O errors
            if "LOCK" in str(exc) or "lock hold" in str(exc):
                raise StorageError(f"database at {path} is in use by another process: {exc}") from None
            raise CorruptDatabase(f"cannot open database at {path}: {exc}") from None
        try:
            if db.get(_META + b"chain_id") is None:
                it = db.iter()
                it.seek_to_first()
                has_data = it.valid()
                it.status()
                if has_data:
                    raise CorruptDatabase(f"{path} holds data but no dekube metadata")
                cls._write_genesis(db, genesis)
            else:
                cls._check_identity(db, path, genesis)
            storage = cls(path, db, genesis)
            storage._check_consistency()
            return storage
        except StorageError:
            db.close()
            raise
        except Exception as exc:  # checksum mismatches and I/O errors surface as bare Exceptions
            db.close()
            raise CorruptDatabase(f"database at {path} is damaged: {exc}") from None

    @staticmethod
    def _write_genesis(db: Rdict, genesis: Genesis) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in Ledger.from_genesis(genesis).storage_items():
            batch.put(_STATE + key, value)
        batch.put(_META + b"format", encode(FORMAT))
        batch.put(_META + b"chain_id", genesis.chain_id.encode())
        batch.put(_META + b"genesis_hash", genesis.hash)
        batch.put(_META + b"height", encode(0))
        sync = WriteOptions()
        sync.sync = True
        db.write(batch, sync)

    @staticmethod
    def _check_identity(db: Rdict, path: str, genesis: Genesis) -> None:
        chain_id = db.get(_META + b"chain_id")
        if chain_id != genesis.chain_id.encode():
            raise ForeignDatabase(f"{path} holds chain {chain_id.decode(errors='replace')!r}, "
                                  f"not {genesis.chain_id!r}")
        stored_hash = db.get(_META + b"genesis_hash")
        if stored_hash != genesis.hash:
            raise ForeignDatabase(f"{path} was created from another genesis of chain {genesis.chain_id!r} "
                                  f"(genesis hash {stored_hash.hex() if stored_hash else None} != "
                                  f"{genesis.hash.hex()})")
        fmt = db.get(_META + b"format")
        if fmt is None or decode(fmt) != FORMAT:
            raise CorruptDatabase(f"{path} has unsupported storage format {fmt!r}")

    def _check_consistency(self) -> None:
        state_height = self._get(_STATE + b"meta/height")
        if state_height is None or decode(state_height) != self.height:
            raise CorruptDatabase(f"{self.path}: state height does not match block height {self.height}")
        if self.height and self.block_by_height(self.height) is None:
            raise CorruptDatabase(f"{self.path}: block {self.height} is missing")

    def check_integrity(self) -> None:
        """Read every key (RocksDB verifies block checksums) and check that no block is missing."""
        expected = 1
        for key, _ in self._scan(b""):
            if key.startswith(_BLOCK):
                if int.from_bytes(key[2:], "big") != expected:
                    raise CorruptDatabase(f"{self.path}: block {expected} is missing")
                expected += 1
        if expected - 1 != self.height:
            raise CorruptDatabase(f"{self.path}: blocks end at {expected - 1}, height is {self.height}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- helpers ----------------------------------------------------------------------------------

    def _meta_int(self, name: bytes) -> int:
        raw = self._get(_META + name)
        if raw is None:
            raise CorruptDatabase(f"{self.path}: meta key {name.decode()} missing")
        try:
            value = decode(raw)
        except EncodingError as exc:
            raise CorruptDatabase(f"{self.path}: meta key {name.decode()} unreadable: {exc}") from None
        if type(value) is not int:
            raise CorruptDatabase(f"{self.path}: meta key {name.decode()} is not an integer")
        return value

    def _get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)
        except Exception as exc:  # rocksdict raises a bare Exception on checksum mismatches
            raise CorruptDatabase(f"{self.path}: reading {key[:2]!r} keys failed: {exc}") from None

    def _check_iterator(self, it) -> None:
        try:
            it.status()
        except Exception as exc:  # an iterator just stops at corruption unless its status is checked
            raise CorruptDatabase(f"{self.path}: scan failed: {exc}") from None

    def _last_key(self, prefix: bytes) -> bytes | None:
        it = self._db.iter()
        it.seek_for_prev(_prefix_end(prefix))
        key = it.key() if it.valid() else None
        self._check_iterator(it)
        return key if key is not None and key.startswith(prefix) else None

    def _scan(self, prefix: bytes):
        """Every (key, value) under ``prefix`` in key order; raises CorruptDatabase on damage."""
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()
        self._check_iterator(it)

    # ---- blocks and state -----------------------------------------------------------------------

    def commit_block(self, block: Block, result: BlockResult) -> None:
        """Atomically and durably store ``block``, its receipts and its state changes."""
        if block.height != self.height + 1:
            raise StorageError(f"commit of height {block.height} on top of height {self.height}")
        if result.block_hash != block.hash:
            raise StorageError("the execution result is not for this block")
        batch = WriteBatch(raw_mode=True)
        height_key = _u64(block.height)
        batch.put(_BLOCK + height_key, block.encode())
        batch.put(_BLOCK_HASH + block.hash, height_key)
        written: set[bytes] = set()
        for receipt in result.receipts:
            # A copy of a transaction that did not execute (replayed bytes, a nonce gap) must not
            # hide the receipt of the one that did: only executed receipts overwrite.
            if not receipt.executed and (receipt.tx_hash in written or self._get(_RECEIPT + receipt.tx_hash)):
                continue
            written.add(receipt.tx_hash)
            batch.put(_RECEIPT + receipt.tx_hash, encode(receipt.to_obj()))
        for key, value in result.changes:
            if value is None:
                batch.delete(_STATE + key)
            else:
                batch.put(_STATE + key, value)
        batch.put(_META + b"height", encode(block.height))
        self._db.write(batch, self._sync)
        self.height = block.height

    def load_ledger(self) -> Ledger:
        """The ledger state as of the last committed block."""
        items = ((key[len(_STATE):], value) for key, value in self._scan(_STATE))
        try:
            state = LedgerState.load(items)
        except (EncodingError, ValueError, TypeError, KeyError) as exc:
            raise CorruptDatabase(f"{self.path}: ledger state unreadable: {exc}") from None
        return Ledger(self.genesis, state)

    def block_by_height(self, height: int) -> Block | None:
        raw = self._get(_BLOCK + _u64(height))
        if raw is None:
            return None
        try:
            return Block.decode(raw, MAX_BLOCK_BYTES_ON_DISK)
        except BlockError as exc:
            raise CorruptDatabase(f"{self.path}: block {height} unreadable: {exc}") from None

    def block_by_hash(self, block_hash: bytes) -> Block | None:
        height = self._get(_BLOCK_HASH + block_hash)
        return None if height is None else self.block_by_height(int.from_bytes(height, "big"))

    def receipt(self, tx_hash: bytes) -> TxReceipt | None:
        raw = self._get(_RECEIPT + tx_hash)
        return None if raw is None else TxReceipt.from_obj(decode(raw))

    # ---- consensus write-ahead log --------------------------------------------------------------

    def wal_append(self, height: int, record: bytes) -> None:
        """Durably append an opaque consensus record for ``height`` (fsync before returning)."""
        self._db.put(_WAL + _u64(height) + _u64(self._wal_seq), bytes(record), self._sync)
        self._wal_seq += 1

    def wal_records(self, height: int) -> list[bytes]:
        """The records appended for ``height``, in append order."""
        return [value for _, value in self._scan(_WAL + _u64(height))]

    def wal_prune(self, below_height: int) -> None:
        """Forget WAL records of heights below ``below_height`` (after those blocks committed)."""
        self._db.delete_range(_WAL, _WAL + _u64(below_height), self._sync)

    # ---- signer state -----------------------------------------------------------------------------

    def save_signer_state(self, state: bytes) -> None:
        """Durably store the double-sign guard's state; call before sending what it signed."""
        self._db.put(_SIGNER, bytes(state), self._sync)

    def load_signer_state(self) -> bytes | None:
        return self._get(_SIGNER)
