"""A real dekube ``Node`` for the netlab (its relay client service with hole punching, as
``dekube-node start`` runs it), driven by JSON lines like ``agent.py``.

Run inside a namespace: ``python -m devtools.netlab.node_agent --seed HEX --listen /ip4/A/tcp/P
--relays MADDR,MADDR [--no-hole-punch]``. The node reserves on its relays (``[relay] reserve =
true``) and prints ``READY {"peer_id", "addrs", "punch_port", "relayed_addrs"}`` once it holds a
reservation. Ops (each ``{"id": n, "op": ..., ...}``, answered ``{"id": n, "ok": ..., "result" |
"error"}``):
  relayed_addrs()            -> the node's relayed addresses (what its ledger record carries)
  echo(peer, circuits)       -> {path, remote, seconds}: knowing ``peer`` only by ``circuits``,
                                ``host.open_stream`` an echo stream and round-trip 64 KiB over it
  paths(peer)                -> "direct"/"relayed" for each open connection to the peer
  hole_punch()               -> the relay client's hole-punch status
  port_mapping()             -> the port-mapping service's status (ADR 0221)
  allreduce(peers, codec, numel, round_id, non_reducers)
                             -> {sha256, norm, participants, attempts, bytes_sent, paths}: knowing the
                                other members only by their relayed addresses (``peers``: id ->
                                circuits), average ``contribution(own id, numel)`` with them over
                                the node's bulk connections (ml.allreduce + HostTransport)
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Sequence

import torch

from devtools.netlab.commands import agent_parser, run_agent, serve_commands
from ml.allreduce import AllReduceGroup
from ml.compute.host_transport import HostTransport
from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node

ECHO_PROTOCOL = "/dekube/netlab-echo/1.0.0"
RESERVE_TIMEOUT_S = 30.0


def contribution(peer_id: str, numel: int) -> torch.Tensor:
    """The tensor ``peer_id`` contributes to a netlab all-reduce (the test recomputes it)."""
    seed = int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") >> 1
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


async def echo_round_trip(stream) -> None:
    """Send 64 KiB on an echo stream, half-close, and check that the same bytes come back."""
    payload = os.urandom(64 << 10)
    await stream.write(payload)
    await stream.close()
    echoed = b""
    while chunk := await stream.read():
        echoed += chunk
    if echoed != payload:
        raise RuntimeError(f"echo returned {len(echoed)} bytes, not the {len(payload)} sent")


async def serve_echo(stream) -> None:
    while data := await stream.read():
        await stream.write(data)
    await stream.close()


class NodeAgent:
    def __init__(self, args) -> None:
        overrides = {("p2p", "listen"): args.listen, ("rpc", "enabled"): "false",
                     ("relay", "relays"): args.relays, ("relay", "reserve"): "true",
                     ("relay", "hole_punch"): "false" if args.no_hole_punch else "true"}
        config = load_config(None, env={}, overrides=overrides)
        self.node = Node(config, Identity.from_seed(bytes.fromhex(args.seed)), [basic_role("compute")])
        self.groups: dict[tuple, AllReduceGroup] = {}

    @property
    def relay_client(self):
        return self.node.relay_client.client

    async def op_relayed_addrs(self) -> list[str]:
        return self.relay_client.relayed_addrs

    async def op_echo(self, peer: str, circuits: list[str]) -> dict:
        self.node.host.peerbook.add_addrs(peer, circuits)
        started = time.monotonic()
        stream = await self.node.host.open_stream(peer, ECHO_PROTOCOL)
        await echo_round_trip(stream)
        conn = stream.connection
        peername = conn.secure.tcp.peername
        return {"path": "relayed" if self.relay_client.pipe_for(conn) else "direct",
                "remote": f"{peername[0]}:{peername[1]}" if peername else None,
                "seconds": time.monotonic() - started}

    async def op_bulk_echo(self, peer: str) -> dict:
        """Echo 64 KiB over a new dedicated bulk connection (what the all-reduce opens)."""
        started = time.monotonic()
        conn = await self.node.host.open_bulk_connection(peer)
        try:
            await echo_round_trip(await conn.open_stream(ECHO_PROTOCOL))
            return {"path": "relayed" if self.relay_client.pipe_for(conn) else "direct",
                    "seconds": time.monotonic() - started}
        finally:
            await conn.close()

    async def op_paths(self, peer: str) -> list[str]:
        return ["relayed" if self.relay_client.pipe_for(c) else "direct"
                for c in self.node.host.connections(peer) if not c.closed]

    async def op_allreduce(self, peers: dict[str, list[str]], codec: str, numel: int, round_id: int,
                           non_reducers: Sequence[str] = ()) -> dict:
        members = sorted({*peers, self.node.peer_id})
        for peer, circuits in peers.items():
            self.node.host.peerbook.add_addrs(peer, circuits)
        key = (tuple(members), codec, tuple(sorted(non_reducers)))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = AllReduceGroup(HostTransport(self.node.host), self.node.peer_id, members,
                                                      codec=codec, non_reducers=set(non_reducers))
            await group.start()
        mine = contribution(self.node.peer_id, numel)
        result = await group.allreduce([mine], round_id)
        digest = await asyncio.to_thread(lambda: hashlib.sha256(result.tensors[0].numpy().tobytes()).hexdigest())
        paths = {peer: await self.op_paths(peer) for peer in peers}
        return {"sha256": digest, "norm": float(result.tensors[0].norm()), "participants": list(result.participants),
                "attempts": result.attempts, "bytes_sent": result.bytes_sent, "paths": paths}

    async def op_hole_punch(self) -> dict | None:
        punching = self.node.relay_client.punching
        return punching.status() if punching is not None else None

    async def op_port_mapping(self) -> dict:
        return self.node.services["port_mapping"].status()

    async def run(self) -> None:
        node_task = asyncio.ensure_future(self.node.run())
        try:
            await self._wait_reserved(node_task)
            punching = self.node.relay_client.punching
            self.node.host.set_handler(ECHO_PROTOCOL, serve_echo)
            print("READY " + json.dumps({"peer_id": self.node.peer_id, "addrs": self.node.host.listen_addrs,
                                         "punch_port": punching.puncher.port if punching else None,
                                         "relayed_addrs": self.relay_client.relayed_addrs}), flush=True)
            await serve_commands(self)
        finally:
            for group in self.groups.values():
                await group.close(linger_s=2.0)
            self.node.request_stop()
            await asyncio.wait_for(node_task, 10)

    async def _wait_reserved(self, node_task: asyncio.Task) -> None:
        deadline = time.monotonic() + RESERVE_TIMEOUT_S
        while not self.relay_client.relayed_addrs:
            if node_task.done():
                node_task.result()
                raise RuntimeError("the node stopped before reserving")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no reservation within {RESERVE_TIMEOUT_S} s")
            await asyncio.sleep(0.05)



def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relays", required=True, help="comma-separated relay multiaddrs")
    parser.add_argument("--no-hole-punch", action="store_true")
    run_agent(NodeAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
