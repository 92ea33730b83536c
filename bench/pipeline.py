"""pipeline_tps: one process, no network -- decode + verify + execute + commit of signed transfers.

Generates ``--txs`` signed transfers from ``--accounts`` accounts (not timed), then times
``Ledger.apply_block`` (decode, ed25519 verification in ``--threads`` threads, execution,
app hash) plus ``Storage.commit_block`` (one synced RocksDB WriteBatch per block) over
blocks of ``--block-txs`` transactions. Prints a JSON object as its last line: wall-clock
``pipeline_tps``, plus ``tps_per_cpu_second`` (transactions per second of CPU time this process
used, all threads) and the load average, since a shared machine makes wall-clock figures noisy.

    python bench/pipeline.py [--txs 40000] [--accounts 4000] [--block-txs 5000] [--threads 2]
                             [--mempool-verified]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from consensus.block import build_block  # noqa: E402
from consensus.genesis import Genesis, GenesisValidator, Params  # noqa: E402
from consensus.tx import build_tx, decode_tx  # noqa: E402
from consensus.txcodes import TxCode  # noqa: E402
from consensus.validator.storage import Storage  # noqa: E402
from node.identity import Identity  # noqa: E402

CHAIN = "dekube-bench"


def make_transfers(accounts: list[Identity], count: int) -> list[bytes]:
    out = []
    nonces = [0] * len(accounts)
    for i in range(count):
        sender = i % len(accounts)
        to = accounts[(i * 7 + 1) % len(accounts)].peer_id
        out.append(build_tx(accounts[sender], CHAIN, nonces[sender], "transfer", {"to": to, "amount": 1}, 1).raw)
        nonces[sender] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txs", type=int, default=40_000)
    parser.add_argument("--accounts", type=int, default=4_000)
    parser.add_argument("--block-txs", type=int, default=5_000)
    parser.add_argument("--threads", type=int, default=2, help="signature-verification threads (0: inline)")
    parser.add_argument("--mempool-verified", action="store_true",
                        help="pass the txs as already decoded and verified, as a validator does for "
                             "those its mempool admitted (execute + commit only)")
    args = parser.parse_args()

    accounts = [Identity.from_seed(i.to_bytes(32, "big")) for i in range(1, args.accounts + 1)]
    validator = Identity.from_seed(b"\xff" * 32)
    genesis = Genesis(CHAIN, 0, {a.peer_id: 10**9 for a in accounts},
                      (GenesisValidator(validator.peer_id, 10**6),),
                      Params(max_block_txs=max(args.block_txs, 1), max_block_bytes=64 * 1024 * 1024))
    t0 = time.perf_counter()
    raws = make_transfers(accounts, args.txs)
    # what a validator's mempool holds for transactions it admitted (decoded, signature checked)
    known = {tx.hash: tx for tx in map(decode_tx, raws)} if args.mempool_verified else None
    gen_s = time.perf_counter() - t0
    executor = ThreadPoolExecutor(args.threads) if args.threads > 0 else None

    with tempfile.TemporaryDirectory(prefix="dekube-pipeline-") as tmp:
        storage = Storage.open(os.path.join(tmp, "db"), genesis)
        ledger = storage.load_ledger()
        phases = {"apply_s": 0.0, "commit_s": 0.0}
        failed = 0
        cpu_started = time.process_time()
        started = time.perf_counter()
        for start in range(0, len(raws), args.block_txs):
            txs = raws[start:start + args.block_txs]
            block = build_block(CHAIN, ledger.height + 1, ledger.height, ledger.last_block_hash, ledger.app_hash,
                                validator, ledger.beacon, txs)
            t = time.perf_counter()
            result = ledger.apply_block(block, executor=executor, known_txs=known)
            t2 = time.perf_counter()
            storage.commit_block(block, result)
            phases["commit_s"] += time.perf_counter() - t2
            phases["apply_s"] += t2 - t
            failed += sum(1 for r in result.receipts if r.code != TxCode.OK)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        ledger.check_invariants()
        storage.close()
    if executor is not None:
        executor.shutdown()
    print(json.dumps({
        "pipeline_tps": round(len(raws) / elapsed),
        "txs": len(raws), "failed": failed, "blocks": -(-len(raws) // args.block_txs),
        "block_txs": args.block_txs, "threads": args.threads, "mempool_verified": args.mempool_verified,
        "seconds": round(elapsed, 3),
        "apply_s": round(phases["apply_s"], 3), "commit_s": round(phases["commit_s"], 3),
        "cpu_s": round(cpu, 3), "tps_per_cpu_second": round(len(raws) / cpu),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "sign_s": round(gen_s, 1), "target": 12_000, "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
