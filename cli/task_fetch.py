"""``task fetch``: a task's trained weights and metrics, from any worker holding them, checked against
the ledger.

The ledger's ``result`` for the task is the weights artifact id most paid committers agree on; the
workers that committed that id hold the file. Their registered addresses (direct and relayed, so
NAT'd workers are reached through their relays) go in the client node's peerbook, the artifact
service downloads from them all at once (each chunk verified against the id), and the complete
file is hashed once more before it is written as ``DIR/weights.safetensors``. ``DIR/metrics.json``
holds the workers' per-step reports (loss, evaluation metric) as one of them serves them.
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
from consensus.task_info import TaskInfo

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


async def fetch_result(pool, node, task_id: str, out: Path, *, say=print, model_path: Path | None = None) -> dict:
    """Downloads and checks the task's weights into ``out``; returns what was written."""
    from node.artifacts import ArtifactError, artifact_id_of_file

    doc = await call(pool, "dkb_getTask", task_id)
    if doc is None:
        raise CliError(f"no task {task_id}")
    task = decode_task(doc)
    result = task.result
    stopped = task.epochs.stopped if task.epochs is not None else None
    if not result and stopped is not None:
        raise CliError(f"task {task_id} stopped in epoch {stopped + 1} (its crew stopped committing; docs/adr/0203): "
                       "it has no trained weights on the ledger, only its closed epochs' state digests")
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
    weights = out / WEIGHTS_FILE
    await asyncio.to_thread(shutil.copyfile, path, weights)
    metrics = await worker_metrics(node, holders, task_id)
    written = {"task_id": task_id, "result": result, "status": task.status, "spec": dict(task.spec),
               "workers": list(task.workers), **({"final": metrics} if metrics else {}),
               "history": metrics.get("history", [])}
    with contextlib.suppress(KeyError):
        written["final"].pop("history")
    (out / METRICS_FILE).write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return {"weights": str(weights), "metrics": str(out / METRICS_FILE), "result": result,
            "final_metrics": metrics.get("metrics", {}), "load": load_hint(task, out, model_path)}
