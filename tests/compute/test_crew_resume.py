"""Where a new crew gets the state of a crew that died (docs/adr/0232): a worker remembers where it serves
the epoch states it committed across a restart (``HeldStates``), shows them again from an ended job, and a
joiner keeps asking the committed holders for a bounded time instead of giving up at the first miss, so a
former member that comes back with its home serves the state. The joiner and restart tests fail on the
code before ADR 0232 (the joiner failed at once; a restarted worker could not say where its states were)."""
import asyncio
import hashlib
import json

import pytest
import torch

from cli.client_node import client_node
from consensus.task_info import TaskInfo
from ml.compute import crew_changes, progress_protocol
from ml.compute.crew_changes import JoinFailed, joining_state
from ml.compute.held_states import MAX_TASKS, HeldStates
from ml.compute.job_board import TERMINAL, JobBoard, JobState
from ml.train.state_file import state_bytes
from node.identity import Identity

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
TASK_ID = "ab" * 32


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def restarted_task(holder: str, joiner: str, digest: str, status: str = "running", later: str = "") -> TaskInfo:
    """A one-seat task of 3 epochs whose crew (``holder``) committed epoch 0 and died; ``joiner`` was named
    to the seat from epoch 1 by a restart (``later``: one more restart after it)."""
    joined = {joiner: [0, 1], **({later: [0, 1]} if later else {})}
    return TaskInfo.from_json({
        "task_id": TASK_ID, "status": status, "owner": "o", "price": 10, "segments": 3,
        "spec": {"workers": 1, "epochs": 3}, "workers": [holder, joiner, *([later] if later else [])],
        "epochs": {"current": 1, "commits": {holder: [["00" * 32, digest, 1, 5]]}, "joined": joined}})


def test_held_states_survive_a_restart_and_show_as_an_ended_job_serving_them(tmp_path):
    before = HeldStates(tmp_path)
    before.add(TASK_ID, "11" * 32, "22" * 32)
    before.add(TASK_ID, "33" * 32, "44" * 32)
    after = HeldStates(tmp_path)   # the node restarted with the same home
    after.load()
    assert after.tasks == {TASK_ID: {"11" * 32: "22" * 32, "33" * 32: "44" * 32}}
    job = after.restored_job(TASK_ID, committed=False)
    assert job is not None and job["state"] == JobState.FAILED and job["state"] in TERMINAL
    assert job["epoch_states"] == after.tasks[TASK_ID] and "restarted" in job["error"]
    assert after.restored_job(TASK_ID, committed=True)["state"] == JobState.COMMITTED
    assert after.restored_job("cd" * 32, committed=False) is None   # held nothing: trains as before
    board = JobBoard()
    board.start(TASK_ID, **job)
    assert board.snapshot(TASK_ID)["epoch_states"] == after.tasks[TASK_ID]   # what the progress protocol sends


def test_held_states_are_bounded_and_a_bad_file_is_ignored(tmp_path):
    held = HeldStates(tmp_path)
    for i in range(MAX_TASKS + 5):
        held.add(f"{i:064x}", "11" * 32, "22" * 32)
    assert len(held.tasks) == MAX_TASKS and f"{0:064x}" not in held.tasks   # the oldest went
    (tmp_path / "epoch_states.json").write_text(json.dumps({TASK_ID: {"nothex": "22" * 32}, "x": 3}))
    junk = HeldStates(tmp_path)
    junk.load()
    assert junk.tasks == {}
    (tmp_path / "epoch_states.json").write_text("{not json")
    junk.load()
    assert junk.tasks == {}


def test_a_joiner_of_a_dead_crew_gets_the_state_once_a_former_member_restarts(tmp_path, monkeypatch):
    data = state_bytes({"model": {"w": torch.arange(4.0)}, "step": 20})
    digest = hashlib.sha256(data).hexdigest()

    async def scenario():
        async with client_node(Identity.generate(), listen=LOOPBACK) as holder, \
                client_node(Identity.generate(), listen=LOOPBACK) as joiner:
            artifact = await holder.artifacts.add_bytes(data)   # kept on disk under its home
            HeldStates(tmp_path).add(TASK_ID, digest, artifact)   # before it died
            task = restarted_task(holder.peer_id, joiner.peer_id, digest)
            asked = []

            async def read_task():
                if len(asked) == 2:   # the holder comes back with its home: it serves its states again
                    held = HeldStates(tmp_path)
                    held.load()
                    board = JobBoard()
                    board.start(TASK_ID, **held.restored_job(TASK_ID, committed=False))
                    holder.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(board))
                asked.append(1)
                return task

            async def learn(peers):
                for peer in peers:
                    joiner.host.peerbook.add_addrs(peer, holder.host.listen_addrs)

            async def no_event(timeout):
                await asyncio.sleep(0)

            told = []
            got = await joining_state(joiner, TASK_ID, 1, read_task, learn, no_event, retry_s=0.05,
                                      on_retry=told.append)
            return got, len(asked), told

    (state, got, _), asks, told = run(scenario())
    assert got == digest and state["step"] == 20 and state["model"]["w"].equal(torch.arange(4.0))
    assert asks == 3   # two rounds found no holder serving it; the third got it
    assert len(told) == 2 and all("no holder says where it serves that state" in why for why in told)


def test_a_joiner_stops_asking_when_its_seat_went_to_another_crew_or_the_wait_ran_out(monkeypatch):
    calls = []

    class Nobody:
        peer_id = "J"

    async def unavailable(node, holders, task_id, digest, artifact=None):
        calls.append(holders)
        raise crew_changes.StateUnavailable("no holder says where it serves that state")

    monkeypatch.setattr(crew_changes, "fetch_checked", unavailable)

    async def nothing(*_):
        return None

    async def join(task, retry_s=0.0):
        async def read_task():
            return task
        return await joining_state(Nobody(), TASK_ID, 1, read_task, nothing, nothing, retry_s=retry_s)

    superseded = restarted_task("H", "J", "55" * 32, later="K")   # restarted again: K has J's seat
    with pytest.raises(JoinFailed, match="restarted on a new crew"):
        run(join(superseded))
    assert calls == []
    with pytest.raises(JoinFailed, match="there is no crew to join"):
        run(join(restarted_task("H", "J", "55" * 32, status="stopped")))
    monkeypatch.setattr(crew_changes, "HOLDER_WAIT_S", 0.2)
    with pytest.raises(JoinFailed, match="no checked state of epoch 1 .* no holder says where"):
        run(join(restarted_task("H", "J", "55" * 32), retry_s=0.05))
    assert len(calls) >= 2 and all(holders == ["H"] for holders in calls)   # asked again, then gave up
