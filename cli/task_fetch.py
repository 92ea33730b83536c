"""``task fetch``: a task's trained weights and metrics, from any worker holding them, checked against
the ledger.

The ledger's ``result`` for the task is the weights artifact id most paid committers agree on; the
workers that committed that id hold the file. Their registered addresses (direct and relayed, so
NAT'd workers are reached through their relays) go in the client node's peerbook, the artifact
service downloads from them all at once (each chunk verified against the id), and the complete
file is hashed once more before it is written as ``DIR/weights.safetensors``. ``DIR/metrics.json``
holds the workers' per-step reports (loss, evaluation metric) as one of them serves them.

A task cut into epochs (docs/adr/0203) keeps each closed epoch's state: every worker committed its
state's digest, and serves the state (a trainer state file, ml/train/state_file.py). ``--epoch N``
fetches epoch N's state from the workers that committed it (the digest most of them agree on
first; a worker tells where it serves that state over the progress protocol, `epoch_states`), checks
the file's sha256 against the digest, parses it with the bounded state-file reader and writes its
model weights as ``DIR/weights.safetensors``. A task that stopped at an epoch boundary (its owner's
``task stop`` or its crew, docs/adr/0211) has its last closed epoch's state as its result: plain
``task fetch`` does the same for that epoch.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from pathlib import Path

from cli.errors import CliError
from cli.task_follow import learn_addresses
from cli.task_ledger import FINAL, call
from cli.task_report import decode_task
from consensus.state.retention import unknown_task_message
from consensus.task_info import TaskInfo
from ml.compute.epoch_states import StateUnavailable, fetch_checked, holders_of

log = logging.getLogger(__name__)

METRICS_TIMEOUT_S = 15.0
WEIGHTS_FILE = "weights.safetensors"
METRICS_FILE = "metrics.json"


def result_holders(task: TaskInfo, result: str) -> list[str]:
    """Workers whose commitment names ``result``; else every committer, else every worker."""
    holders = [worker for worker, commit in task.commits.items() if commit.result == result]
    return holders or list(task.commits) or list(task.workers)


# registry model -> (its class in ml.registry, the dataset that sizes it by default); a test keeps this in
# step with ml.registry.MODELS
REGISTRY_CLASSES = {"digits-mlp": ("DigitsMLP", "digits"), "char-transformer": ("CharTransformer", "shakespeare")}


def load_hint(task: TaskInfo, out: Path, model_path: Path | None = None) -> str:
    """The one line that loads the fetched weights into the owner's model: for a .pt2 task after
    loading the archive that was submitted (``model_path`` when known); for a registry model after
    building its class (ml.registry.build_model, sized by the task's dataset)."""
    weights = out / WEIGHTS_FILE
    line = f'model.load_state_dict(safetensors.torch.load_file("{weights}"))'
    spec = task.spec
    if spec.get("model") == "pt2":
        return f'model = torch.export.load("{model_path or "YOUR_MODEL.pt2"}").module(); {line}'
    if spec.get("model") in REGISTRY_CLASSES:
        cls, default_dataset = REGISTRY_CLASSES[spec["model"]]
        dataset = spec.get("dataset") if spec.get("dataset") in ("digits", "shakespeare") else default_dataset
        return (f'from ml.registry import build_model, get_dataset; model = build_model("{spec["model"]}", '
                f'get_dataset("{dataset}"), 0)  # an ml.registry.{cls}; then {line}')
    return line


async def worker_metrics(node, peers: list[str], task_id: str) -> dict:
    """The last progress report (with its per-step history) that one of ``peers`` serves for the task
    ({} when none does, or this installation has no progress protocol)."""
    try:
        from ml.compute.progress_protocol import follow_progress
    except ImportError:
        return {}

    for peer in peers:
        reports: list[dict] = []
        try:
            async with asyncio.timeout(METRICS_TIMEOUT_S):
                async for report in follow_progress(node.host, peer, bytes.fromhex(task_id)):
                    if isinstance(report, dict):
                        reports.append(report)
        except TimeoutError:
            pass
        except Exception as exc:   # that worker is gone: ask the next
            log.info("metrics from %s: %s: %s", peer, type(exc).__name__, exc)
        if reports:
            last = reports[-1]
            history = next((r["history"] for r in reversed(reports) if r.get("history")), None)
            if history is None:
                history = [{k: r.get(k) for k in ("step", "loss", "metrics", "bytes_sent")} for r in reports]
            return {"worker": peer, "state": last.get("state"), "step": last.get("step"),
                    "steps": last.get("steps"), "loss": last.get("loss"), "metrics": last.get("metrics") or {},
                    "bytes_sent": last.get("bytes_sent"), "history": history}
    return {}


async def fetch_result(pool, node, task_id: str, out: Path, *, say=print, model_path: Path | None = None,
                       epoch: int | None = None) -> dict:
    """Downloads and checks the task's weights into ``out`` (``epoch``: from epoch N's committed state,
    1-based); returns what was written."""
    from node.artifacts import ArtifactError, artifact_id_of_file

    doc = await call(pool, "dkb_getTask", task_id)
    if doc is None:
        raise CliError(unknown_task_message(task_id))
    task = decode_task(doc)
    result = task.result
    stopped = task.epochs.stopped if task.epochs is not None else None
    closed = task.epochs.current if task.epochs is not None else 0
    if epoch is None and stopped is not None and closed:   # its result is the last closed epoch's state
        epoch = closed
    if epoch is not None:
        written = await fetch_epoch_weights(pool, node, task, epoch, out, say)
        return await _finish(node, task, out, written["result"], written["holders"], model_path, epoch)
    if not result and stopped is not None:
        raise CliError(f"task {task_id} stopped in epoch {stopped + 1} before any epoch closed (docs/adr/0203): "
                       "it has no trained weights on the ledger")
    if not result and task.status in FINAL:
        raise CliError(f"task {task_id} ended {task.status} without a result: no worker whose weights were "
                       "paid for (an audit mismatch, a rejection, or no commitment)")
    if not result:
        raise CliError(f"task {task_id} has no result on the ledger yet (status {task.status}"
                       + (f": {task.reason}" if task.reason else "") + ")")
    holders = await learn_addresses(pool, node, result_holders(task, result))
    if not holders:
        raise CliError(f"no worker holding {result} has registered addresses")
    say(f"fetching weights {result[:16]}.. from {len(holders)} worker(s)")
    try:
        path = await node.artifacts.fetch(result, holders)
    except ArtifactError as exc:
        raise CliError(f"cannot fetch the weights of task {task_id}: {exc}") from None
    actual = await asyncio.to_thread(artifact_id_of_file, path)
    if actual != result:
        raise CliError(f"the weights fetched hash to {actual}, not to the ledger's result {result}")
    out.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(shutil.copyfile, path, out / WEIGHTS_FILE)
    return await _finish(node, task, out, result, holders, model_path)


async def _finish(node, task: TaskInfo, out: Path, result: str, holders: list[str], model_path: Path | None,
                  epoch: int | None = None) -> dict:
    """metrics.json beside the weights written; what ``task fetch`` reports."""
    weights = out / WEIGHTS_FILE
    metrics = await worker_metrics(node, holders, task.task_id)
    written = {"task_id": task.task_id, "result": result, "status": task.status, "spec": dict(task.spec),
               "workers": list(task.workers), **({"final": metrics} if metrics else {}),
               "history": metrics.get("history", []), **({"epoch": epoch} if epoch is not None else {})}
    with contextlib.suppress(KeyError):
        written["final"].pop("history")
    (out / METRICS_FILE).write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return {"weights": str(weights), "metrics": str(out / METRICS_FILE), "result": result,
            "final_metrics": metrics.get("metrics", {}), "load": load_hint(task, out, model_path),
            **({"epoch": epoch} if epoch is not None else {})}


def epoch_states(task: TaskInfo, epoch: int) -> list[tuple[str, list[str]]]:
    """Epoch ``epoch``'s (1-based) committed state digests, each with the workers that committed it, the
    most committed first; CliError for an epoch that has not closed."""
    progress = task.epochs
    if progress is None:
        raise CliError(f"task {task.task_id} is not cut into epochs: fetch its result without --epoch")
    if not 1 <= epoch <= progress.current:
        closed = progress.current
        raise CliError(f"epoch {epoch} of task {task.task_id} has not closed ({closed} closed so far)"
                       if epoch > closed else "epochs count from 1")
    return holders_of(task, epoch - 1)


def weights_from_state(path: Path) -> bytes:
    """The model weights (safetensors, names sorted) inside a trainer state file (blocking; the bounded
    reader of ml/train/state_file.py: nothing is unpickled). CliError when it holds no model."""
    from safetensors.torch import save

    from ml.train.state_file import BadStateFile, load_state

    try:
        state = load_state(path.read_bytes())
    except BadStateFile as exc:
        raise CliError(f"the epoch's state file is malformed: {exc}") from None
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, dict) or not model:
        raise CliError("the epoch's state file holds no model weights")
    return save({name: tensor.contiguous() for name, tensor in sorted(model.items())})


async def fetch_epoch_weights(pool, node, task: TaskInfo, epoch: int, out: Path, say) -> dict:
    """Epoch ``epoch``'s state from a worker that committed it (its sha256 checked against the committed
    digest); its model weights written to ``out``. {"result": the state digest, "holders": the workers}."""

    errors = []
    for digest, workers in epoch_states(task, epoch):
        holders = await learn_addresses(pool, node, workers)
        if not holders:
            errors.append(f"{digest[:16]}..: no holder with registered addresses")
            continue
        say(f"fetching the state of epoch {epoch} ({digest[:16]}..) from {len(holders)} worker(s)")
        try:
            path = await fetch_checked(node, holders, task.task_id, digest)
        except StateUnavailable as exc:
            errors.append(str(exc))
            continue
        weights = await asyncio.to_thread(weights_from_state, path)
        out.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread((out / WEIGHTS_FILE).write_bytes, weights)
        return {"result": digest, "holders": holders}
    raise CliError(f"cannot fetch the state of epoch {epoch} of task {task.task_id}: " + ("; ".join(errors) or
                                                                                      "no worker committed it"))
