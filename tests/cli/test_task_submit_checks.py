"""``task submit`` refuses what cannot be trained before anything is sent: missing files, pickles,
files of an unknown kind, a failing dry run; and ``fetch``/``watch``/``cancel`` refuse a malformed
task id. Every refusal is one line on stderr with exit status 1, and the validator URL given is one
nothing listens on, so a command that got as far as the ledger would say "cannot reach" instead."""
import pickle
import socket
import zipfile

import pytest

from cli.main import main
from node.identity import Identity


def dead_rpc() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"   # closed again: connections are refused



def submit(capsys, key, *argv):
    code = main(["task", "submit", "--rpc", dead_rpc(), "--key", str(key), "--price", "100", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("dekube-node: error: "), err
    assert "Traceback" not in err
    return err


def test_missing_model_file(tmp_path, key, capsys):
    code, _, err = submit(capsys, key, "--model", str(tmp_path / "nope.pt2"), "--dataset", "digits")
    assert code == 1 and "no such file" in one_error(err) and "nope.pt2" in err


def test_missing_dataset_file_is_reported_before_the_model_is_hashed(tmp_path, key, capsys):
    code, _, err = submit(capsys, key, "--model", "mlp", "--dataset", str(tmp_path / "train.npz"))
    assert code == 1 and "--dataset" in one_error(err) and "no such file" in err


@pytest.mark.parametrize("name", ["model.pt", "model.pth", "model.pkl"])
def test_pickle_suffixes_are_refused(tmp_path, key, capsys, name):
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"w": [1, 2, 3]}))
    code, _, err = submit(capsys, key, "--model", str(path), "--dataset", "digits")
    assert code == 1 and "pickle" in one_error(err) and "torch.export" in err


def test_a_pickle_renamed_pt2_is_refused(tmp_path, key, capsys):
    path = tmp_path / "model.pt2"
    path.write_bytes(pickle.dumps(object.__new__(Identity), protocol=4))
    code, _, err = submit(capsys, key, "--model", str(path), "--dataset", "digits")
    assert code == 1 and "pickle" in one_error(err)


def test_a_torch_save_zip_renamed_pt2_is_refused(tmp_path, key, capsys):
    path = tmp_path / "model.pt2"
    with zipfile.ZipFile(path, "w") as archive:   # the layout torch.save writes
        archive.writestr("model/data.pkl", pickle.dumps({"w": 1}))
        archive.writestr("model/version", "3")
    code, _, err = submit(capsys, key, "--model", str(path), "--dataset", "digits")
    assert code == 1 and "torch.save pickle" in one_error(err)


def test_a_zip_that_is_no_export_archive_is_refused(tmp_path, key, capsys):
    path = tmp_path / "model.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    code, _, err = submit(capsys, key, "--model", str(path), "--dataset", "digits")
    assert code == 1 and "not a torch.export archive" in one_error(err)


def test_pickled_dataset_and_unknown_kinds_are_refused(tmp_path, key, capsys):
    pkl = tmp_path / "train.pkl"
    pkl.write_bytes(pickle.dumps([1, 2]))
    code, _, err = submit(capsys, key, "--dataset", str(pkl))
    assert code == 1 and "pickle" in one_error(err)
    csv = tmp_path / "train.csv"
    csv.write_text("1,2\n")
    code, _, err = submit(capsys, key, "--dataset", str(csv))
    assert code == 1 and ".safetensors, .npz or .txt" in one_error(err)
    fake = tmp_path / "train.npz"
    fake.write_text("not a zip")
    code, _, err = submit(capsys, key, "--dataset", str(fake))
    assert code == 1 and "not a .npz archive" in one_error(err)
    code, _, err = submit(capsys, key, "--eval", str(tmp_path / "test.npz"))
    assert code == 1 and "--eval" in one_error(err) and "no such file" in err


def test_bad_numbers_and_out_without_wait(tmp_path, key, capsys):
    code, _, err = submit(capsys, key, "--workers", "0")
    assert code == 1 and "--workers" in one_error(err)
    code = main(["task", "submit", "--rpc", dead_rpc(), "--key", str(key), "--price", "0"])
    assert code == 1 and "--price" in one_error(capsys.readouterr().err)
    code, _, err = submit(capsys, key, "--out", str(tmp_path / "out"))
    assert code == 1 and "--out needs --wait" in one_error(err)


@pytest.mark.parametrize("action", ["fetch", "watch", "cancel"])
def test_malformed_task_ids(tmp_path, key, capsys, action):
    extra = {"fetch": ["--out", str(tmp_path)], "watch": [], "cancel": ["--key", str(key)]}[action]
    code = main(["task", action, "xyz", "--rpc", dead_rpc(), *extra])
    assert code == 1 and "not a task id" in one_error(capsys.readouterr().err)


def test_unreachable_ledger_is_one_clear_line(key, capsys):
    code = main(["task", "cancel", "ab" * 32, "--rpc", dead_rpc(), "--key", str(key)])
    assert code == 1 and "cannot reach the node" in one_error(capsys.readouterr().err)


def test_untrainable_registry_spec_fails_the_dry_run_before_any_tx(key, capsys):
    pytest.importorskip("torch")
    # the example: an MLP over 8x8 digit images cannot read shakespeare's token ids
    code, _, err = submit(capsys, key, "--model", "mlp", "--dataset", "shakespeare", "--steps", "5")
    assert code == 1 and "dry run" in one_error(err) and "cannot reach" not in err


def flat_model_archive(path) -> None:
    """A torch.export archive of a model that expects (N, 64) inputs, not the (N, 1, 8, 8) images."""
    import torch

    batch = torch.export.Dim("batch", min=2, max=4096)
    program = torch.export.export(torch.nn.Linear(64, 10), (torch.zeros(4, 64),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))


def test_shape_mismatch_of_the_users_files_fails_the_dry_run_before_any_tx(tmp_path, key, capsys):
    np = pytest.importorskip("numpy")
    flat_model_archive(tmp_path / "model.pt2")
    np.savez(tmp_path / "train.npz", x=np.zeros((32, 1, 8, 8), np.float32), y=np.zeros(32, np.int64))
    code, _, err = submit(capsys, key, "--model", str(tmp_path / "model.pt2"), "--dataset",
                          str(tmp_path / "train.npz"), "--steps", "5")
    assert code == 1 and "dry run" in one_error(err) and "cannot reach" not in err


def test_client_key_that_cannot_be_read_is_one_line(tmp_path, capsys):
    code = main(["task", "fetch", "ab" * 32, "--rpc", dead_rpc(), "--out", str(tmp_path / "o"),
                 "--client-key", str(tmp_path / "missing.json")])
    err = one_error(capsys.readouterr().err)
    assert code == 1 and "missing.json" in err
