"""Chain storage under a task load (issue 26, docs/adr/0215): what a validator's database holds as audited
training tasks run back to back, with ended tasks pruned after their retention and without.

Two chains side by side in one process, each the real ledger (devtools/trust_game.py's parties: an
owner, three workers, eight verifiers; every task submitted, committed by its crew, audited with sealed
answers, finalized and paid) committing every block into its own RocksDB through the validator's
``ChainStore`` (blocks pruned past ``--retain-blocks``, state snapshots every epoch): one with
``ended_task_retention_s`` = ``--retention-s`` (block time), one keeping ended tasks forever (0). A task
starts every ``--task-interval-s`` of block time (empty blocks in between at ``--block-ms``). After
every task the bench reads the ledger state's size (the keys and values a snapshot carries) and the
database's live bytes (keys and values, before compression). Prints one JSON object: the per-task
samples and, for each chain, the state and database size at the end, the state bytes a task leaves
while it is kept, and the storage growth per day extrapolated at the measured pace (the database's
growth over the last half of the run, when blocks are being pruned).

    PYTHONPATH=$PWD python3 bench/task_storage.py --tasks 60
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consensus.validator.chainstore import ChainStore  # noqa: E402
from consensus.validator.storage import Storage  # noqa: E402
from devtools import trust_game  # noqa: E402


def live_bytes(storage: Storage) -> int:
    return sum(len(key) + len(value) for key, value in storage._kv.scan(b""))


def state_bytes(chain) -> int:
    return sum(len(key) + len(value) for key, value in chain.ledger.state.items())


def make_chain(path: Path, seed: int, retention_s: int, retain_blocks: int, block_ms: int):
    """A trust-game chain (its parties registered) whose every block is also committed to a RocksDB
    ``ChainStore`` from genesis on."""
    people = [trust_game.OWNER, *trust_game.WORKERS, *trust_game.VERIFIERS]
    chain = trust_game.Chain({p.peer_id: 10**9 for p in people}, chain_id=f"dekube-storage-{seed}",
                             params=trust_game.game_params(ended_task_retention_s=retention_s), block_ms=block_ms)
    store = ChainStore(Storage.open(str(path), chain.genesis), retain_blocks=retain_blocks)
    apply = chain.ledger.apply_block

    def apply_and_store(block):
        result = apply(block)
        store.commit(block, result)
        return result

    chain.ledger.apply_block = apply_and_store   # type: ignore[method-assign]
    for who in trust_game.WORKERS:
        trust_game._register(chain, who, "compute", 3_000)
    for who in trust_game.VERIFIERS:
        trust_game._register(chain, who, "verifier", 1_000)
    return chain, store


def run_task(chain) -> None:
    task_id = trust_game.submit(chain)
    game = trust_game.Game(chain, task_id)
    chain.block([trust_game._commit_tx(chain, w, task_id) for w in trust_game.WORKERS])
    trust_game.settle(game)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--retention-s", type=int, default=1800, help="ended_task_retention_s of the pruning chain")
    parser.add_argument("--retain-blocks", type=int, default=2000)
    parser.add_argument("--task-interval-s", type=int, default=120, help="block time from one task's start to the next")
    parser.add_argument("--block-ms", type=int, default=2000, help="block time of each block")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    out: dict = {"tasks": args.tasks, "retention_s": args.retention_s, "retain_blocks": args.retain_blocks,
                 "task_interval_s": args.task_interval_s, "block_ms": args.block_ms, "chains": {}}
    with tempfile.TemporaryDirectory(prefix="dekube-task-storage-") as tmp:
        chains = {name: make_chain(Path(tmp) / name, args.seed, retention, args.retain_blocks, args.block_ms)
                  for name, retention in (("pruned", args.retention_s), ("kept", 0))}
        samples: dict[str, list] = {name: [] for name in chains}
        started = time.monotonic()
        for _ in range(args.tasks):
            for name, (chain, store) in chains.items():
                begin = chain.ledger.state.last_block_time_ms
                run_task(chain)
                while chain.ledger.state.last_block_time_ms - begin < args.task_interval_s * 1000:
                    chain.block()
                samples[name].append([chain.ledger.height, chain.ledger.state.last_block_time_ms // 1000,
                                      len(chain.ledger.state.tasks), state_bytes(chain), live_bytes(store.storage)])
        for name, (_chain, store) in chains.items():
            rows = samples[name]
            half = rows[len(rows) // 2]
            last = rows[-1]
            seconds = max(1, last[1] - half[1])
            out["chains"][name] = {
                "blocks": last[0], "block_time_s": last[1], "tasks_in_state": last[2],
                "state_bytes": last[3], "db_live_bytes": last[4],
                "state_bytes_per_task_kept": round((rows[-1][3] - rows[0][3]) / max(1, len(rows) - 1))
                if name == "kept" else None,
                "db_mb_per_day_last_half": round((last[4] - half[4]) / seconds * 86_400 / 1e6, 2),
                "samples": rows}
            store.storage.close()
        out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
