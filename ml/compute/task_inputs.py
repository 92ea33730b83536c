"""A task's input artifacts on a compute node: who may hold them and fetching them into the node's store.

A task names its artifacts in its spec (`ml.train.inputs.artifact_ids`); the owner lists where
they can be fetched in the task's `sources` (multiaddrs ending in /p2p/PEER), and every co-worker
that fetched them serves them too. `source_peers` groups the sources by peer (bad ones are
skipped: an owner's typo must not stop the workers); `fetch_inputs` fetches what the store does
not hold yet, one artifact after another with one running progress count over all of them, and
feeds the download rate into the node's bandwidth meter.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from node.p2p.errors import ProtocolError
from node.p2p.multiaddr import Multiaddr

log = logging.getLogger(__name__)

MAX_SOURCES = 16
FETCH_ATTEMPTS = 3
RETRY_S = 2.0


def source_peers(sources: list) -> dict[str, list[str]]:
    """{peer id: [its multiaddrs]} of a task's `sources`; malformed entries are skipped."""
    peers: dict[str, list[str]] = {}
    for text in sources[:MAX_SOURCES] if isinstance(sources, list) else []:
        try:
            peer = Multiaddr.parse(text).peer_id if isinstance(text, str) else None
        except (ProtocolError, ValueError):
            continue
        if peer:
            peers.setdefault(peer, []).append(text)
    return peers


async def fetch_inputs(artifacts, ids: list[str], holders: list[str],
                       progress: Callable[[int, int], None] | None = None, meter=None, *,
                       attempts: int = FETCH_ATTEMPTS, retry_s: float = RETRY_S) -> dict[str, Path]:
    """{artifact id: local path} for `ids`, fetching from `holders` what `artifacts` (the node's
    ArtifactService) does not hold, `attempts` times (co-workers may still be fetching what we ask
    them for; a later attempt resumes). Raises the service's ArtifactError when an artifact cannot
    be fetched."""
    files: dict[str, Path] = {}
    done_before = 0
    for artifact in dict.fromkeys(ids):
        if artifacts.has(artifact):
            files[artifact] = artifacts.path(artifact)
            continue
        seen = {"total": 0}

        def report(done: int, total: int, base=done_before, seen=seen) -> None:
            seen["total"] = total
            if progress is not None:
                progress(base + done, base + total)

        started = time.monotonic()
        for attempt in range(attempts):
            try:
                files[artifact] = await artifacts.fetch(artifact, holders, progress=report)
                break
            except Exception as exc:  # the service's ArtifactError: resumed by the next attempt
                if attempt == attempts - 1:
                    raise
                log.info("fetch of %s failed (%s), retrying", artifact, exc)
                await asyncio.sleep(retry_s * (attempt + 1))
        size = files[artifact].stat().st_size
        if meter is not None:
            meter.record_transfer("down", size, time.monotonic() - started)
        done_before += seen["total"] or size
    return files
