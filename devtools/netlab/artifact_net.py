"""Artifact holders and a downloader in the netlab, for ``test_artifacts_over_nat.py`` and
``bench/artifacts.py``.

``seed_store(dir, size_mb)`` writes one artifact of deterministic bytes into an ArtifactStore
there; ``link_into(store_dir, data_dir, artifact)`` hard-links it into a holder's
``<data_dir>/artifacts`` (no copy, so three 1 GiB holders cost one file). ``start_agent`` runs an
``artifact_agent.py`` in a namespace (a public host's upload is capped with ``lab.shape``; the
homes' links are capped by the lab itself).
"""
from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path

from node.artifacts import CHUNK_SIZE, ArtifactStore

from .nodes import Node

ARTIFACT_AGENT = "devtools.netlab.artifact_agent"


def seed_store(store_dir: Path, size_mb: int, seed: int = 7) -> str:
    """An artifact of ``size_mb`` MiB of seeded random bytes added to the store in ``store_dir``."""
    store_dir.mkdir(parents=True, exist_ok=True)
    source = store_dir.parent / f"source-{seed}-{size_mb}.bin"
    rng = random.Random(seed)
    with open(source, "wb") as out:
        for _ in range(size_mb):
            out.write(rng.randbytes(CHUNK_SIZE))
    try:
        return ArtifactStore(store_dir, (size_mb + 1) * CHUNK_SIZE).add_file(source)
    finally:
        source.unlink()


def link_into(store_dir: Path, data_dir: Path, artifact: str) -> None:
    """Make ``artifact`` of the store in ``store_dir`` held by the node whose data dir is ``data_dir``."""
    target = ArtifactStore(data_dir / "artifacts", 1)   # creates the layout
    for sub in ("objects", "manifests"):
        dest = target.root / sub / artifact
        if not dest.exists():
            os.link(store_dir / sub / artifact, dest)


def start_agent(name: str, ns: str, listen: str, data_dir: Path, relays: Sequence[str] = (), *extra: str) -> Node:
    args = ["--data-dir", str(data_dir)]
    if relays:
        args += ["--relays", ",".join(relays)]
    return Node.start(name, ns, listen, *args, *extra, agent=ARTIFACT_AGENT)
