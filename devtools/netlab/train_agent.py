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
  add_state(mib, seed) -> {artifact, sha256, bytes}: a trainer state file (model weights and Adam moments,
                          the layout ml/train/state_file.py writes) of about ``mib`` MiB, the same for the
                          same seed, added to the node's artifacts (a member holding an epoch's state).
  catch_up(artifact, sha256, holders) -> {fetch_s, check_s, load_s, total_s, per_holder}: what a joiner
                          does before it trains (ml/compute/crew_changes.py): fetch the state from every
                          holder at once, check its sha256, read it with the bounded state-file reader.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time

import torch

from devtools.netlab.commands import agent_parser, run_agent
from devtools.netlab.node_agent import NodeAgent
from ml.allreduce import AllReduceGroup
from ml.compute.epoch_states import sha256_of_file
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.train.data_parallel import DataParallelTrainer
from ml.train.diloco import OuterTrainer
from ml.train.spec import TrainSpec
from ml.train.state_file import load_state, state_bytes
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


    async def op_add_state(self, mib: int, seed: int = 0) -> dict:
        data = await asyncio.to_thread(_state_file_of, mib, seed)
        return {"artifact": await self.node.artifacts.add_bytes(data), "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data)}

    async def op_catch_up(self, artifact: str, sha256: str, holders: dict[str, list[str]]) -> dict:
        for peer, circuits in holders.items():
            self.node.host.peerbook.add_addrs(peer, circuits)
        started = time.monotonic()
        report = await self.node.artifacts.fetch_report(artifact, list(holders))
        fetched = time.monotonic()
        if await asyncio.to_thread(sha256_of_file, report.path) != sha256:
            raise RuntimeError("the fetched state does not hash to the committed digest")
        checked = time.monotonic()
        await asyncio.to_thread(lambda: load_state(report.path.read_bytes()))
        loaded = time.monotonic()
        return {"fetch_s": fetched - started, "check_s": checked - fetched, "load_s": loaded - checked,
                "total_s": loaded - started, "bytes": report.size, "per_holder": dict(report.per_holder)}


def _state_file_of(mib: int, seed: int) -> bytes:
    """A trainer state of about ``mib`` MiB: a model of mib/3 MiB of float32 weights and the Adam moments."""
    generator = torch.Generator().manual_seed(seed)
    numel = max(1, mib * (1 << 20) // 12)
    rows = max(1, numel // 1024)
    weights = torch.randn(rows, 1024, generator=generator)
    state = {"model": {"layer.weight": weights},
             "inner": {"state": {0: {"step": torch.tensor(100.0), "exp_avg": weights * 0.1,
                                     "exp_avg_sq": weights * weights}},
                       "param_groups": [{"lr": 0.001, "params": [0]}]},
             "averager": {}, "step": 100}
    return state_bytes(state)


def main() -> None:
    parser = agent_parser()
    parser.add_argument("--relays", required=True, help="comma-separated relay multiaddrs")
    parser.add_argument("--no-hole-punch", action="store_true")
    run_agent(TrainAgent(parser.parse_args()))


if __name__ == "__main__":
    main()
