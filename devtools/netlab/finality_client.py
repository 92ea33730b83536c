"""Finality as every validator sees it, measured from a host one zero-delay hop from all of them.

``python -m devtools.netlab.finality_client SPEC_JSON`` (run inside the WAN lab's client namespace)
follows ``newHeads`` on every validator in ``urls`` for ``seconds`` while it sends ``tx_rate``
transfers a second from the faucet key, then prints one JSON object. Finality of a commit is the
time a validator announces the block minus the block's ``time_ms`` (the proposer's clock when it
built the proposal: one machine, one clock), the simulator's measure (proposal built to replica
stored, every replica's commit counted); the announcement reaches the client over a zero-delay link.
Block rate comes from the heights v0 announced; rounds per height from v0's
``dekube_consensus_rounds_per_height`` histogram. The clock starts once every validator answers; the
first ``warmup_s`` seconds after that are not counted.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import aiohttp

from consensus.tx import build_tx
from node.keystore import load_identity


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def follow(session: aiohttp.ClientSession, index: int, url: str, heads: list[tuple[int, int, float, int]],
                 stop: asyncio.Event, connected: asyncio.Semaphore) -> None:
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


async def send_transfers(session: aiohttp.ClientSession, spec: dict, stop: asyncio.Event) -> int:
    faucet = load_identity(spec["faucet_key"])
    urls, rate, sent = spec["urls"], float(spec["tx_rate"]), 0
    while rate > 0 and not stop.is_set():
        tx = build_tx(faucet, spec["chain_id"], sent, "transfer", {"to": faucet.peer_id, "amount": 1}, 1)
        body = {"jsonrpc": "2.0", "id": sent, "method": "dkb_sendRawTransaction", "params": [tx.raw.hex()]}
        try:
            async with session.post(urls[sent % len(urls)] + "/", json=body) as response:
                accepted = "error" not in await response.json()
        except (aiohttp.ClientError, OSError, ValueError):
            accepted = False
        sent += accepted   # a refused transfer is sent again with the same nonce
        await asyncio.sleep(1.0 / rate)
    return sent


async def rounds_per_height(session: aiohttp.ClientSession, url: str) -> float | None:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    values = {}
    for line in text.splitlines():
        for name in ("dekube_consensus_rounds_per_height_sum", "dekube_consensus_rounds_per_height_count"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    count = values.get("dekube_consensus_rounds_per_height_count")
    return round(values["dekube_consensus_rounds_per_height_sum"] / count, 3) if count else None


async def measure(spec: dict) -> dict:
    heads: list[tuple[int, int, float, int]] = []
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        connected = asyncio.Semaphore(0)
        followers = [asyncio.create_task(follow(session, i, url, heads, stop, connected))
                     for i, url in enumerate(spec["urls"])]
        for _ in spec["urls"]:   # every validator answers (or the run fails below: no heads)
            await asyncio.wait_for(connected.acquire(), 120)
        sender = asyncio.create_task(send_transfers(session, spec, stop))
        started = time.time()
        await asyncio.sleep(float(spec.get("warmup_s", 0)) + float(spec["seconds"]))
        stop.set()
        sent = await sender
        await asyncio.gather(*followers, return_exceptions=True)
        rounds = await rounds_per_height(session, spec["urls"][0])
    counted = [h for h in heads if h[2] >= started + float(spec.get("warmup_s", 0))]
    finality = [at - time_ms / 1000.0 for _i, _h, at, time_ms in counted]
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
        "rounds_mean": rounds,
        "transfers_sent": sent,
    }


def main() -> None:
    print(json.dumps(asyncio.run(measure(json.loads(sys.argv[1])))), flush=True)


if __name__ == "__main__":
    main()
