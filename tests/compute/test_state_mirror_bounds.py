"""What a verifier's epoch-state mirrors may take of its disk (docs/adr/0240): only the states owed now (the
latest MIRROR_EPOCHS closed epochs of each open task it audits) are pinned, and together they take at most
MIRROR_SHARE of the artifact quota; a state that would not fit is never downloaded. The attacker test fails
on the code before ADR 0240 (every mirrored state was pinned for the store's 7-day retention, so cheap tasks
could fill a verifier's store until its own audits were refused room)."""
import asyncio
import hashlib
import os

import pytest

from cli.client_node import client_node
from consensus.task_info import TaskInfo
from ml.compute import progress_protocol
from ml.compute.job_board import JobBoard
from ml.compute.state_mirror import MIRROR_EPOCHS, MIRROR_SHARE, StateMirror
from node.artifacts.quota import QuotaFull
from node.identity import Identity

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
QUOTA = 4 << 20


def task_doc(task_id: str, holder: str, verifier: str, digests: list[str], status: str = "running") -> TaskInfo:
    """A one-seat task whose worker (``holder``) committed ``digests`` for epochs 0.. in turn (each closed),
    with ``verifier`` drawn for every epoch's audit slot."""
    slots = [{"slot": e, "worker": holder, "segment": e, "salt": "00" * 32, "epoch": e,
              "verifiers": [{"verifier": verifier, "deadline": 10}]} for e in range(len(digests))]
    return TaskInfo.from_json({
        "task_id": task_id, "status": status, "owner": "o", "price": 10, "segments": len(digests) + 1,
        "spec": {"workers": 1, "epochs": len(digests) + 1}, "workers": [holder], "slots": slots,
        "epochs": {"current": len(digests), "commits": {holder: [["00" * 32, d, 1, 5] for d in digests]}}})


async def serve_states(holder, states: list[bytes], task_ids: list[str]) -> tuple[list[str], list[str]]:
    """``holder`` serves each of ``states`` under each of ``task_ids`` (the digests and artifact ids, in order)."""
    digests = [hashlib.sha256(data).hexdigest() for data in states]
    artifacts = [await holder.artifacts.add_bytes(data) for data in states]
    board = JobBoard()
    for task_id in task_ids:
        board.start(task_id, state="training", epoch_states=dict(zip(digests, artifacts)))
    holder.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(board))
    return digests, artifacts


def keeper_of(mirror, holder) -> tuple[StateMirror, list[asyncio.Task]]:
    async def learn(peers):
        mirror.host.peerbook.add_addrs(holder.peer_id, holder.host.listen_addrs)
    started: list[asyncio.Task] = []
    return StateMirror(mirror, JobBoard(), learn, lambda coro: started.append(asyncio.ensure_future(coro))), started


def test_cheap_tasks_cannot_fill_a_verifiers_store_with_mirrors():
    """An attacker opens many cheap tasks, crewed by its own worker, whose epoch states are large; the honest
    verifier is drawn for their audits. Its mirrors stop at MIRROR_SHARE of its quota, the states beyond are
    never downloaded, and the verifier still has room for the files of its own work."""
    state_size = 600 << 10
    states = [os.urandom(state_size) for _ in range(6)]   # 3.5 MiB of states against a 4 MiB store

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as mirror, \
                client_node(Identity.generate(), listen=LOOPBACK) as attacker:
            mirror.artifacts.quota.quota = QUOTA
            task_ids = [f"{i:02x}" * 32 for i in range(len(states))]
            digests, artifacts = await serve_states(attacker, states, task_ids)
            keeper, started = keeper_of(mirror, attacker)
            tasks = [task_doc(t, attacker.peer_id, mirror.peer_id, [d]) for t, d in zip(task_ids, digests)]
            keeper.look_all(tasks)
            await asyncio.wait_for(asyncio.gather(*started), 60)
            held = [a for a in artifacts if mirror.artifacts.has(a)]
            pinned = [a for a in artifacts if mirror.artifacts.quota.pinned(a)]
            honest = await mirror.artifacts.add_bytes(os.urandom(int(2.5 * (1 << 20))))   # its own work's file
            return held, pinned, keeper.status()["refused"], mirror.artifacts.has(honest)

    held, pinned, refused, honest_kept = asyncio.run(asyncio.wait_for(scenario(), 90))
    fit = int(QUOTA * MIRROR_SHARE) // state_size
    assert fit >= 1 and len(pinned) == fit and held == pinned   # the states refused were never downloaded
    assert refused == len(states) - fit
    assert honest_kept


def test_only_the_latest_closed_epochs_stay_pinned_and_an_ended_task_pins_nothing():
    states = [os.urandom(64 << 10) for _ in range(4)]

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as mirror, \
                client_node(Identity.generate(), listen=LOOPBACK) as holder:
            task_id = "ab" * 32
            digests, artifacts = await serve_states(holder, states, [task_id])
            keeper, started = keeper_of(mirror, holder)
            seen = []
            for closed in range(1, len(states) + 1):   # the task's epochs close one by one
                keeper.look_all([task_doc(task_id, holder.peer_id, mirror.peer_id, digests[:closed])])
                await asyncio.wait_for(asyncio.gather(*started), 60)
                seen.append([mirror.artifacts.quota.pinned(a) for a in artifacts])
            keeper.look_all([task_doc(task_id, holder.peer_id, mirror.peer_id, digests, status="paid")])
            seen.append([mirror.artifacts.quota.pinned(a) for a in artifacts])
            keeper.look_all([])   # a task that left the ledger's list: nothing of it stays pinned either
            on_disk = [mirror.artifacts.has(a) for a in artifacts]
            return seen, on_disk

    seen, on_disk = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert MIRROR_EPOCHS == 2
    assert seen[0] == [True, False, False, False]
    assert seen[1] == [True, True, False, False]
    assert seen[2] == [False, True, True, False]   # epoch 0 left the window: evictable
    assert seen[3] == [False, False, True, True]
    assert seen[4] == [False] * 4                  # the task ended
    assert on_disk == [True] * 4                   # kept while nothing needs the room (the owner may fetch)


def test_a_fetch_refuses_an_artifact_larger_than_it_allows_before_downloading_it():
    from node.artifacts import ArtifactTooLarge

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as fetcher, \
                client_node(Identity.generate(), listen=LOOPBACK) as holder:
            artifact = await holder.artifacts.add_bytes(os.urandom(300 << 10))
            fetcher.host.peerbook.add_addrs(holder.peer_id, holder.host.listen_addrs)
            with pytest.raises(ArtifactTooLarge, match="this fetch allows"):
                await fetcher.artifacts.fetch(artifact, [holder.peer_id], max_bytes=200 << 10)
            refused_has = fetcher.artifacts.has(artifact)
            path = await fetcher.artifacts.fetch(artifact, [holder.peer_id], max_bytes=300 << 10)
            return refused_has, path.stat().st_size

    refused_has, size = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert not refused_has and size == 300 << 10


def test_mirror_pins_are_kept_from_eviction_and_replaced_whole(tmp_path):
    from node.artifacts.quota import StoreQuota
    from node.artifacts.store import ArtifactStore
    quota = StoreQuota(tmp_path, 3 << 20)
    store = ArtifactStore(tmp_path, 4 << 20, quota)
    first = store.add_bytes(os.urandom(1 << 20))
    second = store.add_bytes(os.urandom(1 << 20))
    quota.forget(first)   # not this node's own result: only the mirror pin keeps it
    quota.forget(second)
    quota.set_mirror_pins([first, second])
    with pytest.raises(QuotaFull):
        quota.make_room(store, 2 << 20)
    quota.set_mirror_pins([second])
    assert quota.make_room(store, 2 << 20) == [first]
