"""Node storage: blocks, receipts, ledger state, consensus WAL, signer state, over a key-value store.

Production keeps it in RocksDB (``Storage.open``, rocksdict, via ``RocksKV``); the deterministic
simulator keeps it in memory (``Storage.create``, ``consensus.validator.memkv.MemoryKV``), so both run the
same code for everything above the key-value layer. A ``KV`` offers ``get``, ``write(ops, sync)``
(ops: ``(key, value)`` puts and ``(key, None)`` deletes, applied atomically), ``scan(prefix)``,
``last_key(prefix)``, ``delete_range(start, end, sync)``, ``is_empty()`` and ``close()``.

One database, key prefixes:
    M/<name>               meta: format, chain_id, genesis_hash, height, base (first stored block; 1 if absent)
    B/<height u64>         block bytes            H/<block hash>   height u64
    R/<tx hash>            the receipt (an executed one is never replaced by a later copy's)
    S/<state key>          ledger state (consensus.state.store keys)
    W/<height u64><seq u64> consensus write-ahead log records (opaque bytes)
    V/signer               signer (double-sign guard) state (opaque bytes)
    N/<height u64>         state snapshot manifest   K/<height u64><index u32>  its chunks (docs/adr/0199)

A committed block, its receipts, its state changes and the new height go in ONE
WriteBatch written with sync, so after a crash (kill -9 at any instant) the database is
at the previous or the new height, never between. WAL and signer writes are synced too.
Pruning (``prune_ops``) deletes the oldest blocks, their hash index, their receipts and WAL records and moves
``base`` up in that same batch, so a crash leaves either the old or the new retained range;
``block_by_height`` of a height below ``base`` is None and ``is_pruned`` says why.
Opening a database of another chain, or one that is damaged, raises a clear StorageError.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Protocol

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from consensus.block import Block, BlockError
from consensus.encoding import EncodingError, decode, encode
from consensus.genesis import Genesis
from consensus.state.ledger import BlockResult, Ledger, TxReceipt
from consensus.state.snapshot import Manifest, SnapshotError
from consensus.state.store import APP_HASH_KEY, LedgerState

FORMAT = 1
_META = b"M/"
_BLOCK, _BLOCK_HASH, _RECEIPT, _STATE, _WAL, _SIGNER = b"B/", b"H/", b"R/", b"S/", b"W/", b"V/signer"
_MANIFEST, _CHUNK = b"N/", b"K/"
_HOP, _HOP_PROOF = b"J/", b"P/"   # committee hop records, and the proof awaiting its epoch's last block
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


class KV(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def write(self, ops: list[tuple[bytes, bytes | None]], sync: bool = True) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def last_key(self, prefix: bytes) -> bytes | None: ...

    def delete_range(self, start: bytes, end: bytes, sync: bool = True) -> None: ...

    def is_empty(self) -> bool: ...

    def close(self) -> None: ...


class RocksKV:
    """``KV`` over a rocksdict ``Rdict`` (raw mode); synced writes fsync the WAL."""

    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def write(self, ops: list[tuple[bytes, bytes | None]], sync: bool = True) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in ops:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch, self._sync if sync else self._nosync)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()
        it.status()  # an iterator just stops at corruption unless its status is checked

    def last_key(self, prefix: bytes) -> bytes | None:
        it = self._db.iter()
        it.seek_for_prev(_prefix_end(prefix))
        key = it.key() if it.valid() else None
        it.status()
        return key if key is not None and key.startswith(prefix) else None

    def delete_range(self, start: bytes, end: bytes, sync: bool = True) -> None:
        self._db.delete_range(start, end, self._sync if sync else self._nosync)

    def is_empty(self) -> bool:
        it = self._db.iter()
        it.seek_to_first()
        has_data = it.valid()
        it.status()
        return not has_data

    def close(self) -> None:
        self._db.close()


class Storage:
    def __init__(self, path: str, kv: KV, genesis: Genesis):
        self.path = path
        self.genesis = genesis
        self._kv = kv
        self.height = self._meta_int(b"height")
        self.base = self._meta_int(b"base") if self._get(_META + b"base") is not None else 1
        last_wal = self._last_key(_WAL)
        self._wal_seq = int.from_bytes(last_wal[10:18], "big") + 1 if last_wal else 0

    # ---- open / close ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, genesis: Genesis) -> Storage:
        """Open (or create, writing the genesis state) the RocksDB database at ``path`` for ``genesis``."""
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
        return cls.create(path, RocksKV(db), genesis)

    @classmethod
    def create(cls, path: str, kv: KV, genesis: Genesis) -> Storage:
        """Storage over an open ``kv`` (written with the genesis state if empty); closes it on error.
        ``path`` only names the database in messages."""
        try:
            if kv.get(_META + b"chain_id") is None:
                if not kv.is_empty():
                    raise CorruptDatabase(f"{path} holds data but no dekube metadata")
                cls._write_genesis(kv, genesis)
            else:
                cls._check_identity(kv, path, genesis)
            storage = cls(path, kv, genesis)
            storage._check_consistency()
            return storage
        except StorageError:
            kv.close()
            raise
        except Exception as exc:  # checksum mismatches and I/O errors surface as bare Exceptions
            kv.close()
            raise CorruptDatabase(f"database at {path} is damaged: {exc}") from None

    @staticmethod
    def _write_genesis(kv: KV, genesis: Genesis) -> None:
        ops: list[tuple[bytes, bytes | None]] = [
            (_STATE + key, value) for key, value in Ledger.from_genesis(genesis).storage_items()]
        ops += [(_META + b"format", encode(FORMAT)), (_META + b"chain_id", genesis.chain_id.encode()),
                (_META + b"genesis_hash", genesis.hash), (_META + b"height", encode(0))]
        kv.write(ops, sync=True)

    @staticmethod
    def _check_identity(kv: KV, path: str, genesis: Genesis) -> None:
        chain_id = kv.get(_META + b"chain_id")
        if chain_id != genesis.chain_id.encode():
            raise ForeignDatabase(f"{path} holds chain {(chain_id or b'').decode(errors='replace')!r}, "
                                  f"not {genesis.chain_id!r}")
        stored_hash = kv.get(_META + b"genesis_hash")
        if stored_hash != genesis.hash:
            raise ForeignDatabase(f"{path} was created from another genesis of chain {genesis.chain_id!r} "
                                  f"(genesis hash {stored_hash.hex() if stored_hash else None} != "
                                  f"{genesis.hash.hex()})")
        fmt = kv.get(_META + b"format")
        if fmt is None or decode(fmt) != FORMAT:
            raise CorruptDatabase(f"{path} has unsupported storage format {fmt!r}")

    def _check_consistency(self) -> None:
        state_height = self._get(_STATE + b"meta/height")
        if state_height is None or decode(state_height) != self.height:
            raise CorruptDatabase(f"{self.path}: state height does not match block height {self.height}")
        if self.height >= self.base and self.block_by_height(self.height) is None:
            raise CorruptDatabase(f"{self.path}: block {self.height} is missing")

    def check_integrity(self) -> None:
        """Read every key (RocksDB verifies block checksums) and check that no block is missing."""
        expected = self.base
        for key, _ in self._scan(b""):
            if key.startswith(_BLOCK):
                if int.from_bytes(key[2:], "big") != expected:
                    raise CorruptDatabase(f"{self.path}: block {expected} is missing")
                expected += 1
        if expected - 1 != self.height:
            raise CorruptDatabase(f"{self.path}: blocks end at {expected - 1}, height is {self.height}")

    def verify(self, recent_blocks: int | None = None) -> None:
        """Read back what the node needs to run, so that RocksDB verifies the checksums of the table
        blocks holding it: metadata, ledger state, signer state, the WAL and the last
        ``recent_blocks`` blocks; every key (``check_integrity``) when ``recent_blocks`` is None.
        Raises CorruptDatabase naming what is damaged (docs/adr/0142)."""
        if recent_blocks is None:
            self.check_integrity()
            return
        for prefix in (_META, _STATE, _WAL, _SIGNER):
            for _ in self._scan(prefix):
                pass
        for height in range(max(self.base, self.height - recent_blocks + 1), self.height + 1):
            if self.block_by_height(height) is None:
                raise CorruptDatabase(f"{self.path}: block {height} is missing")

    def size_bytes(self) -> int:
        """The bytes of the files in the database directory (0 for an in-memory store)."""
        try:
            return sum(entry.stat().st_size for entry in os.scandir(self.path) if entry.is_file())
        except OSError:
            return 0

    def close(self) -> None:
        self._kv.close()

    def __enter__(self) -> Storage:
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
            return self._kv.get(key)
        except Exception as exc:  # rocksdict raises a bare Exception on checksum mismatches
            raise CorruptDatabase(f"{self.path}: reading {key[:2]!r} keys failed: {exc}") from None

    def _last_key(self, prefix: bytes) -> bytes | None:
        try:
            return self._kv.last_key(prefix)
        except Exception as exc:
            raise CorruptDatabase(f"{self.path}: scan failed: {exc}") from None

    def _scan(self, prefix: bytes):
        """Every (key, value) under ``prefix`` in key order; raises CorruptDatabase on damage."""
        try:
            yield from self._kv.scan(prefix)
        except Exception as exc:
            raise CorruptDatabase(f"{self.path}: scan failed: {exc}") from None

    # ---- blocks and state -----------------------------------------------------------------------

    def commit_block(self, block: Block, result: BlockResult,
                     extra_ops: list[tuple[bytes, bytes | None]] | None = None,
                     first_ops: list[tuple[bytes, bytes | None]] | None = None) -> None:
        """Atomically and durably store ``block``, its receipts and its state changes, with
        ``extra_ops`` (e.g. ``prune_ops``, ``wal_entries`` deletions) in the same batch, after
        ``first_ops`` (a restored state, which the block's changes then update)."""
        if block.height != self.height + 1:
            raise StorageError(f"commit of height {block.height} on top of height {self.height}")
        if result.block_hash != block.hash:
            raise StorageError("the execution result is not for this block")
        ops: list[tuple[bytes, bytes | None]] = list(first_ops or [])
        height_key = _u64(block.height)
        ops.append((_BLOCK + height_key, block.encode()))
        ops.append((_BLOCK_HASH + block.hash, height_key))
        written: set[bytes] = set()
        for receipt in result.receipts:
            # A copy of a transaction that did not execute (replayed bytes, a nonce gap) must not
            # hide the receipt of the one that did: only executed receipts overwrite.
            if not receipt.executed and (receipt.tx_hash in written or self._get(_RECEIPT + receipt.tx_hash)):
                continue
            written.add(receipt.tx_hash)
            ops.append((_RECEIPT + receipt.tx_hash, encode(receipt.to_obj())))
        ops += [(_STATE + key, value) for key, value in result.changes]
        ops.append((_META + b"height", encode(block.height)))
        ops += extra_ops or []
        self._kv.write(ops, sync=True)
        self.height = block.height
        for key, value in extra_ops or []:
            if key == _META + b"base" and value is not None:
                self.base = decode(value)

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

    def is_pruned(self, height: int) -> bool:
        """Was block ``height`` stored once and deleted by pruning (``base`` is the first kept)."""
        return 1 <= height < self.base

    def prune_ops(self, below: int, wal_below: int, limit: int) -> list[tuple[bytes, bytes | None]]:
        """The deletions that prune blocks (and their hash index) below ``below`` and WAL records
        of heights below ``wal_below``, at most ``limit`` blocks and ``limit`` WAL records per call
        (a node that turns pruning on catches up over several commits), with the new ``base``:
        for ``commit_block``'s batch. Empty when there is nothing to prune."""
        ops: list[tuple[bytes, bytes | None]] = []
        if wal_below <= 0 and below <= self.base:
            return ops
        new_base = min(below, self.base + limit, self.height + 1)
        for height in range(self.base, new_base):
            raw = self._get(_BLOCK + _u64(height))
            if raw is not None:
                try:
                    block = Block.decode(raw, MAX_BLOCK_BYTES_ON_DISK)
                except BlockError as exc:
                    raise CorruptDatabase(f"{self.path}: block {height} unreadable: {exc}") from None
                ops.append((_BLOCK_HASH + block.hash, None))
                ops.append((_BLOCK + _u64(height), None))
                ops += self._receipt_prune_ops(block)
        wal_end = _WAL + _u64(max(0, wal_below))
        for count, (key, _) in enumerate(self._scan(_WAL)):
            if key >= wal_end or count >= limit:
                break
            ops.append((key, None))
        if new_base > self.base:
            ops.append((_META + b"base", encode(new_base)))
        return ops

    def _receipt_prune_ops(self, block: Block) -> list[tuple[bytes, bytes | None]]:
        """Deletions of the receipts a pruned block's transactions left (docs/adr/0215); a receipt that a
        later block's executed copy of the same bytes wrote stays with that block."""
        ops: list[tuple[bytes, bytes | None]] = []
        for tx_hash in sorted({hashlib.sha256(raw).digest() for raw in block.txs}):
            receipt = self.receipt(tx_hash)
            if receipt is not None and receipt.height == block.header.height:
                ops.append((_RECEIPT + tx_hash, None))
        return ops

    def block_by_hash(self, block_hash: bytes) -> Block | None:
        height = self._get(_BLOCK_HASH + block_hash)
        return None if height is None else self.block_by_height(int.from_bytes(height, "big"))

    def receipt(self, tx_hash: bytes) -> TxReceipt | None:
        raw = self._get(_RECEIPT + tx_hash)
        return None if raw is None else TxReceipt.from_obj(decode(raw))

    # ---- state snapshots ----------------------------------------------------------------------

    def snapshot_heights(self) -> list[int]:
        """Heights of the stored state snapshots, oldest first."""
        return [int.from_bytes(key[2:], "big") for key, _ in self._scan(_MANIFEST)]

    def snapshot_manifest(self, height: int) -> Manifest | None:
        raw = self._get(_MANIFEST + _u64(height))
        if raw is None:
            return None
        try:
            return Manifest.decode(raw)
        except SnapshotError as exc:
            raise CorruptDatabase(f"{self.path}: snapshot manifest {height} unreadable: {exc}") from None

    def snapshot_chunk(self, height: int, index: int) -> bytes | None:
        if not 0 <= index < 2**32:
            return None
        return self._get(_CHUNK + _u64(height) + index.to_bytes(4, "big"))

    @staticmethod
    def snapshot_ops(manifest: Manifest, chunks: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        """The writes that store a snapshot (for ``commit_block``'s batch)."""
        prefix = _CHUNK + _u64(manifest.height)
        ops: list[tuple[bytes, bytes | None]] = [
            (prefix + i.to_bytes(4, "big"), chunk) for i, chunk in enumerate(chunks)]
        ops.append((_MANIFEST + _u64(manifest.height), manifest.encode()))
        return ops

    def drop_snapshot_ops(self, height: int) -> list[tuple[bytes, bytes | None]]:
        manifest = self.snapshot_manifest(height)
        count = len(manifest.chunk_hashes) if manifest is not None else 0
        prefix = _CHUNK + _u64(height)
        ops: list[tuple[bytes, bytes | None]] = [(prefix + i.to_bytes(4, "big"), None) for i in range(count)]
        return ops + [(_MANIFEST + _u64(height), None)]

    # ---- committee hops (consensus/committee_hops.py) -------------------------------------------

    def committee_hops(self, from_height: int, limit: int) -> list[int]:
        """Heights of the kept committee hop records from ``from_height`` on, at most ``limit``."""
        out: list[int] = []
        start = _HOP + _u64(from_height)
        for key, _ in self._scan(_HOP):
            if key < start:
                continue
            if len(out) >= limit:
                break
            out.append(int.from_bytes(key[2:], "big"))
        return out

    def committee_hop(self, height: int) -> bytes | None:
        return self._get(_HOP + _u64(height)) if 0 <= height < 2**64 else None

    def hop_proof(self, height: int) -> bytes | None:
        return self._get(_HOP_PROOF + _u64(height)) if 0 <= height < 2**64 else None

    @staticmethod
    def hop_ops(height: int, record: bytes | None) -> list[tuple[bytes, bytes | None]]:
        return [(_HOP + _u64(height), record)]

    @staticmethod
    def hop_proof_ops(height: int, proof: bytes | None) -> list[tuple[bytes, bytes | None]]:
        return [(_HOP_PROOF + _u64(height), proof)]

    def commit_restored(self, items: list[tuple[bytes, bytes]], app_hash: bytes, block: Block,
                        result: BlockResult, certificate_record: bytes,
                        extra_ops: list[tuple[bytes, bytes | None]] | None = None) -> None:
        """State sync's one write: replace the genesis state by a verified snapshot's ``items``
        (the state after block ``block.height - 1``, ``app_hash``) and commit ``block`` on top,
        with its certificate record, in ONE synced batch; no block is stored below it (``base``).
        A crash leaves the empty database or the restored one, never a state without its block."""
        if self.height != 0:
            raise StorageError(f"state sync needs an empty chain database, this one is at height {self.height}")
        ops: list[tuple[bytes, bytes | None]] = [(key, None) for key, _ in self._scan(_STATE)]
        ops += [(_STATE + key, value) for key, value in items]
        ops.append((_STATE + APP_HASH_KEY, encode(app_hash)))
        self.height = block.height - 1
        try:
            self.commit_block(block, result, [
                (_WAL + _u64(block.height) + _u64(self._wal_seq), bytes(certificate_record)),
                (_META + b"base", encode(block.height)), *(extra_ops or [])], first_ops=ops)
        except BaseException:
            self.height = 0
            raise
        self._wal_seq += 1

    # ---- consensus write-ahead log --------------------------------------------------------------

    def wal_append(self, height: int, record: bytes) -> None:
        """Durably append an opaque consensus record for ``height`` (fsync before returning)."""
        self._kv.write([(_WAL + _u64(height) + _u64(self._wal_seq), bytes(record))], sync=True)
        self._wal_seq += 1

    def wal_records(self, height: int) -> list[bytes]:
        """The records appended for ``height``, in append order."""
        return [value for _, value in self.wal_entries(height)]

    def wal_entries(self, height: int) -> list[tuple[bytes, bytes]]:
        """The (key, record) pairs appended for ``height``, in append order (a key, paired with
        None, deletes its record in ``commit_block``'s ``extra_ops``)."""
        return list(self._scan(_WAL + _u64(height)))

    def wal_prune(self, below_height: int) -> None:
        """Forget WAL records of heights below ``below_height`` (after those blocks committed)."""
        self._kv.delete_range(_WAL, _WAL + _u64(below_height), sync=True)

    # ---- signer state -----------------------------------------------------------------------------

    def save_signer_state(self, state: bytes) -> None:
        """Durably store the double-sign guard's state; call before sending what it signed."""
        self._kv.write([(_SIGNER, bytes(state))], sync=True)

    def load_signer_state(self) -> bytes | None:
        return self._get(_SIGNER)
