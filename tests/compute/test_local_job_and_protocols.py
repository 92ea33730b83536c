"""`dekube-node task run`'s local job over the p2p stack (equal to the verifier's replay, bit for bit),
and the ready protocol over real Hosts (the segment records protocol: test_segment_commitments.py)."""
import asyncio
import json

import pytest

from cli.main import main as cli_main
from devtools.job_replay import replay_job
from ml.compute import ready_protocol
from ml.compute.local_job import run_local_job
from ml.train.spec import TrainSpec
from node.identity import Identity
from node.p2p.host import Host

SPEC = TrainSpec(codec="int8", steps=10, segment_steps=5, batch_size=16)


@pytest.mark.slow  # ~35 s of process start-up on a loaded 2-core machine; the e2e covers the same path
def test_local_job_over_p2p_hosts_matches_the_replay_bit_for_bit():
    events = []
    results = asyncio.run(run_local_job(SPEC, 2, timeout=180, on_event=events.append))
    assert len({r["params_hash"] for r in results}) == 1
    assert all(r["steps"] == SPEC.steps and r["bytes_sent"] > 0 for r in results)
    assert any(e.get("event") == "progress" for e in events)
    replayed = asyncio.run(replay_job(SPEC, [r["peer"] for r in results], last_segment=1))
    for result in results:
        assert replayed[result["peer"]] == result["segment_hashes"]


@pytest.mark.slow  # the same job as above through the CLI
def test_task_run_cli_reports_one_json_summary(capsys):
    assert cli_main(["task", "run", "--workers", "2", "--steps", "4", "--codec", "fp16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["workers"] == 2 and len(summary["params_hashes"]) == 1 and len(summary["peer_ids"]) == 2


def test_ready_over_hosts():
    task = bytes(range(32))

    async def scenario():
        server, client = Host(Identity.generate()), Host(Identity.generate())
        await server.start()
        await client.start()
        try:
            ready = set()
            server.set_handler(ready_protocol.PROTOCOL, ready_protocol.make_handler(ready.__contains__))
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            assert not await ready_protocol.ask_ready(client, server.peer_id, task)
            with pytest.raises(ready_protocol.TaskNotReady):
                await ready_protocol.wait_until_ready(client, [server.peer_id], task, timeout=0.5)
            ready.add(task)
            await ready_protocol.wait_until_ready(client, [server.peer_id], task, timeout=5)
        finally:
            await client.stop()
            await server.stop()

    asyncio.run(scenario())
