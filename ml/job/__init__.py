"""One worker's share of a training job over the network all-reduce.

`runner.train_to_end(trainer)` is what a compute node runs (ml.compute.executor builds the group
and the trainer first); `train_over_group(spec, rank, world, group)` does both for a group the
caller made (tests, simulations). `participation` holds the record of who took part in which round,
from which a job reports departures and a verifier replays them. Local jobs of worker processes
are `ml.compute.local_job`'s.
"""
from ml.job.runner import train_over_group, train_to_end

__all__ = ["train_over_group", "train_to_end"]
