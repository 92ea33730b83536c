"""The artifact store's total quota and eviction (issue 22: artifacts were never evicted and had no
total quota, only a per-artifact size cap): adding past the quota deletes, oldest first, artifacts no
open task of this node needs; pinned ones (open tasks' sources and results, this node's own results
within their retention, downloads in progress) are never deleted, and when they fill the quota a new
artifact is refused with the reason."""
import os

import pytest

from node.artifacts import ArtifactLimits, ArtifactStore
from node.artifacts.merkle import CHUNK_SIZE
from node.artifacts.quota import QuotaFull, StoreQuota, task_pins
from node.config import load_config

ME, OTHER = "12D3KooW" + "m" * 44, "12D3KooW" + "o" * 44
MiB = CHUNK_SIZE


def blob(tag: int) -> bytes:
    return bytes([tag]) * MiB


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def source(tmp_path):
    return ArtifactStore(tmp_path / "source", 64 * MiB)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    quota = StoreQuota(tmp_path / "node", 3 * MiB, retention_s=100.0, clock=clock)
    return ArtifactStore(tmp_path / "node", 16 * MiB, quota)


def download(store: ArtifactStore, source: ArtifactStore, data: bytes, age: float) -> str:
    """Fetch `data` into `store` as a download (not this node's own) and date it `age` seconds back."""
    artifact = source.add_bytes(data)
    partial = store.open_partial(source.manifest(artifact))
    for index in range(partial.manifest.chunks):
        partial.write_chunk(index, source.read_chunk(artifact, index))
    path = partial.complete()
    os.utime(path, (path.stat().st_atime, 1_000_000.0 - age))
    return artifact


def test_task_pins_are_the_open_tasks_of_this_node():
    a, b, c, d, e = (f"{i:064x}" for i in range(1, 6))
    tasks = [
        {"status": "running", "owner": OTHER, "workers": [ME], "spec": {"model_artifact": a, "dataset_artifact": b},
         "commits": {OTHER: ["00" * 32, c, 4, 9]}},
        {"status": "paid", "owner": ME, "workers": [OTHER], "spec": {"dataset_artifact": d}, "commits": {}},
        {"status": "committed", "owner": OTHER, "workers": [OTHER], "spec": {"eval_artifact": e},
         "slots": [{"verifiers": [{"verifier": ME}], "referees": []}]},
        {"status": "running", "owner": OTHER, "workers": [OTHER], "spec": {"model_artifact": d}},
        {"status": "created", "owner": ME, "workers": [], "spec": {"dataset_artifact": "not an id"}},
    ]
    assert task_pins(tasks, ME) == {a, b, c, e}


def test_past_the_quota_the_oldest_unpinned_go_first(store, source):
    old, pinned, new = (download(store, source, blob(i), age) for i, age in ((1, 30), (2, 40), (3, 20)))
    store.quota.set_task_pins([pinned])
    latest = download(store, source, blob(4), 10)   # 4 MiB > 3: one must go, the oldest unpinned
    assert not store.has(old) and store.has(pinned) and store.has(new) and store.has(latest)
    assert old not in {a["id"] for a in store.list()} and store.quota.evicted == 1
    assert sum(size for size, _, _ in store.held().values()) == 3 * MiB


def test_pinned_artifacts_are_never_deleted_and_the_new_one_is_refused(store, source):
    ids = [download(store, source, blob(i), 10 * i) for i in (1, 2, 3)]
    store.quota.set_task_pins(ids)
    extra = source.add_bytes(blob(9))
    with pytest.raises(QuotaFull, match="quota_mb"):
        store.open_partial(source.manifest(extra))
    with pytest.raises(QuotaFull):
        store.add_bytes(blob(8))
    assert all(store.has(a) for a in ids) and not store.has(extra)


def test_own_results_are_kept_for_their_retention(store, source, clock):
    mine = store.add_bytes(blob(1))                  # made here: pinned for retention_s (100 s)
    os.utime(store.object_path(mine), (0, 1_000_000.0 - 500))   # the oldest file
    other = download(store, source, blob(2), 50)
    third = download(store, source, blob(3), 40)
    download(store, source, blob(4), 5)
    assert store.has(mine) and not store.has(other) and store.has(third)
    clock.now += 101                                 # retention over: now it may go
    download(store, source, blob(5), 1)
    assert not store.has(mine) and store.has(third)


def test_a_download_in_progress_is_not_evicted(store, source):
    first = source.add_bytes(blob(1) + blob(1))
    partial = store.open_partial(source.manifest(first))   # 2 MiB reserved, nothing written yet
    second = download(store, source, blob(2), 30)
    third = download(store, source, blob(3), 20)      # evicts the finished one, not the older partial
    assert not store.has(second) and store.has(third)
    assert first in store.held() and store.held()[first][2] is True
    store.quota.set_task_pins([third])
    with pytest.raises(QuotaFull):
        download(store, source, blob(4), 10)          # only the partial's room is left to take: refused
    assert first in store.held() and store.has(third)
    store.release_partial(partial)


def test_the_node_config_sets_the_quota(tmp_path):
    config = load_config(None, env={}, overrides={("artifacts", "quota_mb"): "10", ("artifacts", "max_size_mb"): "4",
                                                  ("artifacts", "own_retention_s"): "60"})
    limits = ArtifactLimits.from_config(config["artifacts"])
    assert limits.quota == 10 * MiB and limits.own_retention_s == 60.0
    small = ArtifactLimits.from_config(load_config(None, env={}, overrides={
        ("artifacts", "quota_mb"): "1", ("artifacts", "max_size_mb"): "4"})["artifacts"])
    assert small.quota == 4 * MiB                     # never below the largest artifact
