"""Chain storage growth per day, idle and with transfers, at the idle block pace vs the old fixed pace
(issue 26, docs/adr/0213), measured on real validator processes side by side.

Two 4-validator testnets of real `dekube-node start` processes on loopback run at the same time: one
with the defaults (``idle_block_wait`` 2 s while nothing is in flight), one with the pace every
block had before (``idle_block_wait`` = ``empty_block_wait`` = 0.3 s). Each is measured idle for
``--seconds`` (no transactions) and then for ``--seconds`` with ``--tx-rate`` transfers a second (the
finality client of devtools/netlab: a transfer's POST to the block announcement). Growth, averaged
over the validators and extrapolated to a day, is measured two ways: ``live``, the keys and values
each validator's RocksDB holds (a read-only view: what stays once compaction has dropped overwritten
and deleted records, before compression), and ``disk``, the size of its ``data/chain`` directory
(SST files, the write-ahead log and manifests: over a minute, mostly the WAL of records that
compaction later drops). Prints one JSON object.

    PYTHONPATH=$PWD python3 bench/chain_storage.py --seconds 60
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.netlab.finality_client import measure  # noqa: E402
from devtools.testnet import Testnet  # noqa: E402

PACES = {"idle_pace": {}, "fixed_pace": {"consensus.idle_block_wait": "0.3"}}


def disk_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                pass
    return total


def chain_bytes(net: Testnet) -> float:
    """The validators' RocksDB directories, on disk, averaged over the validators."""
    return sum(disk_bytes(node.home / "data" / "chain") for node in net.nodes) / len(net.nodes)


def live_bytes(path: Path) -> int:
    """The keys and values a database holds (what stays after compaction, before compression), read
    from a read-only view of the running node's RocksDB."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return sum(len(key) + len(value) for key, value in db.items())
    finally:
        db.close()


def chain_live_bytes(net: Testnet) -> float:
    return sum(live_bytes(node.home / "data" / "chain") for node in net.nodes) / len(net.nodes)


async def phase(net: Testnet, seconds: float, tx_rate: float) -> dict:
    spec = {"urls": [n.rpc_url for n in net.nodes], "faucet_key": str(net.faucet_key), "chain_id": net.chain_id,
            "tx_rate": tx_rate, "seconds": seconds, "warmup_s": 0}
    before, live_before, started = chain_bytes(net), chain_live_bytes(net), time.monotonic()
    heights_before = net.height(net.nodes[0]) or 0
    figures = await measure(spec)
    elapsed = time.monotonic() - started
    grown, live_grown = chain_bytes(net) - before, chain_live_bytes(net) - live_before
    blocks = (net.height(net.nodes[0]) or 0) - heights_before
    return {"seconds": round(elapsed, 1), "blocks": blocks, "blocks_per_min": figures["blocks_per_min"],
            "live_bytes_per_block": round(live_grown / max(1, blocks)),
            "live_mb_per_day": round(live_grown / elapsed * 86_400 / 1e6, 1),
            "disk_bytes_per_block": round(grown / max(1, blocks)),
            "disk_mb_per_day": round(grown / elapsed * 86_400 / 1e6, 1),
            "tx_p50_ms": figures["tx_p50_ms"], "tx_p99_ms": figures["tx_p99_ms"],
            "transfers_committed": figures["transfers_committed"]}


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="dekube-storage-") as tmp:
        nets = {name: Testnet.create(Path(tmp) / name, args.validators, chain_id=f"dekube-{name.replace('_', '-')}",
                                     settings=settings) for name, settings in PACES.items()}
        try:
            for net in nets.values():
                net.up(wait_height=2, timeout=120)
            await asyncio.sleep(args.warmup)
            out: dict = {name: {} for name in nets}
            for label, rate in (("idle", 0.0), ("transfers", args.tx_rate)):
                results = await asyncio.gather(*(phase(net, args.seconds, rate) for net in nets.values()))
                for name, result in zip(nets, results):
                    out[name][label] = result
                print(f"{label}: {json.dumps({n: out[n][label] for n in nets})}", file=sys.stderr, flush=True)
            return out
        finally:
            for net in nets.values():
                net.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--tx-rate", type=float, default=2.0, help="transfers a second in the second phase")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    print(json.dumps({"validators": args.validators, "transport": "real dekube-node processes on loopback",
                      "paces": {"idle_pace": "defaults: idle_block_wait 2.0 s, empty_block_wait 0.3 s",
                                "fixed_pace": "idle_block_wait 0.3 s (every block at the old pace)"}, **out}))


if __name__ == "__main__":
    main()
