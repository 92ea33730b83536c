"""Bombs for the untrusted-file tests: torch.export archives and .npz files tampered with zipfile, and
the two paths that load them: the owner's dry run and a compute node's job (fake ledger and artifacts),
the latter with a heartbeat on its event loop."""
from __future__ import annotations

import asyncio
import io
import json
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from consensus.task_info import TaskInfo
from ml.compute import training as training_module
from ml.train.dry_run import Untrainable, dry_run
from ml.train.spec import TrainSpec
from tests.ml.byo import DigitsCNN, artifact_id, export


def small_archive(path: Path) -> Path:
    torch.manual_seed(1)
    return export(DigitsCNN(), torch.rand(4, 64), path)


def rewrite(src: Path, dst: Path, edit, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A copy of the archive `src` with `edit(name, data) -> data | None` applied to each member
    (None keeps it), each written deflated (by default) so a padded member stays small on disk."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            new = edit(info.filename.split("/", 1)[1], data)
            zout.writestr(info.filename, data if new is None else new, compression)
    return dst


def with_expression(src: Path, dst: Path, expr: str) -> Path:
    def edit(name, data):
        if name != "models/model.json":
            return None
        graph = json.loads(data)
        sizes = graph["graph_module"]["graph"]["tensor_values"]["x"]["sizes"]
        sizes[0]["as_expr"]["expr_str"] = expr
        return json.dumps(graph).encode()
    return rewrite(src, dst, edit)


def spec_for(model: Path | None, data: Path) -> TrainSpec:
    return TrainSpec(model="pt2" if model else "digits-mlp", dataset="file",
                     model_artifact=artifact_id(model) if model else "", dataset_artifact=artifact_id(data),
                     optimizer="sgd", lr=0.1, steps=4, batch_size=8, segment_steps=2, report_every=2)


def files_for(model: Path | None, data: Path) -> dict[str, Path]:
    return {artifact_id(p): p for p in (model, data) if p is not None}


def owner_dry_run(model: Path | None, data: Path, within_s: float) -> str:
    """The reason the owner's dry run gives (it must refuse, within `within_s`)."""
    started = time.monotonic()
    try:
        dry_run(spec_for(model, data), files_for(model, data))
    except Untrainable as exc:
        assert time.monotonic() - started < within_s
        return exc.reason
    raise AssertionError("the dry run accepted the file")


def worker_job(tmp_path: Path, model: Path | None, data: Path, within_s: float) -> str:
    """The reason a compute node's job rejects the task with; its event loop never stalls 0.5 s."""
    from tests.compute.test_worker_flow import make_role, task_doc

    (tmp_path / "node").mkdir(exist_ok=True)
    role = make_role(tmp_path / "node")
    spec = spec_for(model, data)
    for path in (model, data):
        if path is not None:
            shutil.copy(path, tmp_path / "node" / artifact_id(path))
    hyper = {"model_artifact": spec.model_artifact, "dataset_artifact": spec.dataset_artifact, "steps": 4,
             "batch_size": 8, "segment_steps": 2, "report_every": 2}
    task = task_doc(role, spec={"model": spec.model, "dataset": "file", "codec": "int8",
                                "sync_mode": "allreduce", "hyperparams": hyper})
    gaps: list[float] = []

    async def heartbeat(done: asyncio.Event) -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def run() -> None:
        done = asyncio.Event()
        beat = asyncio.ensure_future(heartbeat(done))
        try:
            await asyncio.wait_for(role.training.run_job(TaskInfo.from_json(task)), within_s)
        finally:
            done.set()
            await beat

    assert training_module.dry_run is dry_run
    asyncio.run(run())
    job = role.board.snapshot(task["task_id"])
    assert job["state"] == "rejected", job
    assert max(gaps) < 0.5, f"the event loop stalled {max(gaps):.1f} s"
    return job["reason"]


def npz_bomb(path: Path, megabytes: int) -> Path:
    """A compressed .npz whose x unpacks to `megabytes` MiB of zeros."""
    rows = (megabytes << 20) // (64 * 4)
    np.savez_compressed(path, x=np.zeros((rows, 64), np.float32), y=np.zeros(rows, np.int64))
    return path


def npz_lying_header(path: Path) -> Path:
    """A stored .npz whose x.npy header declares 10^9 x 64 floats and holds a few bytes."""
    from numpy.lib import format as npy
    header, y = io.BytesIO(), io.BytesIO()
    npy.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 64)})
    np.save(y, np.zeros(1, np.int64))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(256))
        archive.writestr("y.npy", y.getvalue())
    return path
