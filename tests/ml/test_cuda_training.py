"""Training on a CUDA device: deterministic settings, hashes computed as on CPU, reproducible runs, and
the hardware probe. CI has no GPU: the CUDA tests skip there; run this file on a GPU machine (it also
runs as a script: `python -m tests.ml.test_cuda_training`)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ml.hardware import detect
from ml.train.dry_run import dry_run
from ml.train.file_dataset import load_file_dataset
from ml.train.simulation import train_simulated
from ml.train.spec import TrainSpec
from tests.ml.byo import DigitsCNN, artifact_id, export, files_of

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def _clusters(path: Path) -> Path:
    """Ten separable classes of 8x8 'images' (no scikit-learn needed)."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.rand(10, 64, generator=gen)
    y = torch.arange(1200) % 10
    x = centres[y] + 0.3 * torch.randn(1200, 64, generator=gen)
    np.savez(path, x=x.numpy().astype(np.float32), y=y.numpy())
    return path


def _spec_and_files(d: Path, model_cls=DigitsCNN, device: str = "cuda"):
    torch.manual_seed(3)
    model = export(model_cls(), torch.rand(4, 64), d / f"{model_cls.__name__}.pt2")
    data = _clusters(d / "clusters.npz")
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model), dataset_artifact=artifact_id(data),
                     optimizer="sgd", lr=0.05, steps=60, batch_size=32, segment_steps=20, report_every=20,
                     device=device)
    return spec, files_of(model, data)


def test_detect_reports_zeros_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    found = detect()
    assert found == {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0,
                     "profiles": found["profiles"]}
    assert not any(p.startswith("cuda-") for p in found["profiles"])


@needs_cuda
def test_detect_measures_the_gpu():
    found = detect()
    assert found["gpu"] and found["gpu_mem_mb"] > 1000 and found["gpu_tflops"] > 0.5 and found["cuda_devices"] >= 1
    cuda = [p for p in found["profiles"] if p.startswith("cuda-")]
    assert len(cuda) == 1 and f"-cuda{torch.version.cuda}/torch-" in cuda[0], found["profiles"]


@needs_cuda
def test_cuda_training_is_reproducible_and_learns(tmp_path):
    load_file_dataset.cache_clear()
    spec, files = _spec_and_files(tmp_path)
    first = train_simulated(spec, 3, files=files)
    second = train_simulated(spec, 3, files=files)
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8"
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert next(first.trainers[0].model.parameters()).device.type == "cuda"
    hashes = {tuple(t.segment_hashes) for t in first.trainers + second.trainers}
    assert len(hashes) == 1
    assert first.trainers[0].weights_bytes() == second.trainers[2].weights_bytes()
    assert first.metrics[0]["accuracy"] > 90


@needs_cuda
def test_registry_model_trains_on_cuda():
    spec = TrainSpec(optimizer="sgd", lr=0.2, steps=100, segment_steps=50, report_every=50, device="cuda")
    runs = [train_simulated(spec, 2) for _ in range(2)]
    assert runs[0].trainers[0].segment_hashes == runs[1].trainers[1].segment_hashes
    assert runs[0].metrics[0]["accuracy"] > 80


@needs_cuda
def test_cuda_dry_run_passes(tmp_path):
    load_file_dataset.cache_clear()
    spec, files = _spec_and_files(tmp_path)
    assert dry_run(spec, files)["loss"] > 0


if __name__ == "__main__":   # for a GPU machine without pytest's plugins
    print(detect())
    with tempfile.TemporaryDirectory() as tmp:
        for test in (test_detect_measures_the_gpu, test_registry_model_trains_on_cuda):
            test()
            print("passed", test.__name__)
        for test in (test_cuda_training_is_reproducible_and_learns,
                     test_cuda_dry_run_passes):
            test(Path(tempfile.mkdtemp(dir=tmp)))
            print("passed", test.__name__)
    sys.exit(0)
