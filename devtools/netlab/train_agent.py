"""A netlab Node that trains (bench/training_netlab.py): ``node_agent.py``'s real dekube Node with one
more op, ``train``, which runs the workers' trainer for a spec with its averages going over the
network all-reduce among the given members, built as a compute node's job builds them
(ml/compute/executor.py ``make_group`` with the task deadlines, ``prepare_trainer``) on the node's
bulk connections; the group's protocol id is derived from the spec (one group per run).

  train(peers, spec)  -> {rank, steps, bytes_sent, compute_s, wall_s, wait_s, metrics}: knowing the
                         other members only by their relayed addresses (``peers``: id -> circuits),
                         train ``spec`` (a TrainSpec dict) as rank = this node's index among the sorted
                         members; ``wall_s`` is training only, ``metrics`` the held-out evaluation after.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time

from devtools.netlab.commands import agent_parser, run_agent
from devtools.netlab.node_agent import NodeAgent
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.train.data_parallel import DataParallelTrainer
from ml.train.diloco import OuterTrainer
from ml.train.spec import TrainSpec


class TrainAgent(NodeAgent):
    async def op_train(self, peers: dict[str, list[str]], spec: dict) -> dict:
        job = TrainSpec.from_dict(spec)
        members = sorted({*peers, self.node.peer_id})
        for peer, circuits in peers.items():
            self.node.host.peerbook.add_addrs(peer, circuits)
        group = make_group(job, HostTransport(self.node.host), self.node.peer_id, members,
                           hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).digest())
        trainer = await asyncio.to_thread(prepare_trainer, job, group, self.node.peer_id, members)
        await group.start()
        try:
            started = time.monotonic()
            if isinstance(trainer, OuterTrainer):
                while trainer.outer_step < job.outer_steps:
                    await trainer.outer_round()
            else:
                assert isinstance(trainer, DataParallelTrainer)
                while trainer.step < job.steps:
                    await trainer.train_step()
            wall_s = time.monotonic() - started
            metrics = await trainer.evaluate()
        finally:
            await group.close(linger_s=2.0)
        return {"rank": trainer.rank, "steps": trainer.step, "bytes_sent": trainer.bytes_sent,
                "compute_s": trainer.compute_seconds, "wall_s": wall_s,
                "wait_s": getattr(trainer, "wait_seconds", 0.0), "metrics": metrics}


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relays", required=True, help="comma-separated relay multiaddrs")
    parser.add_argument("--no-hole-punch", action="store_true")
    run_agent(TrainAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
