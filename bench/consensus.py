"""Consensus benchmark: a local testnet of N validator processes under signed-transfer load.

    python bench/consensus.py --validators 4 [--rates 250,500,1000,1500,2000] [--phase-s 8]

1. ``pipeline_tps``: runs ``bench/pipeline.py`` (one process: verify + execute + commit, no network).
2. Starts a testnet of ``--validators`` processes on 127.0.0.1 with ``--accounts`` funded accounts.
3. Finality: ``--latency-rate`` tx/s (default 50) for ``--latency-s`` seconds; ``p50_ms``/``p99_ms``
   are submit-to-commit times (from just before the JSON-RPC POST to the moment the block holding
   the transaction is announced on v0's ``newHeads`` websocket).
4. Throughput: open-loop phases at each rate of ``--rates`` (``--phase-s`` seconds each, stopping
   after the first phase that misses); ``tps`` is the best committed rate of a phase whose p99
   latency was <= 2 s. Transactions are pre-signed (not timed), spread round-robin over the
   validators in JSON-RPC batches of up to 100.

The last line printed is one JSON object. The client shares the machine's CPUs with the validators,
and the machine may be shared with other work: ``load_avg_1m`` is reported with the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from consensus.tx import build_tx  # noqa: E402
from devtools.testnet import Testnet  # noqa: E402
from node.identity import Identity  # noqa: E402

P99_LIMIT_S = 2.0
BATCH = 100
TICK_S = 0.05


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class TxSource:
    """Pre-signed transfers: transaction k comes from account k % A with that account's next nonce."""

    def __init__(self, accounts: list[Identity], chain_id: str):
        self.accounts = accounts
        self.chain_id = chain_id
        self.nonces = [0] * len(accounts)
        self.next_account = 0

    def take(self, count: int) -> list[tuple[str, str]]:
        out = []
        for _ in range(count):
            i = self.next_account
            self.next_account = (i + 1) % len(self.accounts)
            to = self.accounts[(i * 7 + 1) % len(self.accounts)].peer_id
            tx = build_tx(self.accounts[i], self.chain_id, self.nonces[i], "transfer", {"to": to, "amount": 1}, 1)
            self.nonces[i] += 1
            out.append((tx.hash.hex(), tx.raw.hex()))
        return out


class Bench:
    def __init__(self, testnet: Testnet, session: aiohttp.ClientSession):
        self.testnet = testnet
        self.session = session
        self.urls = [n.rpc_url + "/" for n in testnet.nodes]
        self.sent_at: dict[str, float] = {}
        self.committed_at: dict[str, float] = {}
        self.rejected = 0
        self._next_url = 0
        self._posts: set[asyncio.Task] = set()

    async def watch(self) -> None:
        """Follow v0's newHeads and note when each transaction's block was announced."""
        url = self.testnet.nodes[0].rpc_url + "/ws"
        async with self.session.ws_connect(url, max_msg_size=0) as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe", "params": ["newHeads"]})
            async for msg in ws:
                doc = json.loads(msg.data)
                head = (doc.get("params") or {}).get("result")
                if not head or not head.get("txs"):
                    continue
                now = time.perf_counter()
                block = await self.rpc(self.urls[0], "dkb_getBlockByNumber", [head["height"], False])
                for tx_hash in block["transactions"]:
                    self.committed_at.setdefault(tx_hash, now)

    async def rpc(self, url: str, method: str, params: list):
        async with self.session.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}) as r:
            return (await r.json())["result"]

    async def _post(self, url: str, txs: list[tuple[str, str]]) -> None:
        body = [{"jsonrpc": "2.0", "id": i, "method": "dkb_sendRawTransaction", "params": [raw]}
                for i, (_, raw) in enumerate(txs)]
        now = time.perf_counter()
        for tx_hash, _ in txs:
            self.sent_at[tx_hash] = now
        try:
            async with self.session.post(url, json=body) as response:
                answers = await response.json()
            self.rejected += sum(1 for a in answers if "error" in a)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            self.rejected += len(txs)

    def send(self, txs: list[tuple[str, str]]) -> None:
        for start in range(0, len(txs), BATCH):
            url = self.urls[self._next_url % len(self.urls)]
            self._next_url += 1
            task = asyncio.get_running_loop().create_task(self._post(url, txs[start:start + BATCH]))
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)

    async def phase(self, source: TxSource, rate: float, seconds: float, drain_s: float = 6.0) -> dict:
        """Send at ``rate`` for ``seconds``; then wait up to ``drain_s`` for the stragglers."""
        ticks = int(seconds / TICK_S)
        per_tick = rate * TICK_S
        batches = []
        owed = 0.0
        for _ in range(ticks):
            owed += per_tick
            batches.append(source.take(int(owed)))
            owed -= int(owed)
        hashes = [h for batch in batches for h, _ in batch]
        started = time.perf_counter()
        for i, batch in enumerate(batches):
            delay = started + i * TICK_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if batch:
                self.send(batch)
        send_end = time.perf_counter()
        deadline = send_end + drain_s
        while time.perf_counter() < deadline and not all(h in self.committed_at for h in hashes):
            await asyncio.sleep(0.05)
        latencies = [self.committed_at[h] - self.sent_at[h] for h in hashes if h in self.committed_at]
        committed = len(latencies)
        last_commit = max((self.committed_at[h] for h in hashes if h in self.committed_at), default=send_end)
        elapsed = max(last_commit, send_end) - started
        return {
            "rate": rate, "sent": len(hashes), "committed": committed,
            "committed_tps": round(committed / elapsed, 1) if elapsed > 0 else 0.0,
            "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
            "p99_ms": round(1000 * percentile(latencies, 0.99), 1) if latencies else None,
            "all_committed": committed == len(hashes),
        }


def run_pipeline() -> int | None:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline.py")
    done = subprocess.run([sys.executable, script, "--txs", "20000", "--accounts", "2000"],
                          capture_output=True, text=True, timeout=600)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])["pipeline_tps"]
    except (IndexError, ValueError, KeyError):
        log(f"pipeline bench failed: {done.stderr[-500:]}")
        return None


async def bench(args, testnet: Testnet, accounts: list[Identity]) -> dict:
    source = TxSource(accounts, testnet.chain_id)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64)) as session:
        runner = Bench(testnet, session)
        watcher = asyncio.get_running_loop().create_task(runner.watch())
        await asyncio.sleep(0.5)
        log(f"finality at {args.latency_rate} tx/s for {args.latency_s} s ...")
        latency = await runner.phase(source, args.latency_rate, args.latency_s)
        log(f"  {latency}")
        phases = []
        for rate in args.rates:
            log(f"throughput phase at {rate} tx/s for {args.phase_s} s ...")
            result = await runner.phase(source, rate, args.phase_s)
            log(f"  {result}")
            phases.append(result)
            if not result["all_committed"] or (result["p99_ms"] or 1e9) > P99_LIMIT_S * 1000:
                break
        watcher.cancel()
    good = [p for p in phases if p["p99_ms"] is not None and p["p99_ms"] <= P99_LIMIT_S * 1000]
    return {
        "tps": max((p["committed_tps"] for p in good), default=0.0),
        "p50_ms": latency["p50_ms"], "p99_ms": latency["p99_ms"],
        "latency_phase": latency, "phases": phases, "rejected": runner.rejected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--accounts", type=int, default=3000)
    parser.add_argument("--latency-rate", type=float, default=50.0)
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--rates", default="250,500,1000,1250,1500,1750,2000,2500,3000",
                        type=lambda s: [float(x) for x in s.split(",") if x])
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--skip-pipeline", action="store_true")
    args = parser.parse_args()

    pipeline_tps = None if args.skip_pipeline else run_pipeline()
    log(f"pipeline_tps {pipeline_tps}")
    accounts = [Identity.from_seed((10**6 + i).to_bytes(32, "big")) for i in range(args.accounts)]
    with tempfile.TemporaryDirectory(prefix="dekube-bench-") as tmp:
        testnet = Testnet.create(tmp, args.validators, chain_id="dekube-bench",
                                 balances={a.peer_id: 10**12 for a in accounts},
                                 settings={"node.log_level": "warning", "consensus.mempool_max_txs": "200000"})
        try:
            testnet.up(wait_height=2, timeout=120)
            result = asyncio.run(bench(args, testnet, accounts))
            heights = [testnet.height(n) for n in testnet.nodes]
        finally:
            testnet.down(timeout=10)
    print(json.dumps({
        "validators": args.validators, "tps": result["tps"], "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"], "pipeline_tps": pipeline_tps,
        "latency_rate": args.latency_rate, "phases": result["phases"], "rejected": result["rejected"],
        "final_heights": heights, "load_avg_1m": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
        "targets": {"tps": 1500 if args.validators <= 4 else 400, "p99_s": P99_LIMIT_S, "p50_ms": 150,
                    "pipeline_tps": 12_000},
    }))


if __name__ == "__main__":
    main()
