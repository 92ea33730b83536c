"""Running one training job among several processes over the network all-reduce.

`runner.train_to_end(trainer)` is what a compute node runs (ml.compute.executor builds the group
and the trainer first); `train_over_group(spec, rank, world, group)` does both for a group the
caller made (tests, simulations); `run_local_job(spec, world)` starts `world` local worker
processes (`python -m ml.job.worker`) on 127.0.0.1 and collects their progress and results
(`dekube-node task run` drives the same processes over the node's p2p stack: ml.compute.local_job).
A worker that dies mid-job leaves it and the others finish; `participation` holds the record of who
took part in which round, from which the job reports departures and a verifier replays them.
"""
from ml.job.local import JobFailed, run_local_job
from ml.job.runner import train_over_group

__all__ = ["JobFailed", "run_local_job", "train_over_group"]
