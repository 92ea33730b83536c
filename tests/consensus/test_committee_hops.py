"""Committee hops (docs/adr/0216): the outgoing committee certifies its successor in the epoch's last
block, so a node that trusts only the genesis committee state-syncs a chain whose committee has
since changed completely; forged, tampered and withheld hop records are refused with the reason."""
import pytest

from consensus.block import build_block
from consensus.certificate import encode_certificate
from consensus.committee_hops import HopError, verify_hop
from consensus.encoding import decode, encode
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.statesync import StateSyncError, StoreSource, committee_at, follow_hops, replay_blocks, state_sync
from consensus.tx import build_tx
from consensus.validator.chainstore import ChainStore
from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import Storage
from node.identity import Identity

OLD = [Identity.from_seed(bytes([60 + i]) * 32) for i in range(3)]
NEW = [Identity.from_seed(bytes([70 + i]) * 32) for i in range(3)]
FORGERS = [Identity.from_seed(bytes([80 + i]) * 32) for i in range(3)]
EPOCH = 4
HARDWARE = {"bandwidth_mbps": 100, "cpu_cores": 2, "gpu": "", "gpu_mem_mb": 0, "ram_mb": 4096}


def genesis_of(validators, epoch_length=EPOCH):
    return Genesis("hops-test", 0, {v.peer_id: 10**9 for v in NEW + FORGERS},
                   tuple(GenesisValidator(v.peer_id, 2000 + i) for i, v in enumerate(validators)),
                   Params(committee_size=3, epoch_length=epoch_length, min_fee=0))


GENESIS = genesis_of(OLD)


def sign(identities, chain_id, height, raw):
    vid = value_id(raw)
    return [sign_vote(v, chain_id, Vote(VoteType.PRECOMMIT, height, 0, vid, v.peer_id)) for v in identities]


def by_id(committee):
    return [next(i for i in OLD + NEW + FORGERS if i.peer_id == p) for p in committee.peer_ids]


def build_chain(blocks, genesis=GENESIS, joiners=NEW, rotate_at=1, rotations=None):
    """A chain whose committee is ``genesis``'s validators until ``joiners`` register and outstake
    them in block ``rotate_at`` (or each ``rotations`` height's joiners, each outstaking the last);
    each block certified by its own committee (read from the store)."""
    store = ChainStore(Storage.create("source", MemoryKV(), genesis))
    ledger = store.storage.load_ledger()
    cert = b""
    rotations = rotations or {rotate_at: joiners}
    for height in range(1, blocks + 1):
        committee = store.committee_for(height, ledger)
        txs = []
        if height in rotations:
            bond = 50_000 * (sorted(rotations).index(height) + 1)
            for who in rotations[height]:
                txs.append(build_tx(who, genesis.chain_id, 0, "register_node", {
                    "roles": ["validator"], "listen_addrs": [], "relay_addrs": [], "hardware": HARDWARE}).raw)
                txs.append(build_tx(who, genesis.chain_id, 1, "bond", {"amount": bond}).raw)
        signers = by_id(committee)
        block = build_block(genesis.chain_id, height, height, ledger.last_block_hash, ledger.app_hash,
                            signers[0], ledger.beacon, txs, (), cert)
        cert = store.save_certificate(height, sign(signers, genesis.chain_id, height, block.encode()))
        store.commit(block, ledger.apply_block(block))
    return store, ledger


def fresh(genesis=GENESIS):
    store = ChainStore(Storage.create("joiner", MemoryKV(), genesis))
    return store, store.committee_for(1, store.storage.load_ledger())


def test_the_next_committee_is_elected_a_block_before_the_epoch_ends_and_committed_in_its_app_hash():
    store, ledger = build_chain(3 * EPOCH + 2)
    old_ids, new_ids = {v.peer_id for v in OLD}, {v.peer_id for v in NEW}
    assert set(store.committee_for(EPOCH, ledger).peer_ids) == old_ids
    # elected at height EPOCH - 1 from the bonds of block 1, seated from EPOCH + 1
    assert set(store.committee_for(EPOCH + 1, ledger).peer_ids) == new_ids
    # one hop (at the first epoch's last block); later epochs re-elect the same committee: no hop
    assert store.storage.committee_hops(0, 100) == [EPOCH]
    assert store.storage.hop_proof(EPOCH - 1) is None            # consumed into the hop record
    raw = store.storage.committee_hop(EPOCH)
    _, trusted = fresh()
    committee = verify_hop(GENESIS.chain_id, EPOCH, trusted, EPOCH, raw)
    assert set(committee.peer_ids) == new_ids and committee.start_height == EPOCH + 1


def test_a_bond_in_the_block_before_the_epoch_end_waits_for_the_next_election():
    # NEW bond in block EPOCH (the epoch's last block, after the election at EPOCH - 1)
    store, ledger = build_chain(2 * EPOCH + 1, rotate_at=EPOCH)
    assert set(store.committee_for(EPOCH + 1, ledger).peer_ids) == {v.peer_id for v in OLD}
    assert set(store.committee_for(2 * EPOCH + 1, ledger).peer_ids) == {v.peer_id for v in NEW}
    assert store.storage.committee_hops(0, 100) == [2 * EPOCH]


def test_a_joiner_trusting_only_genesis_state_syncs_after_the_whole_committee_changed():
    source, full = build_chain(3 * EPOCH + 3)
    store, trusted = fresh()
    assert set(trusted.peer_ids) == {v.peer_id for v in OLD}
    ledger, report = state_sync(store, trusted, [StoreSource("peer", source)])
    assert report.snapshot_height == 3 * EPOCH and report.hops == 1 and not report.rejected
    replay_blocks(store, ledger, StoreSource("peer", source), full.height)
    assert ledger.height == full.height and ledger.full_state_hash() == full.full_state_hash()
    # the joiner keeps the hop it followed, so it can serve the next joiner
    assert store.storage.committee_hop(EPOCH) == source.storage.committee_hop(EPOCH)
    committees, followed = follow_hops(GENESIS, trusted, [StoreSource("first joiner", store)], {})
    assert [h for h, _ in followed] == [EPOCH]
    assert committee_at(committees, EPOCH) is trusted
    assert set(committee_at(committees, EPOCH + 1).peer_ids) == {v.peer_id for v in NEW}


class NoHops(StoreSource):
    def hops(self):
        return []


def test_without_the_hop_the_new_committee_is_not_trusted():
    """What the joiner did before committee hops: the genesis committee signed nothing after it left."""
    source, _ = build_chain(3 * EPOCH + 3)
    store, trusted = fresh()
    with pytest.raises(StateSyncError, match="not signed by a third of the trusted committee"):
        state_sync(store, trusted, [NoHops("peer", source)])


class ForgedCertificate(StoreSource):
    """The hop's block signed by the forgers (who are not in the committee the joiner trusts)."""

    def hop(self, height):
        fields = decode(super().hop(height))
        fields[2] = encode_certificate(sign(FORGERS, GENESIS.chain_id, height, fields[1]))
        return encode(fields)


def test_a_hop_signed_by_others_than_the_trusted_committee_is_refused():
    source, _ = build_chain(3 * EPOCH + 3)
    store, trusted = fresh()
    with pytest.raises(StateSyncError) as failed:
        state_sync(store, trusted, [ForgedCertificate("forger", source)])
    assert "block 4 of the hop is not signed by a third of the trusted committee's power (0 of" in str(failed.value)
    ledger, report = state_sync(store, trusted, [ForgedCertificate("forger", source), StoreSource("honest", source)])
    assert "forger" in report.rejected and report.hops == 1 and ledger.height == 3 * EPOCH + 1


class Tampered(StoreSource):
    """The honest hop record with the forgers named as the next committee."""

    def hop(self, height):
        fields = decode(super().hop(height))
        fields[4] = [[f.peer_id, 10**6] for f in FORGERS]
        return encode(fields)


class Withholder(StoreSource):
    def hop(self, height):
        return None


def test_a_tampered_or_withheld_hop_drops_that_peer_with_the_reason():
    source, full = build_chain(3 * EPOCH + 3)
    store, trusted = fresh()
    ledger, report = state_sync(store, trusted, [Tampered("tamperer", source), Withholder("withholder", source),
                                                 StoreSource("honest", source)])
    assert "does not rebuild the app hash" in report.rejected["tamperer"]
    assert "listed committee hop 4 and did not serve it" in report.rejected["withholder"]
    assert report.hops == 1 and ledger.height == 3 * EPOCH + 1


@pytest.mark.parametrize("junk", [b"", b"\x00" * 10, encode([EPOCH]), encode([EPOCH, b"", b"", b"", [], b""])])
def test_junk_hop_records_are_refused(junk):
    _, trusted = fresh()
    with pytest.raises(HopError):
        verify_hop(GENESIS.chain_id, EPOCH, trusted, EPOCH, junk)


def test_a_hop_at_a_height_that_ends_no_epoch_is_refused():
    source, _ = build_chain(2 * EPOCH)
    _, trusted = fresh()
    with pytest.raises(HopError, match="an epoch's last block"):
        verify_hop(GENESIS.chain_id, EPOCH, trusted, EPOCH + 1, source.storage.committee_hop(EPOCH))


def test_epochs_of_one_block_commit_the_committee_beside_the_state_root():
    genesis = genesis_of(OLD, epoch_length=1)
    source, full = build_chain(6, genesis=genesis, rotate_at=2)
    hops = source.storage.committee_hops(0, 100)
    assert hops == [3]   # bonded in block 2, elected at the end of block 2, sits from height 4
    assert set(source.committee_for(4, full).peer_ids) == {v.peer_id for v in NEW}
    store, trusted = fresh(genesis)
    ledger, report = state_sync(store, trusted, [StoreSource("peer", source)])
    assert report.hops == 1 and ledger.height == full.height


def test_hop_records_are_served_on_the_snapshot_protocol():
    from test_snapshot_serving import ask

    from consensus.validator.snapshot_wire import SnapshotServer
    source, _ = build_chain(3 * EPOCH + 3)
    server = SnapshotServer(None, source)
    try:
        assert ask(server, "joiner", ["hops", 0, 0]) == [EPOCH]
        assert ask(server, "joiner", ["hops", EPOCH + 1, 0]) == []
        assert ask(server, "joiner", ["hop", EPOCH, 0]) == source.storage.committee_hop(EPOCH)
        assert ask(server, "joiner", ["hop", EPOCH + 1, 0]) is None
    finally:
        server._reader.shutdown(wait=False)


def test_a_remote_hop_list_is_paged_and_bounded_against_a_looping_peer(monkeypatch):
    from consensus.committee_hops import HOP_LIST_PAGE
    from consensus.validator import snapshot_wire
    heights = list(range(4, 4 * (2 * HOP_LIST_PAGE + 10), 4))
    asked = []

    def honest(kind, height=0, index=0):
        asked.append(height)
        return [h for h in heights if h >= height][:HOP_LIST_PAGE]

    remote = snapshot_wire.RemoteSource(None, "peer", None)
    monkeypatch.setattr(remote, "_call", honest)
    assert remote.hops() == heights and len(asked) == 3
    # a peer that answers the same full page forever: the list stops growing, so the joiner stops asking
    monkeypatch.setattr(remote, "_call", lambda kind, height=0, index=0: heights[:HOP_LIST_PAGE])
    assert remote.hops() == heights[:HOP_LIST_PAGE]
    monkeypatch.setattr(snapshot_wire, "MAX_HOPS", 2 * HOP_LIST_PAGE)
    monkeypatch.setattr(remote, "_call", honest)
    assert len(remote.hops()) == 2 * HOP_LIST_PAGE


class WithoutLatestSnapshot(StoreSource):
    def manifest(self, height):
        return None if height == max(self.snapshots()) else super().manifest(height)


def test_an_older_snapshot_is_checked_against_the_committee_of_its_own_height():
    """Two committee changes (at 4 and 8); the joiner restores the snapshot at 4, whose anchor block 5
    the second committee signed, not the third that the hops lead to."""
    source, full = build_chain(2 * EPOCH + 3, rotations={1: NEW, EPOCH + 1: FORGERS})
    assert source.storage.committee_hops(0, 100) == [EPOCH, 2 * EPOCH]
    assert source.storage.snapshot_heights() == [EPOCH, 2 * EPOCH]
    store, trusted = fresh()
    ledger, report = state_sync(store, trusted, [WithoutLatestSnapshot("peer", source)])
    assert report.snapshot_height == EPOCH and report.hops == 2
    replay_blocks(store, ledger, StoreSource("peer", source), full.height)
    assert ledger.full_state_hash() == full.full_state_hash()
