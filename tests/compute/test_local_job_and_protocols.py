"""`dekube-node task run`'s local job over the p2p stack (equal to the verifier's replay, bit for bit),
and the segment/ready request protocols over real Hosts, including junk answers."""
import asyncio
import json

import pytest

from cli.main import main as cli_main
from ml.compute import ready_protocol, segments_protocol
from ml.compute.local_job import run_local_nodes
from ml.compute.replay import replay_job
from ml.compute.segments_protocol import SegmentsError, decode_response, decode_response_length, encode_response
from ml.train.spec import TrainSpec
from node.identity import Identity
from node.p2p.host import Host

SPEC = TrainSpec(codec="int8", steps=10, segment_steps=5, batch_size=16)


@pytest.mark.slow  # ~35 s of process start-up on a loaded 2-core machine; the e2e covers the same path
def test_local_job_over_p2p_hosts_matches_the_replay_bit_for_bit():
    events = []
    results = asyncio.run(run_local_nodes(SPEC, 2, timeout=180, on_event=events.append))
    assert len({r["params_hash"] for r in results}) == 1
    assert all(r["steps"] == SPEC.steps and r["bytes_sent"] > 0 for r in results)
    assert any(e.get("event") == "progress" for e in events)
    replayed = asyncio.run(replay_job(SPEC, [r["peer_id"] for r in results], last_segment=1))
    for result in results:
        assert replayed[result["peer_id"]] == result["segment_hashes"]


@pytest.mark.slow  # the same job as above through the CLI
def test_task_run_cli_reports_one_json_summary(capsys):
    assert cli_main(["task", "run", "--workers", "2", "--steps", "4", "--codec", "fp16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["workers"] == 2 and len(summary["params_hashes"]) == 1 and len(summary["peer_ids"]) == 2


@pytest.mark.parametrize("body", [b"", b"\xff", b"[]", b'{"segments": "x", "params_hash": "y"}',
                                  b'{"segments": [1], "params_hash": "y"}', b'{"error": "nope"}',
                                  b'{"segments": [], "params_hash": "y", "short_rounds": [[1]]}',
                                  b'{"segments": [], "params_hash": "y", "short_rounds": [["1", []]]}',
                                  b'{"segments": [], "params_hash": "y", "short_rounds": {}}',
                                  pytest.param(b'{"segments": ' + b"[" * 100_000, id="deep")])  # was a RecursionError
def test_malformed_segment_answers_raise(body):
    with pytest.raises(SegmentsError):
        decode_response(body)


def test_oversized_segment_answers_raise():
    with pytest.raises(SegmentsError):
        decode_response_length((segments_protocol.MAX_RESPONSE + 1).to_bytes(4, "big"))
    with pytest.raises(SegmentsError):
        encode_response({"segments": ["ab" * 32] * 20_000, "params_hash": ""})


def test_segments_and_ready_over_hosts():
    task = bytes(range(32))

    async def scenario():
        server, client = Host(Identity.generate()), Host(Identity.generate())
        await server.start()
        await client.start()
        try:
            server.set_handler(segments_protocol.PROTOCOL, segments_protocol.make_handler(
                lambda tid: {"segments": ["aa" * 32], "params_hash": "bb" * 32} if tid == task else None))
            ready = set()
            server.set_handler(ready_protocol.PROTOCOL, ready_protocol.make_handler(ready.__contains__))
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            got = await segments_protocol.fetch_segments(client, server.peer_id, task)
            with pytest.raises(SegmentsError, match="no result"):
                await segments_protocol.fetch_segments(client, server.peer_id, bytes(32))
            assert not await ready_protocol.ask_ready(client, server.peer_id, task)
            with pytest.raises(ready_protocol.TaskNotReady):
                await ready_protocol.wait_until_ready(client, [server.peer_id], task, timeout=0.5)
            ready.add(task)
            await ready_protocol.wait_until_ready(client, [server.peer_id], task, timeout=5)
            return got
        finally:
            await client.stop()
            await server.stop()

    report = asyncio.run(scenario())
    assert (report.segments, report.params_hash, report.short_rounds) == (["aa" * 32], "bb" * 32, [])
