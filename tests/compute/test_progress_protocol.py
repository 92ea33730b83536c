"""`/dekube/task-progress/1.0.0`: framing, the job board's coalesced snapshots, and following a job
over real Hosts (including junk, unknown tasks and a job that fails)."""
import asyncio
import json
import struct

import pytest

from ml.compute import job_board, progress_protocol
from ml.compute.job_board import JobBoard, eta_seconds, utilization
from ml.compute.progress_history import record_point
from ml.compute.progress_protocol import (
    FrameDecoder,
    ProgressError,
    check_update,
    encode_frame,
    first_frame,
    follow_progress,
    parse_request,
)
from node.identity import Identity
from node.p2p.host import Host

TASK = bytes(range(32))
KEY = TASK.hex()


def test_frames_round_trip_in_any_pieces():
    docs = [{"state": "training", "step": i, "loss": 0.5 / (i + 1)} for i in range(5)]
    wire = b"".join(encode_frame(d) for d in docs)
    decoder, got = FrameDecoder(), []
    for i in range(0, len(wire), 7):
        got += decoder.feed(wire[i:i + 7])
    assert got == docs and decoder.pending == 0


@pytest.mark.parametrize("body", [b"\xff", b"[1]", b"nope", b'"text"'])
def test_malformed_frames_raise(body):
    with pytest.raises(ProgressError):
        FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def test_oversized_frames_raise_before_buffering():
    with pytest.raises(ProgressError, match="exceeds"):
        FrameDecoder().feed(struct.pack(">I", progress_protocol.MAX_FRAME + 1))
    with pytest.raises(ProgressError, match="exceeds"):
        encode_frame({"x": "a" * progress_protocol.MAX_FRAME})


def test_first_frame_drops_old_history_to_fit():
    history = [{"step": i, "loss": 1.0, "metrics": {"pad": "x" * 500}} for i in range(300)]
    frame = first_frame({"state": "training"}, history)
    doc = FrameDecoder().feed(frame)[0]
    assert 0 < len(doc["history"]) < 300 and doc["history"][-1]["step"] == 299


@pytest.mark.parametrize("doc", [{}, {"task_id": 5}, {"task_id": "ab"}, {"task_id": "zz" * 32}])
def test_bad_requests_raise(doc):
    with pytest.raises(ProgressError):
        parse_request(doc)


@pytest.mark.parametrize("doc", [{"error": "no job"}, {"step": 1}, {"state": "training", "step": "1"},
                                 {"state": "training", "metrics": []}, {"state": "x", "bytes_sent": True}])
def test_bad_updates_raise(doc):
    with pytest.raises(ProgressError):
        check_update(doc)


def test_eta_from_the_training_rate():
    job = {"state": "training", "training_since": 100.0, "step": 10, "steps": 40}
    assert eta_seconds(job, 120.0) == 60.0
    assert eta_seconds({**job, "step": 0}, 120.0) is None
    assert eta_seconds({**job, "state": "committed"}, 120.0) == 0.0


def test_utilization_is_compute_time_over_the_training_span():
    now = [100.0]
    board = JobBoard(clock=lambda: now[0])
    board.start("t", state="waiting for workers")
    board.update("t", compute_s=1.0)
    assert board.jobs["t"]["utilization"] is None            # not training yet: no span
    board.update("t", state="training")
    now[0] = 110.0
    board.update("t", step=10, compute_s=9.0)
    assert board.jobs["t"]["utilization"] == 0.9             # 9 s of compute in 10 s of training
    assert board.snapshot("t")["utilization"] == 0.9         # watchers over the progress protocol see it
    now[0] = 120.0
    board.end_training("t", 18.5)                            # the span closes with the last step...
    now[0] = 200.0
    board.update("t", state="committing")                    # ...not when the commit starts
    board.update("t", state="committed")
    assert board.jobs["t"]["utilization"] == 0.925
    assert utilization({"training_since": 5.0, "compute_s": 3.0}, 5.0) is None   # an empty span


def test_board_records_history_and_wakes_watchers(monkeypatch):
    monkeypatch.setattr(job_board, "MIN_INTERVAL_S", 0.0)

    async def scenario():
        board = JobBoard()
        board.start(KEY, steps=3)
        seen = []

        async def watcher():
            async for snapshot in board.watch(KEY):
                seen.append(snapshot)

        task = asyncio.create_task(watcher())
        await asyncio.sleep(0.01)
        board.update(KEY, state="training")
        await asyncio.sleep(0.01)
        for step in (1, 2, 3):
            record_point(board.jobs[KEY], step, 1.0 / step, {"acc": step / 3})
            board.update(KEY, step=step, loss=1.0 / step, metrics={"acc": step / 3})
            await asyncio.sleep(0.01)
        board.update(KEY, state="committed")
        await asyncio.wait_for(task, 5)
        return board, seen

    board, seen = asyncio.run(scenario())
    assert seen[0]["state"] == "starting" and seen[-1]["state"] == "committed"
    assert [s["step"] for s in seen if s["state"] == "training"][-1] == 3
    assert [h["step"] for h in board.history(KEY)] == [1, 2, 3]
    assert board.history(KEY)[2]["metrics"] == {"acc": 1.0}


def _hosts_with_board(board):
    server, client = Host(Identity.generate()), Host(Identity.generate())
    server.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(board))
    return server, client


def test_follow_a_job_over_hosts(monkeypatch):
    monkeypatch.setattr(job_board, "MIN_INTERVAL_S", 0.01)

    async def scenario():
        board = JobBoard()
        server, client = _hosts_with_board(board)
        await server.start()
        await client.start()
        try:
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            board.start(KEY, steps=4)
            board.update(KEY, state="training")
            record_point(board.jobs[KEY], 1, 2.0, {})
            board.update(KEY, step=1, loss=2.0)

            async def drive():
                for step in (2, 3, 4):
                    await asyncio.sleep(0.05)
                    board.update(KEY, step=step, loss=2.0 / step, bytes_sent=1000 * step)
                await asyncio.sleep(0.05)
                board.update(KEY, state="committed", result="ab" * 32)

            driver = asyncio.create_task(drive())
            got = [u async for u in follow_progress(client, server.peer_id, TASK)]
            await driver
            return got
        finally:
            await client.stop()
            await server.stop()

    got = asyncio.run(scenario())
    assert got[0]["history"] == [{"step": 1, "loss": 2.0}] and "history" not in got[-1]
    assert got[-1]["state"] == "committed" and got[-1]["step"] == 4 and got[-1]["bytes_sent"] == 4000
    assert got[-1]["result"] == "ab" * 32
    steps = [u["step"] for u in got]
    assert steps == sorted(steps)


def test_unknown_task_junk_and_failed_jobs_over_hosts(monkeypatch):
    monkeypatch.setattr(progress_protocol, "JOB_WAIT_S", 0.2)

    async def scenario():
        board = JobBoard()
        server, client = _hosts_with_board(board)
        await server.start()
        await client.start()
        try:
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            with pytest.raises(ProgressError, match="no job for task"):
                async for _ in follow_progress(client, server.peer_id, TASK):
                    pass
            assert board._changed == {}    # nothing kept for a task that never came
            # junk: a frame that is not a request, then raw garbage; the server answers, then still serves
            for junk in (encode_frame({"task": 1}), b"\x00\x00\x00\x03abc", b"\xff" * 8):
                stream = await client.open_stream(server.peer_id, progress_protocol.PROTOCOL)
                await stream.write(junk)
                answer = FrameDecoder().feed(await stream.read(4096))
                assert "bad request" in answer[0]["error"]
                await stream.close()
            board.start(KEY, steps=10)
            board.update(KEY, state="failed", error="RuntimeError: boom")
            return [u async for u in follow_progress(client, server.peer_id, TASK)]
        finally:
            await client.stop()
            await server.stop()

    got = asyncio.run(scenario())
    assert got[-1]["state"] == "failed" and got[-1]["error"] == "RuntimeError: boom"
    json.dumps(got)  # plain data


def test_a_watcher_that_asks_early_waits_for_the_job(monkeypatch):
    monkeypatch.setattr(job_board, "MIN_INTERVAL_S", 0.01)

    async def scenario():
        board = JobBoard()
        server, client = _hosts_with_board(board)
        await server.start()
        await client.start()
        try:
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)

            async def later():
                await asyncio.sleep(0.3)
                board.start(KEY, steps=1)
                await asyncio.sleep(0.05)
                board.update(KEY, state="rejected", reason="Untrainable: NaN loss")

            driver = asyncio.create_task(later())
            got = [u async for u in follow_progress(client, server.peer_id, TASK)]
            await driver
            return got
        finally:
            await client.stop()
            await server.stop()

    got = asyncio.run(scenario())
    assert got[0]["state"] == "starting" and got[-1] == {**got[-1], "state": "rejected",
                                                         "reason": "Untrainable: NaN loss"}
