"""An in-memory ``KV`` for ``consensus.validator.storage.Storage``: what a simulated node keeps on its "disk".

Keys stay sorted (bisect) so prefix scans are ordered as in RocksDB. Writes made with
``sync=False`` sit in a volatile overlay that reads see but ``crash()`` discards; synced writes
(everything ``Storage`` writes) survive. ``before_write``, if set, is called with each batch before
it is applied; the simulator uses it to crash a node at a write boundary (it raises, and the batch
is then not applied at all: batches are atomic, as RocksDB's).
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

_GONE = object()


class MemoryKV:
    def __init__(self) -> None:
        self._durable: dict[bytes, bytes] = {}
        self._volatile: dict[bytes, object] = {}  # unsynced: value, or _GONE for a delete
        self._keys: list[bytes] = []  # sorted keys visible to reads
        self.before_write: Callable[[list[tuple[bytes, bytes | None]]], None] | None = None
        self.closed = False

    # ---- reads --------------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        value = self._volatile.get(key)
        if value is not None:
            return None if value is _GONE else value  # type: ignore[return-value]
        return self._durable.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._check_open()
        i = bisect.bisect_left(self._keys, prefix)
        keys = self._keys
        while i < len(keys) and keys[i].startswith(prefix):
            key = keys[i]
            value = self.get(key)
            if value is not None:
                yield key, value
            i += 1

    def last_key(self, prefix: bytes) -> bytes | None:
        self._check_open()
        end = bisect.bisect_left(self._keys, _prefix_end(prefix))
        if end and self._keys[end - 1].startswith(prefix):
            return self._keys[end - 1]
        return None

    def is_empty(self) -> bool:
        return not self._keys

    # ---- writes -------------------------------------------------------------------------------
    def write(self, ops: list[tuple[bytes, bytes | None]], sync: bool = True) -> None:
        self._check_open()
        if self.before_write is not None:
            self.before_write(ops)
        for key, value in ops:
            if value is None:
                if self.get(key) is not None:
                    del self._keys[bisect.bisect_left(self._keys, key)]
                self._volatile[key] = _GONE
            else:
                if self.get(key) is None:
                    bisect.insort(self._keys, key)
                self._volatile[key] = bytes(value)
        if sync:
            self.sync()

    def delete_range(self, start: bytes, end: bytes, sync: bool = True) -> None:
        lo, hi = bisect.bisect_left(self._keys, start), bisect.bisect_left(self._keys, end)
        self.write([(key, None) for key in self._keys[lo:hi]], sync)

    def sync(self) -> None:
        """Make every write so far durable (fsync)."""
        for key, value in self._volatile.items():
            if value is _GONE:
                self._durable.pop(key, None)
            else:
                self._durable[key] = value  # type: ignore[assignment]
        self._volatile.clear()

    # ---- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True

    def crash(self) -> None:
        """Power loss: unsynced writes are gone; the store can be opened again (``reopen``)."""
        self._volatile.clear()
        self._keys = sorted(self._durable)
        self.closed = True

    def reopen(self) -> None:
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the key-value store is closed")


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])
