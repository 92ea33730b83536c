"""A netlab Node that trains (bench/training_netlab.py): ``node_agent.py``'s real dekube Node with two
more ops, ``prepare`` and ``train``, which run the workers' trainer for a spec with its averages going
over the network all-reduce among the given members, built as a compute node's job builds them
(ml/compute/executor.py ``make_group`` with the task deadlines, ``prepare_trainer``) on the node's
bulk connections; the group's protocol id is derived from the spec (one group per run).

  prepare(peers, spec) -> rank: knowing the other members only by their relayed addresses (``peers``:
                          id -> circuits), build the group (started: its protocol is served) and the
                          trainer of ``spec`` (a TrainSpec dict); rank = this node's index among the
                          sorted members. Every member prepares before any trains (the compute
                          node's start barrier: a round opened to a member whose group is not
                          started fails with NoCommonProtocol).
  train()              -> {rank, steps, bytes_sent, params_hash, compute_s, wall_s, wait_s, metrics}:
                          train the prepared spec to the end; ``wall_s`` is training only,
                          ``metrics`` the held-out evaluation after.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time

from devtools.netlab.commands import agent_parser, run_agent
from devtools.netlab.node_agent import NodeAgent
from ml.allreduce import AllReduceGroup
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.train.data_parallel import DataParallelTrainer
from ml.train.diloco import OuterTrainer
from ml.train.spec import TrainSpec
from ml.train.worker import TrainerBase


class TrainAgent(NodeAgent):
    def __init__(self, args) -> None:
        super().__init__(args)
        self.prepared: tuple[TrainSpec, AllReduceGroup, TrainerBase] | None = None

    async def op_prepare(self, peers: dict[str, list[str]], spec: dict) -> int:
        job = TrainSpec.from_dict(spec)
        members = sorted({*peers, self.node.peer_id})
        for peer, circuits in peers.items():
            self.node.host.peerbook.add_addrs(peer, circuits)
        group = make_group(job, HostTransport(self.node.host), self.node.peer_id, members,
                           hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).digest())
        trainer = await asyncio.to_thread(prepare_trainer, job, group, members.index(self.node.peer_id), len(members))
        await group.start()
        self.prepared = (job, group, trainer)
        return trainer.rank

    async def op_train(self) -> dict:
        if self.prepared is None:
            raise RuntimeError("train before prepare")
        (job, group, trainer), self.prepared = self.prepared, None
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
                "params_hash": trainer.params_hash(), "compute_s": trainer.compute_seconds, "wall_s": wall_s,
                "wait_s": getattr(trainer, "wait_seconds", 0.0), "metrics": metrics}


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relays", required=True, help="comma-separated relay multiaddrs")
    parser.add_argument("--no-hole-punch", action="store_true")
    run_agent(TrainAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
