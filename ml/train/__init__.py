"""Training on the group average: data-parallel and DiLoCo trainers, their spec, progress reports,
reproducibility (deterministic CPU settings, segment hashes, checkpoints) and an in-process group.
"""
from ml.train.allreduce_averager import AllReduceAverager, averager_for_group, group_codec
from ml.train.averaging import Averaged, Averager, LocalAveragingGroup
from ml.train.data_parallel import DataParallelTrainer
from ml.train.diloco import DiLoCoTrainer
from ml.train.powersgd_averager import PowerSGDAverager
from ml.train.progress import ProgressFeed, TrainProgress
from ml.train.recipes import RECIPES, recipe
from ml.train.reproducibility import configure_determinism, hash_state, hash_tensors
from ml.train.simulation import SimulatedRun, make_trainer, train_simulated
from ml.train.spec import InvalidSpec, TrainSpec

__all__ = ["AllReduceAverager", "averager_for_group", "group_codec", "PowerSGDAverager", "RECIPES",
           "recipe", "Averaged", "Averager", "LocalAveragingGroup", "DataParallelTrainer", "DiLoCoTrainer",
           "ProgressFeed", "TrainProgress", "configure_determinism", "hash_state", "hash_tensors",
           "SimulatedRun", "make_trainer", "train_simulated", "InvalidSpec", "TrainSpec"]
