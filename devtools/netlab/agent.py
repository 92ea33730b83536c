"""A dekube node for the netlab, driven line by line over stdin/stdout with JSON commands.

Run inside a namespace: ``python -m devtools.netlab.agent --seed HEX --listen /ip4/A/tcp/P [--relay
--allow ID,ID] [--punch-port N] [--auto-punch] [--port-map]``. Every agent runs a Host with a relay client
(reservations, circuits, receipt co-signing), an AutoNAT server, a hole puncher (with
``--auto-punch`` it starts DCUtR on inbound relayed connections) and a resumable-transfer receiver;
``--relay`` adds the circuit relay v2 service admitting the allow-listed peers; ``--quic ADDR`` (repeatable)
listens on QUIC too (``/ip4|ip6/A/udp/P/quic-v1``: DCUtR then punches over QUIC beside TCP, ADR 0228) and
``--no-tcp-punch``
leaves the TCP punch out; ``--port-map`` asks the
home router for mappings of the listen and punch ports (relay/portmap, ADR 0221) before READY, advertises
the listen port's in identify and offers the punch port's first in DCUtR. It prints
``READY {"peer_id": ..., "addrs": [...]}`` and then answers each command line
``{"id": n, "op": ..., ...}`` with ``{"id": n, "ok": true, "result": ...}`` or ``{"id": n, "ok":
false, "error": "..."}``; commands run concurrently. It exits when stdin closes. Ops:
  reserve(relay)                     -> relayed addresses          connect_public(addr) -> observed addr
  reachability(servers)              -> "public"|"private"|...     dial(circuits) -> relay used
  ping(addr)                         -> round-trip seconds
  maintain(candidates)               -> None (reservations kept in the background); reservations()
  junk(addr, protocol, data)         -> the reply to raw bytes sent on a new stream (hex)
  connect(circuits, punch)           -> {conn, direct, relay, remote}
  dial_peer(peer, direct, circuits)  -> {conn, kind}: direct, else relayed + punch (holepunch_dial)
  disconnect(peer)                   -> how many connections to the peer were closed
  paths(peer)                        -> "direct"/"relayed" for each open connection to the peer
  send(mib, conn | circuits, stall_timeout) -> {seconds, cpu_s, starts, relays, id, sha256}
  received(transfer)                 -> {bytes, done, sha256}      incoming() -> {id: bytes so far}
  attempts()                         -> resumable-transfer attempts the receiver has started
  cpu()                              -> CPU seconds this agent used so far
  status()                           -> relay counters, co-signed receipts, our circuits' byte counts
                                        (a relay: also each open circuit's src, dst and bytes)
  port_mapping()                     -> {"listen" | "punch": mapped multiaddr or None, "errors": {...}}
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from typing import Any

from devtools.netlab.commands import agent_parser, run_agent, serve_commands
from devtools.resumable import RESUMABLE_PROTOCOL, ResumableReceiver, send_resumable
from node.identity import Identity
from node.p2p.host import Host
from node.p2p.limits import HostLimits
from node.p2p.multiaddr import Multiaddr
from relay.client import RelayClient, RelayRefused
from relay.holepunch import HolePuncher
from relay.holepunch_dial import dial_peer
from relay.holepunch_inbound import upgrade_inbound
from relay.portmap.gateway import default_gateway, local_address
from relay.portmap.keeper import MappingKeeper
from relay.portmap.mapper import PortMapper
from relay.reachability import AutoNATServer, assess
from relay.service import Admission, RelayService

MIB = 1 << 20
LIMITS = HostLimits(max_connections_per_peer=64)


def pattern(size: int) -> bytes:
    block = hashlib.sha256(b"dekube-netlab").digest() * (MIB // 32)
    return (block * (size // MIB + 1))[:size]


class Agent:
    def __init__(self, args) -> None:
        listen = [args.listen, *args.quic]
        self.host = Host(Identity.from_seed(bytes.fromhex(args.seed)), listen, limits=LIMITS)
        self.client = RelayClient(self.host)
        self.puncher = HolePuncher(self.host, args.punch_port, attempts=args.punch_attempts,
                                   punch_window=args.punch_window, tcp=not args.no_tcp_punch)
        self.receiver = ResumableReceiver()
        self.service = None
        if args.relay:
            allow = {p for p in args.allow.split(",") if p}
            self.service = RelayService(self.host, Admission(allow))
        self.conns: dict[str, Any] = {}
        self.keeper: asyncio.Task | None = None
        self.auto_punch = args.auto_punch
        self.inbound_puncher: asyncio.Task | None = None
        self.port_map = args.port_map
        self.keepers: dict[str, MappingKeeper] = {}
        self.keeping: list[asyncio.Task] = []

    async def start(self) -> None:
        await self.host.start()
        self.client.start()
        self.puncher.start()
        AutoNATServer(self.host).start()
        self.host.set_handler(RESUMABLE_PROTOCOL, self.receiver.serve)
        if self.service is not None:
            self.service.start()
        if self.auto_punch:
            self.inbound_puncher = asyncio.ensure_future(upgrade_inbound(self.puncher, self.client))
        if self.port_map:
            await self._map_ports()

    async def _map_ports(self) -> None:
        """Keep mappings of the listen and punch ports; return once both first attempts ended."""
        gateway = default_gateway()
        if gateway is None:
            return
        local = local_address(gateway)
        listen_port = Multiaddr.parse(self.host.listen_addrs[0]).tcp_endpoint()[1]

        def offer(mapping) -> None:
            self.puncher.mapped = [Multiaddr.parse(mapping.multiaddr)] if mapping else []
        self.keepers = {"listen": MappingKeeper(PortMapper(gateway, local, listen_port)),
                        "punch": MappingKeeper(PortMapper(gateway, local, self.puncher.port), offer)}
        listen = self.keepers["listen"]
        self.host.advertise_extra_addrs(lambda: [listen.mapping.multiaddr] if listen.mapping else [],
                                        source="port_mapping")
        self.keeping = [asyncio.ensure_future(k.run()) for k in self.keepers.values()]
        while any(k.mapping is None and k.last_error is None for k in self.keepers.values()):
            await asyncio.sleep(0.02)

    # ---- ops
    async def op_reserve(self, relay: str) -> list[str]:
        try:
            await self.client.reserve(relay)
        except RelayRefused as exc:
            raise RuntimeError(f"refused: {exc.status.name if exc.status else 'no status'}") from None
        return self.client.relayed_addrs

    async def op_connect_public(self, addr: str) -> str | None:
        observed = await self.puncher.connect_public(addr)
        return str(observed) if observed else None

    async def op_maintain(self, candidates: list[str]) -> None:
        """Keep reservations on the best relays among ``candidates`` in the background (none: stop)."""
        if self.keeper is not None:
            self.keeper.cancel()
        self.keeper = asyncio.ensure_future(self.client.maintain(candidates)) if candidates else None

    async def op_reservations(self) -> dict:
        return {relay: rsvp.rtt for relay, rsvp in self.client.reservations.items()}

    async def op_junk(self, addr: str, protocol: str, data: str) -> str:
        """Send ``data`` (hex) on a new ``protocol`` stream to the peer at ``addr``; the reply (hex)."""
        stream = await self.host.open_stream(await self.host.connect(addr), protocol)
        await stream.write(bytes.fromhex(data))
        reply = b""
        with contextlib.suppress(ConnectionError):  # the peer may reset the stream after answering
            async with asyncio.timeout(15):
                while chunk := await stream.read():
                    reply += chunk
        return reply.hex()

    async def op_ping(self, addr: str) -> float:
        return await self.host.ping(await self.host.connect(addr))

    async def op_reachability(self, servers: list[str]) -> str:
        return (await assess(self.host, servers)).value

    async def op_dial(self, circuits: list[str]) -> str:
        conn = await self.client.dial(circuits)
        pipe = self.client.pipe_for(conn)
        assert pipe is not None, "a dialled circuit has a pipe"
        return pipe.relay_peer

    async def op_connect(self, circuits: list[str], punch: bool = False, bulk: bool = True) -> dict:
        relayed = await self.client.dial(circuits, bulk=bulk and not punch)
        conn = relayed
        if punch:
            direct = await self.puncher.direct_connect(relayed)
            conn = direct or relayed
        key = f"c{len(self.conns)}"
        self.conns[key] = conn
        pipe = self.client.pipe_for(conn)
        peer = conn.secure.tcp.peername
        return {"conn": key, "direct": pipe is None, "relay": pipe.relay_peer if pipe else None,
                "remote": f"{peer[0]}:{peer[1]}" if peer else None, "quic": conn.quic,
                "quic_packets": self.puncher.quic.packets_sent}

    async def op_dial_peer(self, peer: str, direct: list[str], circuits: list[str]) -> dict:
        path = await dial_peer(self.host, self.client, self.puncher, peer, direct, circuits, direct_timeout=1.0)
        key = f"c{len(self.conns)}"
        self.conns[key] = path.conn
        return {"conn": key, "kind": path.kind}

    async def op_paths(self, peer: str) -> list[str]:
        """How each open connection to ``peer`` goes: "direct" or "relayed"."""
        return ["relayed" if self.client.pipe_for(c) else "direct" for c in self.host.connections(peer) if not c.closed]

    async def op_disconnect(self, peer: str) -> int:
        conns = self.host.connections(peer)
        for conn in conns:
            await conn.close()
        return len(conns)

    async def op_send(self, mib: int, conn: str | None = None, circuits: list[str] | None = None,
                      stall_timeout: float | None = None) -> dict:
        """A resumable transfer on connection ``conn``, or over a fresh bulk circuit through the first
        working relay of ``circuits`` per attempt (closed once the transfer is done)."""
        data = pattern(mib * MIB)
        transfer_id = os.urandom(16)
        relays: list[str] = []
        opened: list[Any] = []

        async def open_path():
            if conn is not None:
                path = self.conns[conn]
            else:
                if opened:  # a retry: the last path failed or went silent
                    await self.client.abandon(opened[-1])
                path = await self.client.dial(circuits, bulk=True)
                opened.append(path)
                relays.append(self.client.pipe_for(path).relay_peer)
            return await path.open_stream(RESUMABLE_PROTOCOL)

        digest = hashlib.sha256(data).hexdigest()
        cpu_before, started = self._cpu(), time.perf_counter()
        try:
            starts = await send_resumable(open_path, transfer_id, data, attempts=8, retry_delay=0.05,
                                          stall_timeout=stall_timeout)
        finally:
            for path in opened:
                await path.close()
        return {"seconds": time.perf_counter() - started, "cpu_s": self._cpu() - cpu_before, "starts": starts,
                "relays": relays, "id": transfer_id.hex(), "sha256": digest}

    async def op_received(self, transfer: str) -> dict:
        record = self.receiver.transfers.get(bytes.fromhex(transfer))
        if record is None:
            return {"bytes": 0, "done": False, "sha256": None}
        done = record.done.is_set()
        digest = await asyncio.to_thread(lambda: hashlib.sha256(record.data).hexdigest()) if done else None
        return {"bytes": len(record.data), "done": done, "sha256": digest}

    async def op_incoming(self) -> dict:
        return {tid.hex(): len(t.data) for tid, t in self.receiver.transfers.items()}

    async def op_attempts(self) -> int:
        return self.receiver.attempts

    @staticmethod
    def _cpu() -> float:
        return time.process_time()  # nanosecond clock; os.times() ticks at 10 ms

    async def op_cpu(self) -> float:
        return self._cpu()

    async def op_status(self) -> dict:
        circuits = {s.hex(): {"relay": c.relay, "bytes": c.bytes_total()}
                    for s, (c, _p) in self.client.circuits.items()}
        out: dict[str, Any] = {"circuits": circuits}
        if self.service is not None:
            out["relay"] = self.service.status()
            out["open_circuits"] = {c.session.hex(): {"src": c.src, "dst": c.dst, "bytes": c.bytes_total}
                                    for c in self.service.policy.circuits}
            out["receipts"] = [{"session": p["receipt"]["session"].hex(), "bytes": p["receipt"]["bytes_total"],
                                "src": p["receipt"]["src"], "dst": p["receipt"]["dst"]}
                               for p in self.service.submitted]
        return out

    async def op_port_mapping(self) -> dict:
        return {**{name: k.mapping.multiaddr if k.mapping else None for name, k in self.keepers.items()},
                "errors": {name: k.last_error for name, k in self.keepers.items()}}

    async def run(self) -> None:
        await self.start()
        print("READY " + json.dumps({"peer_id": self.host.peer_id, "addrs": self.host.listen_addrs,
                                     "punch_port": self.puncher.port}), flush=True)
        await serve_commands(self)
        for task in (self.keeper, self.inbound_puncher):
            if task is not None:
                task.cancel()
        for task in self.keeping:   # each deletes its mapping
            task.cancel()
        await asyncio.gather(*self.keeping, return_exceptions=True)
        await self.host.stop()


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relay", action="store_true")
    parser.add_argument("--allow", default="")
    parser.add_argument("--punch-port", type=int, default=0)
    parser.add_argument("--punch-attempts", type=int, default=3)
    parser.add_argument("--punch-window", type=float, default=5.0)
    parser.add_argument("--auto-punch", action="store_true", help="start DCUtR on inbound relayed connections")
    parser.add_argument("--port-map", action="store_true", help="map the listen and punch ports on the home router")
    parser.add_argument("--quic", action="append", default=[], help="a QUIC listen address: punch over QUIC too")
    parser.add_argument("--no-tcp-punch", action="store_true", help="punch over QUIC only")
    run_agent(Agent(parser.parse_args()))


if __name__ == "__main__":
    main()
