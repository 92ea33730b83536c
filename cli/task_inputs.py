"""What ``task submit`` trains: registry names or the user's own files, checked before anything runs.

``--model`` is a registry model (``mlp``, ``transformer`` or a full name) or a torch.export archive
(``.pt2``); ``--dataset``/``--eval`` a registry dataset (``digits``, ``shakespeare``) or a file
(``.safetensors``, ``.npz``, ``.txt``). A path that does not exist, a pickle (``torch.save`` output,
``.pt``/``.pth``/``.pkl``) or a file of an unknown kind is refused here with a one-line reason:
workers never load pickles, so neither does the submission. ``TaskInputs`` carries the files and
the spec fields naming them by artifact id (``model == "pt2"``, ``dataset == "file"``).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from cli.errors import CliError

MODEL_SUFFIXES = (".pt2",)
DATA_SUFFIXES = (".safetensors", ".npz", ".txt")
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt")
PICKLE_MAGIC = b"\x80"     # protocol 2+ pickles start with PROTO
ZIP_MAGIC = b"PK\x03\x04"


@dataclass
class TaskInputs:
    """Spec fields for the model and data, and the files they name (artifact id -> path)."""

    values: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def has_files(self) -> bool:
        return bool(self.files)


def looks_like_path(name: str) -> bool:
    return "/" in name or "\\" in name or Path(name).suffix != "" or Path(name).exists()


def existing_file(name: str, what: str) -> Path:
    path = Path(name).expanduser()
    if not path.exists():
        raise CliError(f"{what} {name}: no such file")
    if not path.is_file():
        raise CliError(f"{what} {name}: not a regular file")
    return path


def _refuse_pickle(path: Path, what: str) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CliError(f"{what} {path}: {path.suffix} files are Python pickles, which can run code on the workers "
                       "and are refused; export the model with torch.export.save (.pt2) and data as "
                       ".safetensors, .npz or .txt")
    with path.open("rb") as handle:
        head = handle.read(4)
    if head[:1] == PICKLE_MAGIC:
        raise CliError(f"{what} {path}: this file is a Python pickle, which is refused (workers never run code "
                       "they receive)")


def check_model_file(path: Path) -> None:
    """A torch.export archive: a zip with an ``archive_format`` entry, not a torch.save pickle."""
    _refuse_pickle(path, "--model")
    if path.suffix.lower() not in MODEL_SUFFIXES:
        raise CliError(f"--model {path}: expected a torch.export archive (.pt2, from torch.export.save) "
                       "or a registry model name (mlp, transformer)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise CliError(f"--model {path}: not a torch.export archive ({exc})") from None
    if any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        raise CliError(f"--model {path}: this is a torch.save pickle renamed .pt2; export the model with "
                       "torch.export.export and torch.export.save instead")
    if not any(name.endswith("archive_format") for name in names):
        raise CliError(f"--model {path}: a zip file but not a torch.export archive (no archive_format entry)")


def check_data_file(path: Path, what: str) -> None:
    _refuse_pickle(path, what)
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise CliError(f"{what} {path}: expected a .safetensors, .npz or .txt file, got {path.suffix or 'no suffix'}")
    if path.suffix.lower() == ".npz":
        with path.open("rb") as handle:
            if handle.read(4) != ZIP_MAGIC:
                raise CliError(f"{what} {path}: not a .npz archive (numpy.savez writes a zip file)")


def task_inputs(model: str, dataset: str, eval_path: str | None, artifact_id) -> TaskInputs:
    """Checks the model/dataset/eval arguments (every file before any is hashed), then names each file
    by ``artifact_id(path) -> str``."""
    from ml.compute.task_spec import model_name

    named: dict[str, Path] = {}   # spec field -> file
    values: dict = {}
    if model.lower().endswith(MODEL_SUFFIXES + PICKLE_SUFFIXES) or (looks_like_path(model)
                                                                     and Path(model).expanduser().exists()):
        named["model_artifact"] = existing_file(model, "--model")
        check_model_file(named["model_artifact"])
        values["model"] = "pt2"
    else:
        values["model"] = model_name(model)
    if looks_like_path(dataset):
        named["dataset_artifact"] = existing_file(dataset, "--dataset")
        check_data_file(named["dataset_artifact"], "--dataset")
        values["dataset"] = "file"
    else:
        values["dataset"] = dataset
    if eval_path is not None:
        named["eval_artifact"] = existing_file(eval_path, "--eval")
        check_data_file(named["eval_artifact"], "--eval")
    inputs = TaskInputs(values=values)
    for spec_field, path in named.items():
        ident = artifact_id(path)
        inputs.values[spec_field] = ident
        inputs.files[ident] = path.resolve()
    return inputs
