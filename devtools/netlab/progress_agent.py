"""A real dekube ``Node`` in a netlab namespace for the progress and bandwidth checks, driven by JSON
lines (devtools/netlab/commands.py).

``python -m devtools.netlab.progress_agent --seed HEX --listen /ip4/A/tcp/P [--relays MADDR,...]``;
with relays it reserves (hole punching off) and is READY once it holds a reservation. Ops:
  run_job(task, steps, step_s)   -> starts a fake job of `steps` steps on the node's progress board
  follow(peer, addrs, task)      -> every update follow_progress yielded, and how the connection went
  probe(peer, addrs, size)       -> node.bandwidth.probe's figures
"""
from __future__ import annotations

import asyncio

from devtools.netlab.commands import agent_parser, run_agent, run_node_agent
from ml.compute import progress_protocol
from ml.compute.job_board import JobBoard
from node import bandwidth
from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node

RESERVE_TIMEOUT_S = 30.0


class ProgressAgent:
    def __init__(self, args) -> None:
        overrides = {("p2p", "listen"): args.listen, ("rpc", "enabled"): "false", ("relay", "relays"): args.relays,
                     ("relay", "reserve"): "true" if args.relays else "false", ("relay", "hole_punch"): "false"}
        self.node = Node(load_config(None, env={}, overrides=overrides), Identity.from_seed(bytes.fromhex(args.seed)),
                         [basic_role("compute")])
        self.board = JobBoard()
        self.node.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(self.board))
        self.relays = args.relays
        self._jobs: set[asyncio.Task] = set()

    async def op_run_job(self, task: str, steps: int, step_s: float) -> bool:
        async def job() -> None:
            self.board.start(task, steps=steps)
            self.board.update(task, state="training")
            for step in range(1, steps + 1):
                await asyncio.sleep(step_s)
                self.board.update(task, step=step, loss=1.0 / step, bytes_sent=1000 * step)
            self.board.update(task, state="committed", result="ab" * 32)

        running = asyncio.ensure_future(job())
        self._jobs.add(running)
        running.add_done_callback(self._jobs.discard)
        return True

    async def op_follow(self, peer: str, addrs: list[str], task: str) -> dict:
        self.node.host.peerbook.add_addrs(peer, addrs)
        updates = [u async for u in progress_protocol.follow_progress(self.node.host, peer, bytes.fromhex(task))]
        client = self.node.relay_client.client
        paths = ["relayed" if client.pipe_for(conn) else "direct"
                 for conn in self.node.host.connections(peer) if not conn.closed]
        return {"updates": updates, "paths": paths}

    async def op_probe(self, peer: str, addrs: list[str], size: int) -> dict:
        self.node.host.peerbook.add_addrs(peer, addrs)
        meter = bandwidth.BandwidthMeter()
        figures = await bandwidth.probe(self.node.host, peer, meter, size)
        return {**figures, "latency_s": await bandwidth.measure_latency(self.node.host, peer, meter)}

    async def run(self) -> None:
        await run_node_agent(self, RESERVE_TIMEOUT_S)


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relays", default="")
    run_agent(ProgressAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
