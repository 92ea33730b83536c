"""Finality as every validator sees it, measured from a host one zero-delay hop from all of them.

``python -m devtools.netlab.finality_client SPEC_JSON`` (run inside the WAN lab's client namespace)
follows ``newHeads`` on every validator in ``urls`` for ``seconds`` while it sends ``tx_rate``
transfers a second from the faucet key, then prints one JSON object. Finality of a commit is the
time a validator announces the block minus the block's ``time_ms`` (the proposer's clock when it
built the proposal: one machine, one clock), the simulator's measure (proposal built to replica
stored, every replica's commit counted); the announcement reaches the client over a zero-delay link. A transfer's
latency (``tx_p50_ms``, what a user waits, with any round a crashed proposer costs) runs from its POST
to v0's announcement of the block holding it.
Block rate comes from the heights v0 announced; rounds per height from v0's
``dekube_consensus_rounds_per_height`` histogram over the measured window. The clock starts once every
validator answers; the first ``warmup_s`` seconds after that are not counted; then the processes in
``crash_pids`` are SIGKILLed (a crashed validator for the whole measured window).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from consensus.tx import build_tx
from devtools.consensus_sim.wan_measure import percentile  # the simulator's, for a like-for-like figure
from node.keystore import load_identity


async def follow(session: aiohttp.ClientSession, index: int, url: str, heads: list[tuple[int, int, float, int]],
                 stop: asyncio.Event, connected: asyncio.Semaphore,
                 on_block: Callable[[int, float], Awaitable[None]] | None = None) -> None:
    """Append (validator, height, announced at, block time ms) for every head ``url`` announces
    (connecting as soon as the validator answers: they may still be starting)."""
    for _attempt in range(300):
        try:
            ws = await session.ws_connect(url + "/ws", max_msg_size=1 << 20, heartbeat=10)
            break
        except (aiohttp.ClientError, OSError):
            if stop.is_set():
                return
            await asyncio.sleep(0.2)
    else:
        return
    connected.release()
    async with ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe", "params": ["newHeads"]})
        while not stop.is_set():
            try:
                msg = await asyncio.wait_for(ws.receive(), 1.0)
            except TimeoutError:
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            now = time.time()
            head = (json.loads(msg.data).get("params") or {}).get("result")
            if head and "time_ms" in head:
                heads.append((index, int(head["height"]), now, int(head["time_ms"])))
                if index == 0 and head.get("txs") and on_block is not None:
                    await on_block(int(head["height"]), now)


async def send_transfers(session: aiohttp.ClientSession, spec: dict, stop: asyncio.Event,
                         submitted: dict[str, float]) -> int:
    """Transfers at ``tx_rate`` round-robin over the validators (a dead one is skipped: the same nonce
    goes to the next); ``submitted`` maps each accepted transfer's hash to when it was posted."""
    faucet = load_identity(spec["faucet_key"])
    urls, rate, sent, attempt = spec["urls"], float(spec["tx_rate"]), 0, 0
    while rate > 0 and not stop.is_set():
        tx = build_tx(faucet, spec["chain_id"], sent, "transfer", {"to": faucet.peer_id, "amount": 1}, 1)
        body = {"jsonrpc": "2.0", "id": sent, "method": "dkb_sendRawTransaction", "params": [tx.raw.hex()]}
        posted = time.time()
        attempt += 1
        try:
            async with session.post(urls[attempt % len(urls)] + "/", json=body) as response:
                accepted = "error" not in await response.json()
        except (aiohttp.ClientError, OSError, ValueError):
            accepted = False
        if accepted:
            submitted[tx.hash.hex()] = posted
            sent += 1
        await asyncio.sleep(1.0 / rate)
    return sent


async def rounds_histogram(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(sum, count) of ``url``'s ``dekube_consensus_rounds_per_height`` histogram."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    values = {sample.name: sample.value for family in text_string_to_metric_families(text)
              if family.name == "dekube_consensus_rounds_per_height" for sample in family.samples}
    return (values.get("dekube_consensus_rounds_per_height_sum", 0.0),
            values.get("dekube_consensus_rounds_per_height_count", 0.0))


async def measure(spec: dict) -> dict:
    heads: list[tuple[int, int, float, int]] = []
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        connected = asyncio.Semaphore(0)
        submitted: dict[str, float] = {}
        committed: dict[str, float] = {}

        async def on_block(height: int, at: float) -> None:
            body = {"jsonrpc": "2.0", "id": 1, "method": "dkb_getBlockByNumber", "params": [height, False]}
            async with session.post(spec["urls"][0] + "/", json=body) as response:
                block = (await response.json()).get("result") or {}
            for tx_hash in block.get("transactions", []):
                committed.setdefault(tx_hash, at)

        followers = [asyncio.create_task(follow(session, i, url, heads, stop, connected, on_block if i == 0 else None))
                     for i, url in enumerate(spec["urls"])]
        for _ in spec["urls"]:   # every validator answers (or the run fails below: no heads)
            await asyncio.wait_for(connected.acquire(), 120)
        sender = asyncio.create_task(send_transfers(session, spec, stop, submitted))
        started = time.time()
        await asyncio.sleep(float(spec.get("warmup_s", 0)))
        rounds_before = await rounds_histogram(session, spec["urls"][0])
        for pid in spec.get("crash_pids", []):
            os.kill(int(pid), signal.SIGKILL)   # same machine, same pid namespace: a validator crashes
        await asyncio.sleep(float(spec["seconds"]))
        stop.set()
        sent = await sender
        await asyncio.gather(*followers, return_exceptions=True)
        rounds_after = await rounds_histogram(session, spec["urls"][0])
    counted = [h for h in heads if h[2] >= started + float(spec.get("warmup_s", 0))]
    finality = [at - time_ms / 1000.0 for _i, _h, at, time_ms in counted]
    count = rounds_after[1] - rounds_before[1]
    measured_from = started + float(spec.get("warmup_s", 0))
    tx_latency = [committed[h] - at for h, at in submitted.items() if at >= measured_from and h in committed]
    v0 = sorted((at, height) for i, height, at, _t in counted if i == 0)
    span = v0[-1][0] - v0[0][0] if len(v0) > 1 else 0.0
    return {
        "validators": len(spec["urls"]),
        "commits": len(finality),
        "heights": len(v0),
        "finality_p50_ms": round(1000 * statistics.median(finality), 1) if finality else None,
        "finality_p95_ms": round(1000 * percentile(finality, 0.95), 1) if finality else None,
        "finality_p99_ms": round(1000 * percentile(finality, 0.99), 1) if finality else None,
        "blocks_per_min": round(60 * (len(v0) - 1) / span, 1) if span else 0.0,
        "rounds_mean": round((rounds_after[0] - rounds_before[0]) / count, 3) if count else None,
        "transfers_sent": sent,
        "transfers_committed": len(tx_latency),
        "tx_p50_ms": round(1000 * statistics.median(tx_latency), 1) if tx_latency else None,
        "tx_p99_ms": round(1000 * percentile(tx_latency, 0.99), 1) if tx_latency else None,
    }


def main() -> None:
    print(json.dumps(asyncio.run(measure(json.loads(sys.argv[1])))), flush=True)


if __name__ == "__main__":
    main()
