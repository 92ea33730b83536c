"""Training on the group average: data-parallel, DiLoCo and streaming DiLoCo trainers (data_parallel,
diloco, streaming_diloco with its schedule in streaming_schedule), their
spec (spec: torch-free, so validators and the CLI can check specs without torch), progress reports
(progress), reproducibility (deterministic CPU settings, segment hashes, checkpoints: reproducibility)
and an in-process group (averaging, simulation). Import the submodules; this package imports nothing.
"""
