"""State sync: a new node starts from a peer's state snapshot instead of replaying every block.

A snapshot of height ``S`` (consensus/state/snapshot.py) is anchored by block ``S + 1``, whose
header carries ``app_hash(S)``, the commitment to the whole state. The joining node:

1. follows the committee hops its sources keep (consensus/committee_hops.py) from the committee
   it trusts (the genesis committee) to the latest committee they certify, and keeps them to serve;
2. asks its sources which snapshots they hold and takes the highest height offered;
3. fetches the manifest and block ``S + 1`` with its certificate, and accepts them only if
   precommits for that block carry more than a third of the power of the committee reached in 1
   (at least one honest member signed, so the block is the chain's) and the manifest's app hash
   equals the header's;
4. fetches each chunk, checked against its hash in the manifest (size first, then hash, then
   format); a source that sends a bad chunk, an oversized one, or answers for another height is
   dropped with the reason and the chunk is asked of the next source;
5. loads the state, checks it is the state after block ``S`` (height, last block hash) and that
   its own committee for ``S + 1`` certifies block ``S + 1`` (more than two thirds), executes
   block ``S + 1`` and stores both in one batch (``Storage.commit_restored``);

then ``replay_blocks`` (or the node's block sync) applies the blocks after ``S + 1``, each
certificate checked against the committee of its height. A ``SnapshotSource`` is what a peer
serves (``StoreSource`` serves a ``ChainStore``); this module does no I/O of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from consensus.block import Block, BlockError
from consensus.committee import ValidatorSet
from consensus.committee_hops import MAX_HOPS, HopError, trusted_power, verify_hop
from consensus.genesis import Genesis
from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, value_id
from consensus.state.ledger import Ledger
from consensus.state.snapshot import Manifest, SnapshotError, check_chunk
from consensus.state.store import LedgerState
from consensus.tendermint import Commit
from consensus.validator.chainstore import CERTIFICATE_TAG, ChainStore, encode_certificate

MAX_OFFERS = 16   # snapshot heights read from one source


class StateSyncError(Exception):
    """State sync cannot finish; the message lists what each source did wrong."""


class SnapshotSource(Protocol):
    name: str

    def snapshots(self) -> list[int]: ...

    def manifest(self, height: int) -> bytes | None: ...

    def block(self, height: int) -> Commit | None: ...

    def chunk(self, height: int, index: int) -> bytes | None: ...

    def hops(self) -> list[int]: ...

    def hop(self, height: int) -> bytes | None: ...


class StoreSource:
    """What a node serves to joining peers from its ``ChainStore``."""

    def __init__(self, name: str, store: ChainStore):
        self.name, self.store = name, store

    def snapshots(self) -> list[int]:
        return self.store.storage.snapshot_heights()

    def manifest(self, height: int) -> bytes | None:
        manifest = self.store.storage.snapshot_manifest(height)
        return None if manifest is None else manifest.encode()

    def block(self, height: int) -> Commit | None:
        return self.store.stored_commit(height)

    def chunk(self, height: int, index: int) -> bytes | None:
        return self.store.storage.snapshot_chunk(height, index)

    def hops(self) -> list[int]:
        return self.store.storage.committee_hops(0, MAX_HOPS)

    def hop(self, height: int) -> bytes | None:
        return self.store.storage.committee_hop(height)


@dataclass
class SyncReport:
    height: int                      # the node's height after state sync (S + 1)
    snapshot_height: int
    chunks: int
    state_bytes: int
    rejected: dict[str, str] = field(default_factory=dict)   # source -> why it was dropped
    hops: int = 0                    # committee hops followed from the trusted committee


def left_behind(sources: list[SnapshotSource], trusted: ValidatorSet, chain_id: str, next_height: int) -> int | None:
    """The snapshot a node whose next block is ``next_height`` should join from, when its peers pruned
    that block (docs/adr/0214); else None (block sync works, or nobody is ahead). A source that answers
    no snapshot list (unreachable) costs one request; every other is asked for block ``next_height``, and
    one that serves it means block sync works. A claimed snapshot counts only when its next block
    carries a third of ``trusted``'s power, so a peer that lies about heights or withholds blocks cannot
    make a node set its database aside while the chain has not left it behind."""
    claims: list[tuple[int, SnapshotSource]] = []
    for source in sources:
        heights = source.snapshots()
        if not heights:
            continue
        if source.block(next_height) is not None:
            return None
        if max(heights) > next_height:
            claims.append((max(heights), source))
    for height, source in sorted(claims, key=lambda claim: -claim[0]):
        anchor = source.block(height + 1)
        if anchor is not None and trusted.is_one_third(
                trusted_power(trusted, chain_id, height + 1, value_id(anchor.value), anchor.certificate)):
            return height
    return None


def verify_anchor(genesis: Genesis, trusted: ValidatorSet, height: int, manifest_raw: bytes,
                  anchor: Commit) -> tuple[Manifest, Block]:
    """The manifest of the snapshot at ``height`` and block ``height + 1``, if they are the chain's."""
    manifest = Manifest.decode(manifest_raw)
    if manifest.height != height:
        raise SnapshotError(f"sent the manifest of height {manifest.height} when asked for {height}")
    if anchor.height != height + 1:
        raise SnapshotError(f"sent block {anchor.height} when asked for {height + 1}")
    try:
        block = Block.decode(anchor.value, MAX_PROPOSAL_VALUE_BYTES)
    except BlockError as exc:
        raise SnapshotError(f"sent an undecodable block {height + 1}: {exc}") from None
    if block.header.height != height + 1 or block.header.chain_id != genesis.chain_id:
        raise SnapshotError(f"sent block {block.header.height} of chain {block.header.chain_id!r} as {height + 1}")
    power = trusted_power(trusted, genesis.chain_id, height + 1, value_id(anchor.value), anchor.certificate)
    if not trusted.is_one_third(power):
        raise SnapshotError(f"block {height + 1} is not signed by a third of the trusted committee's power "
                            f"({power} of {trusted.total_power})")
    if manifest.app_hash != block.header.app_hash:
        raise SnapshotError(f"the manifest of height {height} does not match the app hash of block {height + 1}")
    return manifest, block


def _fetch_chunks(manifest: Manifest, sources: list[SnapshotSource], rejected: dict[str, str]) -> list[bytes]:
    chunks: list[bytes] = []
    for index in range(len(manifest.chunk_hashes)):
        for source in sources:
            if source.name in rejected:
                continue
            raw = source.chunk(manifest.height, index)
            if raw is None:
                continue   # it may have dropped the snapshot meanwhile: not hostile
            try:
                check_chunk(manifest, index, raw)
            except SnapshotError as exc:
                rejected[source.name] = str(exc)
                continue
            chunks.append(raw)
            break
        else:
            raise StateSyncError(f"no source served chunk {index} of the snapshot of height {manifest.height}; "
                                 f"rejected: {rejected or 'none'}")
    return chunks


def follow_hops(genesis: Genesis, trusted: ValidatorSet, sources: list[SnapshotSource],
                rejected: dict[str, str]) -> tuple[list[ValidatorSet], list[tuple[int, bytes]]]:
    """The committees the ``sources``' committee hops lead to from ``trusted`` (oldest first, each
    deciding from its ``start_height``: ``committee_at`` picks one), and the hop records followed.
    A source whose record does not verify, or that lists a hop it then does not serve, is dropped
    (``rejected``); a hop nobody serves verifiably is skipped (the next one is then checked against
    the committee before it, which must still carry a third)."""
    listed = {source.name: set(source.hops()[:MAX_HOPS]) for source in sources}
    heights = sorted({h for hs in listed.values() for h in hs if type(h) is int and h > 0})[:MAX_HOPS]
    followed: list[tuple[int, bytes]] = []
    committees = [trusted]
    for height in heights:
        if height < trusted.start_height:
            continue   # before the committee we trust already
        for source in sources:
            if source.name in rejected or height not in listed[source.name]:
                continue
            raw = source.hop(height)
            try:
                if raw is None:
                    raise HopError(f"listed committee hop {height} and did not serve it")
                trusted = verify_hop(genesis.chain_id, genesis.params.epoch_length, trusted, height, raw)
            except HopError as exc:
                rejected[source.name] = str(exc)
                continue
            followed.append((height, raw))
            committees.append(trusted)
            break
    return committees, followed


def committee_at(committees: list[ValidatorSet], height: int) -> ValidatorSet:
    """The committee of ``height`` among ``committees`` (oldest first, as ``follow_hops`` returns)."""
    return next((c for c in reversed(committees) if c.start_height <= height), committees[0])


def state_sync(store: ChainStore, trusted: ValidatorSet, sources: list[SnapshotSource]) -> tuple[Ledger, SyncReport]:
    """Bring an empty ``store`` to the height after the best snapshot the ``sources`` offer; the
    ledger and a report. Raises StateSyncError naming each source's fault when none works."""
    genesis = store.storage.genesis
    rejected: dict[str, str] = {}
    committees, hops = follow_hops(genesis, trusted, sources, rejected)
    offers = sorted({h for s in sources for h in s.snapshots()[-MAX_OFFERS:] if type(h) is int and h > 0},
                    reverse=True)
    for height in offers:
        for source in sources:
            if source.name in rejected or height not in source.snapshots():
                continue
            manifest_raw, anchor = source.manifest(height), source.block(height + 1)
            if manifest_raw is None or anchor is None:
                continue   # the tip's snapshot (its next block not decided yet), or dropped since: not hostile
            try:
                manifest, block = verify_anchor(genesis, committee_at(committees, height + 1), height,
                                                manifest_raw, anchor)
            except SnapshotError as exc:
                rejected[source.name] = str(exc)
                continue
            chunks = _fetch_chunks(manifest, [source, *sources], rejected)
            ledger = _restore(store, manifest, chunks, block, anchor, hops)
            return ledger, SyncReport(ledger.height, height, len(chunks), sum(map(len, chunks)), rejected, len(hops))
    raise StateSyncError(f"no usable snapshot among {len(sources)} sources; rejected: {rejected or 'none'}")


def _restore(store: ChainStore, manifest: Manifest, chunks: list[bytes], block: Block, anchor,
             hops: list[tuple[int, bytes]]) -> Ledger:
    genesis = store.storage.genesis
    items = [item for index, raw in enumerate(chunks) for item in check_chunk(manifest, index, raw)]
    if any(items[i][0] >= items[i + 1][0] for i in range(len(items) - 1)):
        raise StateSyncError(f"the snapshot of height {manifest.height} is not sorted by key")
    try:
        state = LedgerState.load(items)
    except (ValueError, TypeError, KeyError) as exc:
        raise StateSyncError(f"the snapshot of height {manifest.height} does not load: {exc}") from None
    state.app_hash = manifest.app_hash
    ledger = Ledger(genesis, state)
    if ledger.height != manifest.height or ledger.last_block_hash != block.header.prev_hash:
        raise StateSyncError(f"the snapshot's state is at height {ledger.height}, not after block {manifest.height}")
    committee = store.committee_for(manifest.height + 1, ledger)   # records the epoch's committee
    if not committee.verify_commit(genesis.chain_id, manifest.height + 1, value_id(anchor.value), anchor.certificate):
        raise StateSyncError(f"block {manifest.height + 1} is not certified by the snapshot's own committee")
    try:
        result = ledger.apply_block(block)
    except BlockError as exc:
        raise StateSyncError(f"block {block.height} does not apply to the snapshot: {exc}") from None
    store.storage.commit_restored(items, manifest.app_hash, block, result,
                                  CERTIFICATE_TAG + encode_certificate(anchor.certificate),
                                  store.restored_hop_ops(hops, result))
    return ledger


def replay_blocks(store: ChainStore, ledger: Ledger, source: SnapshotSource, to_height: int) -> int:
    """Apply the source's blocks after ``ledger.height`` up to ``to_height``, each certificate checked
    against the committee of its height (block sync without the network); the height reached."""
    chain_id = store.storage.genesis.chain_id
    while ledger.height < to_height:
        height = ledger.height + 1
        commit = source.block(height)
        if commit is None:
            break
        committee = store.committee_for(height, ledger)
        if commit.height != height or not committee.verify_commit(chain_id, height, value_id(commit.value),
                                                                  commit.certificate):
            raise StateSyncError(f"{source.name}: block {height} has no valid certificate")
        block = Block.decode(commit.value, MAX_PROPOSAL_VALUE_BYTES)
        store.save_certificate(height, commit.certificate)
        store.commit(block, ledger.apply_block(block))
    return ledger.height
