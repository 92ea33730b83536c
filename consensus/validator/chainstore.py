"""What a validator keeps beside blocks and state: commit certificates and epoch committees, and
what it prunes.

Both go in the consensus WAL of ``Storage`` (``W/<height>/<seq>`` records, opaque to it):
``C`` + certificate (the precommits that committed block ``height``), written (synced) before the
block itself, so a stored block always has its certificate; ``S`` + committee, written at the first
height of each epoch. A certificate is stored once: block ``h + 1`` carries the certificate of
``h`` (its ``last_commit``, checked before it was committed), so ``commit`` deletes the ``C``
record of ``h - 1`` in the batch that stores block ``h``; only the tip's certificate is a record.
With ``retain_blocks`` set, ``commit`` also prunes blocks older than the last ``retain_blocks``
and WAL records below them (never the committee records of the tip's epoch), a bounded number
per commit, in that same batch (docs/adr/0199). At snapshot heights (consensus/state/snapshot.py)
``commit`` stores the state's chunks too and drops all but the last ``KEEP_SNAPSHOTS``; blocks
from the oldest kept snapshot's next block on are never pruned, so peers can state-sync from it.
Where an epoch's committee differs from the one before, ``commit`` keeps a committee hop record
(consensus/committee_hops.py), never pruned, so a joining node can follow committees from genesis.

The committee of heights ``E+1 .. E+L`` (``L`` = epoch length) is the top-K bonded validators of
the state after block ``E - 1``, seated by block ``E`` (docs/adr/0216); a node restarted mid-epoch
reads it back from the WAL (the state of block ``E`` is gone by then), a node replaying blocks
reads it from the ledger at ``E``.
"""
from __future__ import annotations

from consensus.block import Block
from consensus.certificate import (  # noqa: F401  (re-exported: the validator's certificate API)
    MAX_CERTIFICATE_BYTES,
    CertificateError,
    decode_certificate,
    encode_certificate,
)
from consensus.committee import ValidatorSet
from consensus.committee_hops import encode_hop
from consensus.encoding import EncodingError, decode, encode
from consensus.state.ledger import Ledger
from consensus.tendermint import Commit
from consensus.validator.storage import CorruptDatabase, Storage

CERTIFICATE_TAG = b"C"
COMMITTEE_TAG = b"S"
PRUNE_PER_COMMIT = 256   # blocks (and WAL records) pruned at most per commit
KEEP_SNAPSHOTS = 2       # state snapshots kept (with the blocks from the oldest one's next block)


def epoch_start(height: int, epoch_length: int) -> int:
    """The state height ``E`` whose stakes elect the committee of ``height`` (>= 1)."""
    return (height - 1) // epoch_length * epoch_length


class ChainStore:
    """Storage plus certificates and committees; all methods block (run them off the event loop)."""

    def __init__(self, storage: Storage, retain_blocks: int = 0):
        self.storage = storage
        self.params = storage.genesis.params
        self.retain_blocks = retain_blocks   # 0: keep every block

    def save_certificate(self, height: int, votes) -> bytes:
        raw = encode_certificate(votes)
        self.storage.wal_append(height, CERTIFICATE_TAG + raw)
        return raw

    def commit(self, block: Block, result) -> None:
        """Store ``block`` (its certificate saved before): drop the certificate record of the
        previous height, which ``block.last_commit`` now carries, and prune what retention allows."""
        ops: list[tuple[bytes, bytes | None]] = [
            (key, None) for key, record in self.storage.wal_entries(block.height - 1)
            if record[:1] == CERTIFICATE_TAG and block.last_commit]
        if result.snapshot is not None:
            manifest, chunks = result.snapshot
            ops += self.storage.snapshot_ops(manifest, chunks)
            kept = self.storage.snapshot_heights() + [manifest.height]
            for old in kept[:-KEEP_SNAPSHOTS]:
                ops += self.storage.drop_snapshot_ops(old)
            kept = kept[-KEEP_SNAPSHOTS:]
        else:
            kept = self.storage.snapshot_heights()
        ops += self._hop_ops(block, result)
        if self.retain_blocks:
            below = block.height - self.retain_blocks + 1
            if kept:   # a snapshot is served with its next block (whose header commits it)
                below = min(below, kept[0] + 1)
            wal_below = min(below, epoch_start(block.height, self.params.epoch_length) + 1)
            ops += self.storage.prune_ops(below, wal_below, PRUNE_PER_COMMIT)
        self.storage.commit_block(block, result, ops)

    def certificate_bytes(self, height: int) -> bytes | None:
        """The certificate of ``height`` (encoded): the next block's ``last_commit``, else the
        record saved when it committed (the tip's); None if neither is stored."""
        following = self.storage.block_by_height(height + 1) if height < self.storage.height else None
        if following is not None and following.last_commit:
            return following.last_commit
        found = None
        for record in self.storage.wal_records(height):
            if record[:1] == CERTIFICATE_TAG:
                found = record[1:]
        return found

    def stored_commit(self, height: int) -> Commit | None:
        """Block ``height`` with its certificate, for peers that sync; None if either is missing."""
        block = self.storage.block_by_height(height)
        cert = self.certificate_bytes(height) if block is not None else None
        if block is None or cert is None:
            return None
        votes = decode_certificate(cert)
        return Commit(height, votes[0].round if votes else 0, block.encode(), votes)

    def _hop_ops(self, block: Block, result) -> list[tuple[bytes, bytes | None]]:
        """Keep the committee proof of a block that elected a new committee until the epoch's last
        block is certified (block ``S + 1`` carries its certificate), then the hop record of ``S``
        (consensus/committee_hops.py); hop records are never pruned."""
        ops: list[tuple[bytes, bytes | None]] = []
        if result.committee_proof is not None:
            ops += self.storage.hop_proof_ops(block.height, encode(result.committee_proof))
        last = block.height - 1   # the block whose certificate ``block`` carries
        if last >= 1 and last % self.params.epoch_length == 0 and block.last_commit:
            proof = self.storage.hop_proof(last - 1)
            previous = self.storage.block_by_height(last)
            if proof is not None and previous is not None:
                ops += self.storage.hop_ops(last, encode_hop(last, previous.encode(), block.last_commit, decode(proof)))
                ops += self.storage.hop_proof_ops(last - 1, None)
        return ops

    def restored_hop_ops(self, hops: list[tuple[int, bytes]], result) -> list[tuple[bytes, bytes | None]]:
        """State sync's writes of the hop records it followed, and the anchor block's committee proof."""
        ops = [op for height, record in hops for op in self.storage.hop_ops(height, record)]
        if result.committee_proof is not None:
            ops += self.storage.hop_proof_ops(result.height, encode(result.committee_proof))
        return ops

    def committee_for(self, height: int, ledger: Ledger) -> ValidatorSet:
        """The committee of ``height``; ``ledger`` must be at ``height - 1``."""
        start = epoch_start(height, self.params.epoch_length)
        for record in self.storage.wal_records(start + 1):
            if record[:1] == COMMITTEE_TAG:
                return self._decode_committee(record[1:], start + 1)
        if ledger.height != start:
            raise CorruptDatabase(f"{self.storage.path}: committee of epoch starting at {start + 1} not stored")
        committee = ledger.committee()   # seated at the end of block ``start`` (elected a block before)
        self.storage.wal_append(start + 1, COMMITTEE_TAG + encode([[pid, power] for pid, power in committee.items()]))
        return committee

    def _decode_committee(self, raw: bytes, start_height: int) -> ValidatorSet:
        try:
            items = decode(raw)
            return ValidatorSet.of(items, start_height)
        except (EncodingError, ValueError, TypeError) as exc:
            raise CorruptDatabase(f"{self.storage.path}: stored committee unreadable: {exc}") from None

    def block(self, height: int) -> Block | None:
        return self.storage.block_by_height(height)
