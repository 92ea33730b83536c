"""Running one training job among several processes over the network all-reduce.

`train_over_group(spec, rank, world, group)` is what a compute node calls with its own all-reduce
group; `run_local_job(spec, world)` starts `world` local worker processes (`python -m
ml.job.worker`) on 127.0.0.1 and collects their progress and results. A worker that dies mid-job
leaves it and the others finish; `participation` holds the record of who took part in which round,
from which the job reports departures and a verifier replays them.
"""
from ml.job.local import JobFailed, run_local_job
from ml.job.runner import train_over_group

__all__ = ["JobFailed", "run_local_job", "train_over_group"]
