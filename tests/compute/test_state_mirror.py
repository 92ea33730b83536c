"""Verifiers mirror each closed epoch's committed state (docs/adr/0236): the verifiers drawn for an epoch's
audit slots fetch its most committed state, check it and serve it over the progress protocol; a joiner (and
``task fetch --epoch``) asks them after the workers that committed it, so a crew that died and never comes
back no longer takes the task's last state with it. The mirror tests fail on the code before ADR 0236 (only
the committers were ever asked: the joiner below got nothing once the holder was gone)."""
import asyncio
import hashlib

import torch

from cli.client_node import client_node
from consensus.task_info import TaskInfo
from ml.compute import progress_protocol, state_mirror
from ml.compute.crew_changes import joining_state
from ml.compute.epoch_states import holders_of, mirrors_of
from ml.compute.job_board import TERMINAL, JobBoard, JobState
from ml.compute.state_mirror import StateMirror, mirror_only, owed
from ml.train.state_file import state_bytes
from node.identity import Identity

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
TASK_ID = "cd" * 32


def task_doc(holder: str, joiner: str, digest: str, verifier: str, status: str = "running",
             current: int = 1) -> TaskInfo:
    """A one-seat task of 3 epochs whose worker (``holder``) committed epoch 0 and died; ``joiner`` was named
    to the seat from epoch 1; ``verifier`` was drawn for epoch 0's audit slot."""
    slot = {"slot": 0, "worker": holder, "segment": 0, "salt": "00" * 32, "epoch": 0,
            "verifiers": [{"verifier": verifier, "deadline": 10}]}
    return TaskInfo.from_json({
        "task_id": TASK_ID, "status": status, "owner": "o", "price": 10, "segments": 3,
        "spec": {"workers": 1, "epochs": 3}, "workers": [holder, joiner], "slots": [slot],
        "epochs": {"current": current, "commits": {holder: [["00" * 32, digest, 1, 5]]}, "joined": {joiner: [0, 1]}}})


def test_the_verifiers_of_an_epoch_are_asked_for_its_state_after_its_committers():
    task = task_doc("H", "J", "11" * 32, "V")
    assert mirrors_of(task, 0) == ["V"] and mirrors_of(task, 1) == []
    assert holders_of(task, 0) == [("11" * 32, ["H", "V"])]
    assert owed(task, "V") == [(0, "11" * 32, ["H"])]
    assert owed(task, "H") == [] and owed(task, "X") == []   # a committer holds its own; others owe nothing
    assert owed(task_doc("H", "J", "11" * 32, "V", status="paid"), "V") == []
    assert owed(task_doc("H", "J", "11" * 32, "V", current=0), "V") == []   # the epoch has not closed


def test_a_joiner_gets_the_state_from_a_verifier_once_every_committer_is_gone():
    data = state_bytes({"model": {"w": torch.arange(6.0)}, "step": 30})
    digest = hashlib.sha256(data).hexdigest()

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as mirror, \
                client_node(Identity.generate(), listen=LOOPBACK) as joiner:
            async with client_node(Identity.generate(), listen=LOOPBACK) as holder:
                artifact = await holder.artifacts.add_bytes(data)
                held = JobBoard()
                held.start(TASK_ID, state="training", epoch_states={digest: artifact})
                holder.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(held))
                task = task_doc(holder.peer_id, joiner.peer_id, digest, mirror.peer_id)

                async def learn(peers):
                    for peer in peers:
                        if peer == holder.peer_id:
                            mirror.host.peerbook.add_addrs(peer, holder.host.listen_addrs)

                board, started = JobBoard(), []
                keeper = StateMirror(mirror, board, learn, lambda coro: started.append(asyncio.ensure_future(coro)))
                keeper.look(task)
                keeper.look(task)   # once per digest
                assert len(started) == 1
                await asyncio.wait_for(started[0], 30)
                assert board.jobs[TASK_ID]["state"] == JobState.MIRRORING
                kept = board.jobs[TASK_ID]["epoch_states"][digest]
                assert mirror.artifacts.quota.pinned(kept)   # never evicted for room while the copy may be the last
                mirror.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(board))
            # the holder is gone for good: the joiner asks it first, then the verifier

            async def read_task():
                return task

            async def learn_all(peers):
                for peer in peers:
                    if peer == mirror.peer_id:
                        joiner.host.peerbook.add_addrs(peer, mirror.host.listen_addrs)

            async def no_event(timeout):
                await asyncio.sleep(0)

            state, got, _ = await joining_state(joiner, TASK_ID, 1, read_task, learn_all, no_event, retry_s=0.05)
            ended = task_doc(holder.peer_id, joiner.peer_id, digest, mirror.peer_id, status="paid")
            keeper.look(ended)
            assert not mirror.artifacts.quota.pinned(kept) and mirror.artifacts.has(kept)   # ADR 0240
            return state, got, kept, artifact, board

    state, got, kept, artifact, board = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert got == digest and state["step"] == 30 and state["model"]["w"].equal(torch.arange(6.0))
    assert kept == artifact   # the same content-addressed file, checked against the committed digest
    assert board.jobs[TASK_ID]["state"] == JobState.MIRRORED in TERMINAL   # the task ended: so did the mirror


def test_a_mirror_keeps_nothing_that_does_not_hash_to_the_committed_digest(monkeypatch):
    async def junk(node, holders, task_id, digest, max_bytes=None):
        raise state_mirror.StateUnavailable("the file served does not hash to the committed digest")

    monkeypatch.setattr(state_mirror, "fetch_checked_artifact", junk)
    monkeypatch.setattr(state_mirror, "RETRY_S", 0.01)

    class Artifacts:
        def pin_mirrors(self, artifacts):
            self.pinned = set(artifacts)

        async def room_within(self, share, taken):
            return 1 << 20

    class Node:
        peer_id = "V"
        artifacts = Artifacts()

    async def scenario():
        board, started = JobBoard(), []
        keeper = StateMirror(Node(), board, lambda peers: asyncio.sleep(0),
                             lambda coro: started.append(asyncio.ensure_future(coro)))
        task = task_doc("H", "J", "11" * 32, "V")
        keeper.look(task)
        await started[0]
        keeper.look(task)   # asked again after RETRY_S
        await started[1]
        return board
    board = asyncio.run(scenario())
    assert TASK_ID not in board.jobs


def test_a_mirror_only_job_does_not_stop_the_node_joining_the_crew():
    board = JobBoard()
    board.start(TASK_ID, state=JobState.MIRRORING, workers=[], epoch_states={"11" * 32: "22" * 32})
    assert mirror_only(board.jobs[TASK_ID]) and not mirror_only(None)
    board.start("ef" * 32, state="training")
    assert not mirror_only(board.jobs["ef" * 32])
