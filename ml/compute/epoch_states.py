"""Where a committed epoch state is served, and getting it checked: the owner's `task fetch --epoch N`
(cli/task_fetch.py, docs/adr/0211) and a worker joining a running crew (docs/adr/0226) both ask the workers
that committed a state digest where they serve that file (their job's ``epoch_states``, over the progress
protocol: only a pointer), fetch it from all of them at once (node/artifacts) and check its sha256 against
the committed digest before anything reads it. The verifiers of an epoch's audits keep a copy too and are
asked after the workers (ml/compute/state_mirror.py, docs/adr/0236)."""
from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from consensus.task_info import TaskInfo

log = logging.getLogger(__name__)

POINTER_TIMEOUT_S = 15.0   # per holder asked where it serves a state


class StateUnavailable(RuntimeError):
    """No holder served a file with the committed digest."""


def committed_states(task: TaskInfo, epoch: int) -> list[tuple[str, list[str]]]:
    """Epoch ``epoch``'s (0-based) committed state digests, each with the workers that committed it, the
    most committed first (a joiner's commitments start at its first epoch)."""
    progress = task.epochs
    if progress is None:
        return []
    holders: dict[str, list[str]] = {}
    for worker in sorted(progress.commits):
        commit = progress.commit_of(worker, epoch)
        if commit is not None:
            holders.setdefault(commit.state_digest, []).append(worker)
    return sorted(holders.items(), key=lambda item: (-len(item[1]), item[0]))


def mirrors_of(task: TaskInfo, epoch: int) -> list[str]:
    """The verifiers drawn for epoch ``epoch``'s audit slots: they keep a copy of its most committed state
    (ml/compute/state_mirror.py, docs/adr/0236)."""
    return sorted({seat.verifier for slot in task.slots if slot.epoch == epoch for seat in slot.verifiers})


def holders_of(task: TaskInfo, epoch: int) -> list[tuple[str, list[str]]]:
    """``committed_states``, the most committed digest's holders followed by the epoch's mirrors (asked
    after the workers that committed it)."""
    states = committed_states(task, epoch)
    if states:
        digest, committers = states[0]
        states[0] = (digest, [*committers, *(m for m in mirrors_of(task, epoch) if m not in committers)])
    return states


async def state_artifact(host, peers: list[str], task_id: str, digest: str) -> str | None:
    """The artifact id under which one of ``peers`` serves the state with sha256 ``digest``; None when none
    says."""
    from ml.compute.progress_protocol import follow_progress

    for peer in peers:
        try:
            async with asyncio.timeout(POINTER_TIMEOUT_S):
                async for report in follow_progress(host, peer, bytes.fromhex(task_id)):
                    states = report.get("epoch_states") if isinstance(report, dict) else None
                    artifact = states.get(digest) if isinstance(states, dict) else None
                    if isinstance(artifact, str):
                        return artifact
                    break   # the first report holds the job's snapshot
        except Exception as exc:   # that worker is gone or answers junk: ask the next
            log.info("epoch states from %s: %s: %s", peer, type(exc).__name__, exc)
    return None


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


async def fetch_checked(node, holders: list[str], task_id: str, digest: str, artifact: str | None = None) -> Path:
    """The state file with sha256 ``digest`` from ``holders`` (all at once; ``artifact``: its id when this
    node already knows it, e.g. it mirrors that state); StateUnavailable with the reason when none serves it
    or the file does not hash to the digest."""
    path, _ = await fetch_checked_artifact(node, holders, task_id, digest, artifact)
    return path


async def fetch_checked_artifact(node, holders: list[str], task_id: str, digest: str,
                                 artifact: str | None = None, max_bytes: int | None = None) -> tuple[Path, str]:
    """``fetch_checked``, and the artifact id the file is kept under in this node's store. ArtifactTooLarge
    (nothing downloaded) when the file has more than ``max_bytes``."""
    from node.artifacts import ArtifactError, ArtifactTooLarge

    artifact = artifact or await state_artifact(node.host, holders, task_id, digest)
    if artifact is None:
        raise StateUnavailable(f"{digest[:16]}..: no holder says where it serves that state")
    try:
        path: Path = await node.artifacts.fetch(artifact, holders, max_bytes=max_bytes)
    except ArtifactTooLarge:
        raise
    except (ArtifactError, ValueError) as exc:
        raise StateUnavailable(f"{digest[:16]}..: {exc}") from None
    if await asyncio.to_thread(sha256_of_file, path) != digest:
        raise StateUnavailable(f"{digest[:16]}..: the file served does not hash to the committed digest")
    return path, artifact
