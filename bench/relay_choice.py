"""Least-loaded relay choice on loopback (ADR 0227): where new circuits go when relays differ in load
or lie about it, and what a load query costs.

B holds reservations on every relay; A opens ``--circuits`` bulk circuits to B (kept open) with B's
relayed addresses listed busiest relay first (the order an old client tried them in, so without the
ranking every circuit went to the first). Scenarios:
  ``loaded``  three relays of 32 circuits each: one carrying 24 (0.75), one 10 (0.31), one idle;
  ``liar``    a relay that always reports "0 load" beside an honest idle one;
  ``liar_vs_busy``  the liar beside an honest relay carrying 20 of its 32 circuits (0.62);
  ``idle_vs_busy``  an honest idle relay in the liar's place (what the liar's claim is worth beside it).
Prints one JSON object: per scenario and relay the load it reported before, the new circuits it got
and the circuits it carries after; and ``query_ms`` (median and p90 of 50 load queries on an open
connection).
Usage: python bench/relay_choice.py [--circuits 24]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from node.identity import Identity  # noqa: E402
from node.p2p.host import Host  # noqa: E402
from relay.client import RelayClient  # noqa: E402
from relay.load import LoadReport, query_load  # noqa: E402
from relay.role import fit_connection_limit  # noqa: E402
from relay.service import Admission, RelayLimits, RelayService  # noqa: E402

MAX_CIRCUITS = 32


async def endpoint(circuits: int = 0) -> RelayClient:
    host = Host(Identity.generate())
    await host.start()
    if circuits:
        fit_connection_limit(host, circuits)
    client = RelayClient(host)
    client.start()
    return client


async def relay(allow: set[str]) -> RelayService:
    host = Host(Identity.generate())
    await host.start()
    service = RelayService(host, Admission(allow), RelayLimits(max_circuits=MAX_CIRCUITS))
    fit_connection_limit(host, MAX_CIRCUITS)   # one bulk connection per circuit, as the relay role allows
    service.start()
    return service


async def load(service: RelayService, circuits: int, parts: list) -> None:
    src, dst = await endpoint(circuits), await endpoint(circuits)
    parts += [src, dst]
    service.admission.allow_list |= {src.host.peer_id, dst.host.peer_id}
    await dst.reserve(service.host.listen_addrs[0])
    for _ in range(circuits):
        await src.dial(dst.relayed_addrs, bulk=True)


async def scenario(loads: dict[str, int | str], circuits: int) -> dict[str, dict]:
    """Relays named by ``loads`` (circuits to load each with, or "liar"); per relay: the load it
    reported before, the new circuits it got, the circuits it carries after."""
    a, b = await endpoint(circuits), await endpoint(circuits)
    parts: list = [a, b]
    relays = {}
    try:
        for name, spec in loads.items():
            service = await relay({a.host.peer_id, b.host.peer_id})
            relays[name] = service
            parts.append(service)
            if spec == "liar":
                service.load_report = lambda: LoadReport(0, 1 << 31, 0, 1 << 31)   # type: ignore[method-assign]
            else:
                await load(service, int(spec), parts)
            await b.reserve(service.host.listen_addrs[0])
        busiest = max(relays, key=lambda n: relays[n].load_report().utilization)
        addrs = sorted(b.relayed_addrs, key=lambda addr: relays[busiest].host.peer_id not in addr)
        await a.refresh_loads([r.host.listen_addrs[0] for r in relays.values()])
        by_peer = {r.host.peer_id: name for name, r in relays.items()}
        before = {name: round(r.load_report().utilization, 2) for name, r in relays.items()}
        got = dict.fromkeys(relays, 0)
        for _ in range(circuits):
            conn = await a.dial(addrs, bulk=True)
            pipe = a.pipe_for(conn)
            assert pipe is not None
            got[by_peer[pipe.relay_peer]] += 1
        return {name: {"reported_load": before[name], "new_circuits": got[name],
                       "circuits_after": len(r.circuits)} for name, r in relays.items()}
    finally:
        for part in parts:
            if isinstance(part, RelayService):
                await part.stop()
            await part.host.stop()


async def query_ms() -> dict[str, float]:
    a = await endpoint()
    service = await relay({a.host.peer_id})
    try:
        await a.host.connect(service.host.listen_addrs[0])
        times = []
        for _ in range(50):
            started = time.perf_counter()
            await query_load(a.host, service.host.peer_id)
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        return {"median": round(statistics.median(times), 2), "p90": round(times[int(len(times) * 0.9)], 2)}
    finally:
        await service.stop()
        await service.host.stop()
        await a.host.stop()


async def main(circuits: int) -> dict:
    return {
        "circuits": circuits,
        "loaded": await scenario({"busy": 24, "half": 10, "idle": 0}, circuits),
        "liar": await scenario({"liar": "liar", "honest": 0}, circuits),
        "liar_vs_busy": await scenario({"liar": "liar", "busy": 20}, circuits),
        "idle_vs_busy": await scenario({"idle": 0, "busy": 20}, circuits),
        "query_ms": await query_ms(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--circuits", type=int, default=24)
    print(json.dumps(asyncio.run(main(parser.parse_args().circuits))))
