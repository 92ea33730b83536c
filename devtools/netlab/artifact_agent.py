"""A real dekube ``Node`` for the artifact netlab test and bench, driven by JSON lines (``commands.py``).

Run inside a namespace: ``python -m devtools.netlab.artifact_agent --seed HEX --listen /ip4/A/tcp/P
--data-dir DIR [--relays MADDR,...] [--no-hole-punch]``. With relays the node reserves on them and is
READY once it holds a reservation (a NAT'd holder); without, READY at once. Prints ``READY
{"peer_id", "addrs", "relayed_addrs"}``. Ops:
  has(artifact)                   -> whether the store holds it complete
  fetch(artifact, holders)        -> the FetchReport as a dict (``holders``: peer id -> addresses),
                                     plus "Mbps" over the fetch's wall time
  paths(peer)                     -> "direct"/"relayed" for each open connection to the peer
"""
from __future__ import annotations

import time
from pathlib import Path

from devtools.netlab.commands import agent_parser, run_agent, run_node_agent
from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node

RESERVE_TIMEOUT_S = 30.0


class ArtifactAgent:
    def __init__(self, args) -> None:
        overrides = {("p2p", "listen"): args.listen, ("rpc", "enabled"): "false", ("relay", "relays"): args.relays,
                     ("relay", "reserve"): "true" if args.relays else "false",
                     ("relay", "hole_punch"): "false" if args.no_hole_punch else "true"}
        config = load_config(None, env={}, overrides=overrides)
        self.node = Node(config, Identity.from_seed(bytes.fromhex(args.seed)), [basic_role("compute")],
                         data_dir=Path(args.data_dir))
        self.relays = args.relays

    async def op_has(self, artifact: str) -> bool:
        return self.node.artifacts.has(artifact)

    async def op_fetch(self, artifact: str, holders: dict[str, list[str]]) -> dict:
        for peer, addrs in holders.items():
            self.node.host.peerbook.add_addrs(peer, addrs)
        started = time.monotonic()
        report = await self.node.artifacts.fetch_report(artifact, list(holders))
        seconds = time.monotonic() - started
        return {"path": str(report.path), "size": report.size, "received_bytes": report.received_bytes,
                "resumed_bytes": report.resumed_bytes, "seconds": seconds, "per_holder": report.per_holder,
                "dropped": report.dropped, "bad_holders": report.bad_holders,
                "Mbps": report.received_bytes * 8 / 1e6 / seconds if seconds else 0.0}

    async def op_paths(self, peer: str) -> list[str]:
        client = self.node.relay_client.client
        return ["relayed" if client.pipe_for(c) else "direct" for c in self.node.host.connections(peer) if not c.closed]

    async def run(self) -> None:
        await run_node_agent(self, RESERVE_TIMEOUT_S)


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--relays", default="", help="comma-separated relay multiaddrs")
    parser.add_argument("--no-hole-punch", action="store_true")
    run_agent(ArtifactAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
