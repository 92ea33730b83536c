"""The dry run reports an untrainable spec (pickle, unsupported op, shapes, dtypes, NaN loss, missing or
too-small data) with a reason before anything is paid, and passes a trainable one."""
import pickle

import numpy as np
import pytest
import torch

from ml.train.dry_run import Untrainable, dry_run
from ml.train.file_dataset import load_file_dataset
from ml.train.spec import TrainSpec
from tests.ml.byo import DigitsCNN, artifact_id, digits_arrays, digits_cnn_archive, digits_npz, export, files_of


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


def _spec(model, data, **kwargs):
    return TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model),
                     dataset_artifact=artifact_id(data), **kwargs)


def test_a_trainable_spec_reports_loss_params_and_time(tmp_path):
    model, data = digits_cnn_archive(tmp_path / "m.pt2"), digits_npz(tmp_path / "d.npz")
    result = dry_run(_spec(model, data), files_of(model, data), world=3)
    assert 1.5 < result["loss"] < 3.5
    assert result["params"] == sum(p.numel() for p in DigitsCNN().parameters())
    assert result["step_seconds"] > 0
    assert result["metrics"]["accuracy"] < 40           # the untrained model's held-out accuracy


def test_registry_spec_dry_runs_without_files():
    assert dry_run(TrainSpec())["params"] > 0


def test_a_pickle_is_untrainable(tmp_path):
    data = digits_npz(tmp_path / "d.npz")
    model = tmp_path / "m.pt2"
    model.write_bytes(pickle.dumps(DigitsCNN()))
    with pytest.raises(Untrainable, match="pickle"):
        dry_run(_spec(model, data), files_of(model, data))


def test_an_unsupported_op_is_untrainable(tmp_path):
    from tests.ml.test_byo_model import WithCustomOp
    model, data = export(WithCustomOp(), torch.rand(4, 64), tmp_path / "m.pt2"), digits_npz(tmp_path / "d.npz")
    with pytest.raises(Untrainable, match=r"dekube_test.scale in module block.1 \(Scaler\)"):
        dry_run(_spec(model, data), files_of(model, data))


def test_random_ops_are_trainable_and_seeded(tmp_path):
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(x) + torch.randn_like(x[:, :10])

    model, data = export(Noisy(), torch.rand(4, 64), tmp_path / "m.pt2"), digits_npz(tmp_path / "d.npz")
    runs = [dry_run(_spec(model, data), files_of(model, data)) for _ in range(2)]
    assert runs[0]["loss"] == runs[1]["loss"] and runs[0]["metrics"] == runs[1]["metrics"]


def test_a_shape_error_is_untrainable(tmp_path):
    model = export(torch.nn.Linear(32, 10), torch.rand(4, 32), tmp_path / "m.pt2")
    data = digits_npz(tmp_path / "d.npz")
    with pytest.raises(Untrainable, match=r"cannot run on the dataset's batches \(inputs torch.float32 \(32, 64\)\)"):
        dry_run(_spec(model, data, batch_size=32), files_of(model, data))


def test_outputs_that_do_not_fit_the_loss_are_untrainable(tmp_path):
    model = export(torch.nn.Linear(64, 10), torch.rand(4, 64), tmp_path / "m.pt2")
    data = digits_npz(tmp_path / "d.npz")
    with pytest.raises(Untrainable, match="next_token_cross_entropy expects"):
        dry_run(_spec(model, data, loss="next_token_cross_entropy"), files_of(model, data))


def test_a_wrong_dtype_is_untrainable(tmp_path):
    x, y = digits_arrays()
    np.savez(tmp_path / "d.npz", x=(x * 16).astype(np.int64), y=y)
    model = digits_cnn_archive(tmp_path / "m.pt2")
    with pytest.raises(Untrainable, match="torch.int64"):
        dry_run(_spec(model, tmp_path / "d.npz"), files_of(model, tmp_path / "d.npz"))
    np.savez(tmp_path / "f.npz", x=x, y=y.astype(np.float32))          # float labels: a regression set
    with pytest.raises(Untrainable, match="mse expects"):
        dry_run(_spec(model, tmp_path / "f.npz"), files_of(model, tmp_path / "f.npz"))


def test_a_nan_loss_is_untrainable(tmp_path):
    x, y = digits_arrays()
    x[:, 3] = np.nan
    np.savez(tmp_path / "d.npz", x=x, y=y)
    model = digits_cnn_archive(tmp_path / "m.pt2")
    with pytest.raises(Untrainable, match="loss is nan"):
        dry_run(_spec(model, tmp_path / "d.npz"), files_of(model, tmp_path / "d.npz"))


def test_missing_files_and_too_little_data_are_untrainable(tmp_path):
    model, data = digits_cnn_archive(tmp_path / "m.pt2"), digits_npz(tmp_path / "d.npz")
    with pytest.raises(Untrainable, match="not among the local files"):
        dry_run(_spec(model, data), files_of(model))
    x, y = digits_arrays()
    np.savez(tmp_path / "tiny.npz", x=x[:3], y=y[:3])
    with pytest.raises(Untrainable, match="too few"):
        dry_run(_spec(model, tmp_path / "tiny.npz"), files_of(model, tmp_path / "tiny.npz"), world=4)


def test_cuda_without_a_gpu_is_untrainable(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(Untrainable, match="CUDA"):
        dry_run(TrainSpec(device="cuda"))
