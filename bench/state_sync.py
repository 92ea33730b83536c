"""Joining a chain by state sync vs by replaying every block (docs/adr/0199), on this machine's CPU.

Builds a chain of ``--blocks`` blocks (``--validators`` sign each certificate; each block carries
``--txs`` transfers among ``--accounts`` funded accounts, so the state has that many accounts) in
memory, then joins it twice with a new node on RocksDB in a temporary directory: by replaying
every block from genesis (certificate checked per block, as block sync does), and by state sync
from the last snapshot (chunks checked against the certified app hash) plus the blocks after it.
Prints one JSON object: ``{"chain_blocks", "state_mb", "chunks", "snapshot_height", "join_s",
"block_sync_join_s", ...}`` (``block_sync_join_s`` extrapolated from ``--block-sync-sample`` blocks when
given). Usage: ``python bench/state_sync.py [--blocks 1000] [--accounts 5000]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from consensus.block import build_block
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.messages import Vote, VoteType, sign_vote, value_id
from consensus.statesync import StoreSource, replay_blocks, state_sync
from consensus.tx import build_tx
from consensus.validator.chainstore import ChainStore
from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import Storage
from node.identity import Identity


def build(args) -> tuple[Genesis, ChainStore]:
    validators = [Identity.from_seed(i.to_bytes(4, "big") * 8) for i in range(args.validators)]
    users = [Identity.from_seed((10**6 + i).to_bytes(4, "big") * 8) for i in range(min(args.accounts, 64))]
    balances = {u.peer_id: 10**12 for u in users}
    balances.update({Identity.from_seed((2 * 10**6 + i).to_bytes(4, "big") * 8).peer_id: 1
                     for i in range(args.accounts - len(users))})
    genesis = Genesis("state-sync-bench", 0, balances,
                      tuple(GenesisValidator(v.peer_id, 10_000) for v in validators),
                      Params(committee_size=args.validators, epoch_length=args.epoch_length, min_fee=0))
    store = ChainStore(Storage.create("source", MemoryKV(), genesis))
    ledger = store.storage.load_ledger()
    store.committee_for(1, ledger)
    cert, nonces = b"", {}  # type: bytes, dict[str, int]
    for height in range(1, args.blocks + 1):
        txs = []
        for i in range(args.txs):
            sender, to = users[(height * args.txs + i) % len(users)], users[(height + i + 1) % len(users)]
            nonce = nonces.get(sender.peer_id, 0)
            nonces[sender.peer_id] = nonce + 1
            txs.append(build_tx(sender, genesis.chain_id, nonce, "transfer", {"to": to.peer_id, "amount": 1}).raw)
        block = build_block(genesis.chain_id, height, height, ledger.last_block_hash, ledger.app_hash,
                            validators[0], ledger.beacon, txs, (), cert)
        vid = value_id(block.encode())
        cert = store.save_certificate(height, [
            sign_vote(v, genesis.chain_id, Vote(VoteType.PRECOMMIT, height, 0, vid, v.peer_id)) for v in validators])
        store.commit(block, ledger.apply_block(block))
        store.committee_for(height + 1, ledger)
    return genesis, store


def join(genesis: Genesis, source: ChainStore, by_snapshot: bool, upto: int | None = None) -> tuple[float, dict]:
    """Join ``source``'s chain with a new node on RocksDB, by state sync or from genesis; ``upto``: replay
    only that far (the block-sync figure for a long chain is then extrapolated from it)."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        store = ChainStore(Storage.open(os.path.join(tmp, "chain"), genesis))
        peer = StoreSource("peer", source)
        info: dict = {}
        if by_snapshot:
            trusted = store.committee_for(1, store.storage.load_ledger())
            ledger, report = state_sync(store, trusted, [peer])
            info = {"snapshot_height": report.snapshot_height, "chunks": report.chunks,
                    "state_mb": round(report.state_bytes / 2**20, 2)}
        else:
            ledger = store.storage.load_ledger()
            store.committee_for(1, ledger)
        target = source.storage.height if upto is None else min(upto, source.storage.height)
        replay_blocks(store, ledger, peer, target)
        elapsed = time.perf_counter() - started
        if target == source.storage.height:
            assert ledger.app_hash == source.storage.load_ledger().app_hash, "joined a different state"
        store.storage.close()
    return elapsed, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--accounts", type=int, default=5000)
    parser.add_argument("--txs", type=int, default=2, help="transfers per block")
    parser.add_argument("--epoch-length", type=int, default=100, help="blocks between snapshots")
    parser.add_argument("--block-sync-sample", type=int, default=0,
                        help="replay only this many blocks from genesis and extrapolate the block-sync join "
                             "(0: replay them all)")
    args = parser.parse_args()
    started = time.perf_counter()
    genesis, source = build(args)
    built = time.perf_counter() - started
    sync_s, info = join(genesis, source, by_snapshot=True)
    replayed = min(args.block_sync_sample or args.blocks, args.blocks)
    replay_s, _ = join(genesis, source, by_snapshot=False, upto=replayed)
    per_block = replay_s / replayed
    print(json.dumps({"bench": "state_sync", "chain_blocks": args.blocks, "validators": args.validators,
                      "accounts": args.accounts, **info, "join_s": round(sync_s, 3),
                      "block_sync_join_s": round(per_block * args.blocks, 3),
                      "block_sync_measured_blocks": replayed,
                      "replay_ms_per_block": round(1000 * per_block, 3),
                      "build_s": round(built, 1)}))


if __name__ == "__main__":
    main()
