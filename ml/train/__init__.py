"""Training on the group average: data-parallel and DiLoCo trainers (data_parallel, diloco), their
spec (spec: torch-free, so validators and the CLI can check specs without torch), progress reports
(progress), reproducibility (deterministic CPU settings, segment hashes, checkpoints: reproducibility)
and an in-process group (averaging, simulation). Import the submodules; this package imports nothing.
"""
