"""Relay benchmark: direct vs relayed vs py-libp2p's relay on loopback, fairness, reservation latency.

Loopback part (each function is self-contained and spawns its own processes; the relay, the
receiver and the sender each run in their own process, so the numbers are CPU-bound on loopback):
  loopback_direct_MBps()    MB/s (10^6 bytes) of one bulk stream A -> B on a direct connection
  loopback_relayed_MBps()   the same A -> B through our relay (noise + yamux end to end, over the
                            A-relay and relay-B connections)
  pylibp2p_relay_MBps()     py-libp2p 0.8.1 peers through a py-libp2p relay (data cap lifted)
  jain_8_flows()            Jain's fairness index of 8 concurrent flows (8 circuits) through one relay
                            to one receiver with fixed yamux windows (``jain_8_flows_autotuned_windows``:
                            with the receiver's default window auto-tuning)
  reserve_p99_ms()          p99 of RESERVE round trips on an open connection to the relay
  reserve_ledger_p99_ms()   the same with ledger-backed admission and no cache: per RESERVE the
                            relay asks dkb_getNode + dkb_getStake over JSON-RPC (a stub ledger
                            server in its own process answers, as a validator does from memory)
The netlab part (``netlab_direct_Mbps``, ``netlab_relayed_Mbps``, ``failover_s``: 1 Gbit/s tbf home
links behind NAT routers in network namespaces, root needed) comes from bench/relay_netlab.py.
Prints progress to stderr and, as its last stdout line, one JSON object.
Usage: python bench/relay.py [--mib 256]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from relay_netlab import netlab_figures  # noqa: E402

from node.identity import Identity  # noqa: E402
from node.ledger import LedgerGateway  # noqa: E402
from node.p2p.host import Host  # noqa: E402
from node.p2p.limits import HostLimits  # noqa: E402
from node.p2p.yamux import INITIAL_WINDOW  # noqa: E402
from relay.client import RelayClient  # noqa: E402
from relay.ledger_access import StakeLookup  # noqa: E402
from relay.service import Admission, RelayService  # noqa: E402

PY_RELAY_PEER = ROOT / "tests" / "interop" / "relay_pylibp2p_peer.py"
SINK = "/dekube/sink/1.0.0"
MIB = 1 << 20
CHUNK = MIB
JAIN_FLOWS = 8
JAIN_SECONDS = 4.0
RESERVATIONS = 300
# each bulk circuit rides its own relay connection: allow more than the default 8 per peer
BENCH_LIMITS = HostLimits(max_connections_per_peer=64)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- child processes
async def sink_handler(stream) -> None:
    total = 0
    while True:
        data = await stream.read()
        if not data:
            break
        total += len(data)
    await stream.write(json.dumps({"bytes": total}).encode())
    await stream.close()


async def wait_stdin_closed() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def serve_relay(ledger_rpc: str | None = None) -> None:
    """A relay admitting every peer: as registered with stake 1, or, with ``ledger_rpc``, by an
    uncached ledger lookup over JSON-RPC for every request."""
    identity = Identity.generate()
    host = Host(identity, limits=BENCH_LIMITS)
    await host.start()
    stake_of = StakeLookup(LedgerGateway(identity, [ledger_rpc]), ttl=0) if ledger_rpc else (lambda peer: 1)
    service = RelayService(host, Admission(stake_of=stake_of))
    service.start()
    print(f"ADDR {host.listen_addrs[0]}", flush=True)
    await wait_stdin_closed()
    await service.stop()
    await host.stop()


async def serve_ledger() -> None:
    """A stub ledger JSON-RPC: every peer is registered with 1000 bonded."""
    from aiohttp import web

    async def handle(request):
        body = await request.json()
        peer = body["params"][0]
        result = ({"peer_id": peer, "roles": ["compute"], "listen_addrs": [], "relay_addrs": []}
                  if body["method"] == "dkb_getNode" else {"bonded": 1000, "unbonding": [], "slashed": 0})
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"ADDR http://127.0.0.1:{port}", flush=True)
    await wait_stdin_closed()
    await runner.cleanup()


async def serve_sink(relay_addr: str | None, max_window: int | None) -> None:
    muxer_options = {} if max_window is None else {"max_window": max_window}
    client = RelayClient(Host(Identity.generate(), limits=BENCH_LIMITS, muxer_options=muxer_options))
    client.host.set_handler(SINK, sink_handler)
    await client.host.start()
    client.start()
    addr = client.host.listen_addrs[0]
    if relay_addr:
        await client.reserve(relay_addr)
        addr = client.relayed_addrs[0]
    print(f"ADDR {addr}", flush=True)
    await wait_stdin_closed()
    await client.host.stop()


# ---------------------------------------------------------------- orchestration helpers
async def spawn(*args: str, prefix: bytes = b"ADDR ") -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(*args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            raise RuntimeError(f"{args}: exited before printing {prefix!r}")
        if line.startswith(prefix):
            return proc, line.split()[1 if prefix == b"ADDR " else 2].decode()


async def finish(*procs) -> None:
    for proc in procs:
        if proc.stdin and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def send(conn, mib: int) -> float:
    """Send ``mib`` MiB on one sink stream; MB/s until the receiver confirmed every byte."""
    stream = await conn.open_stream(SINK)
    payload = bytes(CHUNK)
    start = time.perf_counter()
    for _ in range(mib):
        await stream.write(payload)
    await stream.close()
    reply = b""
    while data := await stream.read():
        reply += data
    elapsed = time.perf_counter() - start
    if json.loads(reply)["bytes"] != mib * CHUNK:
        raise RuntimeError(f"receiver got {reply!r}, expected {mib * CHUNK} bytes")
    return mib * CHUNK / elapsed / 1e6


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds used so far by process ``pid`` (default: this process)."""
    with open(f"/proc/{pid or 'self'}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by this process and the given children between start() and stop()."""

    def __init__(self, *procs) -> None:
        self.pids = [None] + [p.pid for p in procs]

    def start(self) -> None:
        self.begin = [cpu_seconds(pid) for pid in self.pids]

    def busiest(self) -> float:
        return max(cpu_seconds(pid) - b for pid, b in zip(self.pids, self.begin))


def _run(coro):
    return uvloop.run(coro)


# ---------------------------------------------------------------- measurements
async def _direct(mib: int) -> tuple[float, float]:
    sink, addr = await spawn(sys.executable, __file__, "--serve", "sink")
    host = Host(Identity.generate(), limits=BENCH_LIMITS)
    await host.start()
    try:
        peer = await host.connect(addr)
        conn = await host.open_bulk_connection(peer)
        meter = CpuMeter(sink)
        meter.start()
        rate = await send(conn, mib)
        return rate, mib * CHUNK / meter.busiest() / 1e6
    finally:
        await host.stop()
        await finish(sink)


async def _relayed(mib: int) -> tuple[float, float]:
    relay, relay_addr = await spawn(sys.executable, __file__, "--serve", "relay")
    sink, circuit = await spawn(sys.executable, __file__, "--serve", "sink", "--relay", relay_addr)
    client = RelayClient(Host(Identity.generate(), limits=BENCH_LIMITS))
    await client.host.start()
    try:
        conn = await client.dial([circuit], bulk=True)
        meter = CpuMeter(sink, relay)
        meter.start()
        rate = await send(conn, mib)
        return rate, mib * CHUNK / meter.busiest() / 1e6
    finally:
        await client.host.stop()
        await finish(sink, relay)


async def _pylibp2p(mib: int) -> float:
    relay, relay_addr = await spawn(sys.executable, str(PY_RELAY_PEER), "relay")
    target, circuit = await spawn(sys.executable, str(PY_RELAY_PEER), "target", relay_addr, prefix=b"RESERVED ")
    try:
        sender = await asyncio.create_subprocess_exec(sys.executable, str(PY_RELAY_PEER), "send", circuit, str(mib),
                                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        out, _ = await asyncio.wait_for(sender.communicate(), 600)
        data = json.loads(out.decode().strip().splitlines()[-1])
        if data["reply"]["bytes"] != mib * CHUNK:
            raise RuntimeError(f"py-libp2p receiver got {data}")
        return data["MBps"]
    finally:
        await finish(target, relay)


async def _jain(flows: int, seconds: float, autotune: bool) -> tuple[float, list[int]]:
    relay, relay_addr = await spawn(sys.executable, __file__, "--serve", "relay")
    window = [] if autotune else ["--max-window", str(INITIAL_WINDOW)]
    sink, circuit = await spawn(sys.executable, __file__, "--serve", "sink", "--relay", relay_addr, *window)
    client = RelayClient(Host(Identity.generate(), limits=BENCH_LIMITS))
    await client.host.start()
    try:
        conns = [await client.dial([circuit], bulk=True) for _ in range(flows)]
        streams = [await conn.open_stream(SINK) for conn in conns]
        deadline = time.monotonic() + seconds
        payload = bytes(256 * 1024)

        async def flow(stream) -> int:
            while time.monotonic() < deadline:
                await stream.write(payload)
            await stream.close()
            reply = b""
            while data := await stream.read():
                reply += data
            return json.loads(reply)["bytes"]

        counts = await asyncio.gather(*(flow(s) for s in streams))
    finally:
        await client.host.stop()
        await finish(sink, relay)
    jain = sum(counts) ** 2 / (len(counts) * sum(c * c for c in counts))
    return jain, counts


async def _reserve_latencies(count: int, ledger: bool = False) -> list[float]:
    helpers = []
    relay_args = []
    if ledger:
        stub, url = await spawn(sys.executable, __file__, "--serve", "ledger")
        helpers.append(stub)
        relay_args = ["--ledger-rpc", url]
    relay, relay_addr = await spawn(sys.executable, __file__, "--serve", "relay", *relay_args)
    client = RelayClient(Host(Identity.generate(), limits=BENCH_LIMITS))
    await client.host.start()
    try:
        await client.reserve(relay_addr)  # connection set up once; then each RESERVE is one round trip
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            await client.reserve(relay_addr)
            samples.append(time.perf_counter() - start)
        return samples
    finally:
        await client.host.stop()
        await finish(relay, *helpers)


def loopback_direct(mib: int = 256) -> tuple[float, float]:
    """(wall-clock MB/s, CPU-bound MB/s = bytes / CPU seconds of the busiest process)."""
    return _run(_direct(mib))


def loopback_relayed(mib: int = 256) -> tuple[float, float]:
    return _run(_relayed(mib))


def loopback_direct_MBps(mib: int = 256) -> float:
    return loopback_direct(mib)[0]


def loopback_relayed_MBps(mib: int = 256) -> float:
    return loopback_relayed(mib)[0]


def pylibp2p_relay_MBps(mib: int = 64) -> float:
    return _run(_pylibp2p(mib))


def jain_8_flows(autotune: bool = False) -> float:
    """Jain's index of 8 flows through one relay to one receiver. By default the receiver keeps
    fixed 256 KiB yamux windows, so the index measures the relay's scheduling alone; with
    ``autotune`` the receiver's window auto-tuning is on as in a default node."""
    jain, counts = _run(_jain(JAIN_FLOWS, JAIN_SECONDS, autotune))
    log(f"8 flows{' (autotuned windows)' if autotune else ''}, MiB each: {[round(c / MIB) for c in counts]}")
    return jain


def reserve_p99_ms(ledger: bool = False) -> float:
    samples = sorted(_run(_reserve_latencies(RESERVATIONS, ledger)))
    return samples[int(0.99 * (len(samples) - 1))] * 1e3


def reserve_ledger_p99_ms() -> float:
    return reserve_p99_ms(ledger=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--pylibp2p-mib", type=int, default=64)
    parser.add_argument("--serve", choices=["relay", "sink", "ledger"], help=argparse.SUPPRESS)
    parser.add_argument("--ledger-rpc", help=argparse.SUPPRESS)
    parser.add_argument("--relay", help=argparse.SUPPRESS)
    parser.add_argument("--max-window", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "relay":
        return _run(serve_relay(args.ledger_rpc))
    if args.serve == "ledger":
        return _run(serve_ledger())
    if args.serve == "sink":
        return _run(serve_sink(args.relay, args.max_window))
    result: dict = {"mib": args.mib}
    result["direct_MBps"], result["direct_cpu_bound_MBps"] = loopback_direct(args.mib)
    log(f"direct: {result['direct_MBps']:.0f} MB/s ({result['direct_cpu_bound_MBps']:.0f} CPU-bound)")
    result["relayed_MBps"], result["relayed_cpu_bound_MBps"] = loopback_relayed(args.mib)
    log(f"relayed: {result['relayed_MBps']:.0f} MB/s ({result['relayed_cpu_bound_MBps']:.0f} CPU-bound)")
    result["pylibp2p_relay_MBps"] = pylibp2p_relay_MBps(args.pylibp2p_mib)
    log(f"py-libp2p relay: {result['pylibp2p_relay_MBps']:.1f} MB/s")
    result["jain_8_flows"] = jain_8_flows()
    result["jain_8_flows_autotuned_windows"] = jain_8_flows(autotune=True)
    result["reserve_p99_ms"] = reserve_p99_ms()
    result["reserve_ledger_p99_ms"] = reserve_ledger_p99_ms()
    result["relayed_vs_direct"] = result["relayed_MBps"] / result["direct_MBps"]
    result["relayed_vs_direct_cpu_bound"] = result["relayed_cpu_bound_MBps"] / result["direct_cpu_bound_MBps"]
    result["relayed_vs_pylibp2p"] = result["relayed_MBps"] / result["pylibp2p_relay_MBps"]
    result.update(netlab_figures(args.mib))
    result["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
