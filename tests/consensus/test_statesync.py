"""State sync (docs/adr/0199): a new node restores the state of a snapshot height from peers' chunks,
anchored by the next block's certified app hash, then replays the rest and matches a node that
replayed every block; hostile peers (wrong chunk, oversized chunk, wrong height, a forged chain)
are dropped with the reason and the chunks come from another peer."""
import dataclasses

import pytest

from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.state import snapshot
from consensus.state.snapshot import MAX_CHUNK_BYTES
from consensus.statesync import StateSyncError, StoreSource, left_behind, replay_blocks, state_sync
from consensus.tx import build_tx
from consensus.validator.chainstore import ChainStore
from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import Storage
from node.identity import Identity

VALS = [Identity.from_seed(bytes([110 + i]) * 32) for i in range(3)]
FORGERS = [Identity.from_seed(bytes([140 + i]) * 32) for i in range(3)]
USERS = [Identity.from_seed(bytes([170 + i]) * 32) for i in range(6)]


def genesis_of(validators):
    return Genesis("statesync-test", 0, {u.peer_id: 10**9 for u in USERS},
                   tuple(GenesisValidator(v.peer_id, 2000 + i) for i, v in enumerate(validators)),
                   Params(committee_size=3, epoch_length=4, min_fee=0))


GENESIS = genesis_of(VALS)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(snapshot, "CHUNK_BYTES", 300)   # many chunks from a small state


def build_chain(blocks, validators=VALS, genesis=GENESIS):
    """A validator's store after ``blocks`` blocks of transfers, each certified by ``validators``."""
    store = ChainStore(Storage.create("source", MemoryKV(), genesis))
    ledger = store.storage.load_ledger()
    store.committee_for(1, ledger)
    cert, nonces = b"", {}
    for height in range(1, blocks + 1):
        txs = []
        for i in range(3):
            sender, to = USERS[(height + i) % 6], USERS[(height + 2 * i + 1) % 6]
            nonce = nonces.get(sender.peer_id, 0)
            nonces[sender.peer_id] = nonce + 1
            txs.append(build_tx(sender, genesis.chain_id, nonce, "transfer", {"to": to.peer_id, "amount": height}).raw)
        block = build_block(genesis.chain_id, height, height, ledger.last_block_hash, ledger.app_hash,
                            validators[0], ledger.beacon, txs, (), cert)
        vid = value_id(block.encode())
        votes = [sign_vote(v, genesis.chain_id, Vote(VoteType.PRECOMMIT, height, 0, vid, v.peer_id))
                 for v in validators]
        cert = store.save_certificate(height, votes)
        store.commit(block, ledger.apply_block(block))
        store.committee_for(height + 1, ledger)
    return store, ledger


def fresh():
    store = ChainStore(Storage.create("joiner", MemoryKV(), GENESIS))
    return store, store.committee_for(1, store.storage.load_ledger())


class BadChunk(StoreSource):
    def chunk(self, height, index):
        raw = super().chunk(height, index)
        return raw[:-1] + bytes([raw[-1] ^ 1])


class Oversized(StoreSource):
    def chunk(self, height, index):
        return b"\x00" * (MAX_CHUNK_BYTES + 1)


class WrongHeight(StoreSource):
    def manifest(self, height):
        return super().manifest(next(h for h in self.snapshots() if h != height))


def test_a_new_node_state_syncs_then_replays_and_matches_a_full_replay():
    source, source_ledger = build_chain(30)
    assert source.storage.snapshot_heights() == [24, 28]
    store, trusted = fresh()
    ledger, report = state_sync(store, trusted, [StoreSource("honest", source)])
    assert (report.snapshot_height, report.height, report.rejected) == (28, 29, {})
    assert report.chunks > 3                       # bounded chunks, each checked
    stored = Storage.create("joiner", store.storage._kv, GENESIS).load_ledger()   # what a restart reads
    assert stored.height == 29 and stored.full_state_hash() == ledger.full_state_hash()
    assert stored.app_hash == ledger.app_hash == source.block(30).header.app_hash
    assert replay_blocks(store, ledger, StoreSource("honest", source), 30) == 30
    assert ledger.app_hash == source_ledger.app_hash
    assert ledger.full_state_hash() == source_ledger.full_state_hash()
    storage = store.storage
    assert (storage.base, storage.height) == (29, 30) and storage.is_pruned(28)
    # the restored database reopens and goes on (committees read back from its WAL)
    again = ChainStore(Storage.create("joiner", storage._kv, GENESIS))
    reloaded = again.storage.load_ledger()
    assert reloaded.app_hash == source_ledger.app_hash
    assert again.committee_for(31, reloaded) == source.committee_for(31, source_ledger)
    # and a full replay from genesis reaches the same state
    replayer, _ = fresh()
    replayed = replayer.storage.load_ledger()
    replay_blocks(replayer, replayed, StoreSource("honest", source), 30)
    assert replayed.app_hash == ledger.app_hash


def test_hostile_chunks_are_rejected_with_the_reason_and_fetched_from_another_peer():
    source, source_ledger = build_chain(12)
    store, trusted = fresh()
    sources = [BadChunk("bad-hash", source), Oversized("oversized", source), StoreSource("honest", source)]
    ledger, report = state_sync(store, trusted, sources)
    assert report.height == 9
    assert "does not match its hash" in report.rejected["bad-hash"]
    assert "exceeds the" in report.rejected["oversized"]
    assert "honest" not in report.rejected
    replay_blocks(store, ledger, sources[2], 12)
    assert ledger.full_state_hash() == source_ledger.full_state_hash()


def test_a_wrong_height_and_a_forged_chain_are_refused():
    source, _ = build_chain(12)
    forged, _ = build_chain(16, FORGERS, dataclasses.replace(genesis_of(FORGERS), chain_id=GENESIS.chain_id))
    store, trusted = fresh()
    sources = [StoreSource("forged", forged), WrongHeight("wrong-height", source), StoreSource("honest", source)]
    ledger, report = state_sync(store, trusted, sources)
    assert report.snapshot_height == 8
    assert "not signed by a third of the trusted committee" in report.rejected["forged"]
    assert "manifest of height 12 when asked for 8" in report.rejected["wrong-height"]

    alone, trusted = fresh()
    with pytest.raises(StateSyncError, match="no usable snapshot.*forged.*trusted committee"):
        state_sync(alone, trusted, [StoreSource("forged", forged), BadChunk("bad-hash", forged)])
    assert alone.storage.height == 0          # nothing was written


def test_a_crash_at_the_restore_leaves_an_empty_database_that_syncs_again():
    source, source_ledger = build_chain(10)
    kv = MemoryKV()
    store = ChainStore(Storage.create("joiner", kv, GENESIS))
    trusted = store.committee_for(1, store.storage.load_ledger())

    def crash(ops):   # at the write of the anchor block: the restored state must not be left without it
        if any(key.startswith(b"B/") for key, _ in ops):
            raise OSError("power loss")
    kv.before_write = crash
    with pytest.raises(OSError):
        state_sync(store, trusted, [StoreSource("honest", source)])
    kv.before_write = None
    kv.crash()
    kv.reopen()
    again = ChainStore(Storage.create("joiner", kv, GENESIS))
    assert (again.storage.height, again.storage.base) == (0, 1) and again.storage.load_ledger().height == 0
    ledger, report = state_sync(again, trusted, [StoreSource("honest", source)])
    assert report.height == 9 and replay_blocks(again, ledger, StoreSource("honest", source), 10) == 10
    assert ledger.app_hash == source_ledger.app_hash


def test_only_an_empty_database_is_restored():
    source, _ = build_chain(9)
    store, trusted = build_chain(2)
    with pytest.raises(Exception, match="empty chain database"):
        state_sync(store, fresh()[1], [StoreSource("honest", source)])


class Liar(StoreSource):
    """A peer that claims a snapshot far ahead and withholds every block (docs/adr/0214)."""

    def snapshots(self):
        return [10**9]

    def block(self, height):
        return None


class Pruned(StoreSource):
    """An honest peer that no longer keeps blocks below ``base``."""

    def __init__(self, name, store, base):
        super().__init__(name, store)
        self.base = base

    def block(self, height):
        return super().block(height) if height >= self.base else None


def test_a_node_is_left_behind_only_when_a_certified_snapshot_is_past_blocks_nobody_keeps():
    store, _ = build_chain(13)
    joiner, trusted = fresh()
    top = store.storage.snapshot_heights()[-1]
    # honest peers that pruned block 3: join from their latest snapshot
    assert left_behind([Pruned("a", store, 10), Pruned("b", store, 10)], trusted, GENESIS.chain_id, 3) == top
    # a liar alone cannot make a node set its database aside: its claimed snapshot has no certified block
    assert left_behind([Liar("liar", store)], trusted, GENESIS.chain_id, 3) is None
    # ... nor beside an honest peer that still serves the node's next block
    assert left_behind([Liar("liar", store), StoreSource("honest", store)], trusted, GENESIS.chain_id, 3) is None
    # beside honest peers that pruned it, the liar's claim is skipped for the certified one
    assert left_behind([Liar("liar", store), Pruned("a", store, 10)], trusted, GENESIS.chain_id, 3) == top
    # a node at the tip is not behind
    assert left_behind([Pruned("a", store, 10)], trusted, GENESIS.chain_id, 14) is None
