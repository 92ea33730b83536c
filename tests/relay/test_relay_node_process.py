"""End to end: `dekube-node start --role relay` as a real process serves reservations to an
allow-listed peer (DEKUBE_RELAY_ALLOW_LIST) and refuses others; a circuit through it works."""
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from relay_harness import SINK_PROTOCOL, Sink, expected_answer, pattern, send_and_check, start_endpoint, stop_all

from node.identity import Identity
from relay.client import RelayRefused
from relay.messages import Status

REPO = Path(__file__).resolve().parents[2]


def wait_for_status(proc, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        record = json.loads(line)
        if record.get("msg") == "HTTP server listening":
            url = record["url"]
            break
        assert time.monotonic() < deadline, "node never started"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
    while True:
        try:
            with urllib.request.urlopen(url + "/status", timeout=2) as resp:
                return json.loads(resp.read())
        except OSError:
            assert time.monotonic() < deadline, "node never answered /status"
            time.sleep(0.1)


def test_relay_node_process_serves_reservations(tmp_path):
    source, target, outsider = Identity.generate(), Identity.generate(), Identity.generate()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "DEKUBE_RELAY_ALLOW_LIST": f"{source.peer_id},{target.peer_id}"}
    home = tmp_path / "relay"
    init = subprocess.run([sys.executable, "-m", "cli.main", "init", "--home", str(home), "--role", "relay",
                           "--insecure-unencrypted-key"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--home", str(home), "--role", "relay",
                             "--rpc-port", "0", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        status = wait_for_status(proc)
        relay_addr = status["listen_addrs"][0]

        async def main():
            a, b, stranger = (await start_endpoint(source), await start_endpoint(target),
                              await start_endpoint(outsider))
            try:
                await b.reserve(relay_addr)
                with pytest.raises(RelayRefused) as info:
                    await stranger.reserve(relay_addr)
                assert info.value.status == Status.PERMISSION_DENIED
                with pytest.raises(RelayRefused) as info:  # nor may it open circuits
                    await stranger.dial_via(relay_addr, b.host.peer_id)
                assert info.value.status == Status.PERMISSION_DENIED
                b.host.set_handler(SINK_PROTOCOL, Sink())
                data = pattern(4 << 20)
                assert await send_and_check(await a.dial(b.relayed_addrs), data) == expected_answer(data)
            finally:
                await stop_all(a, b, stranger)

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        proc.terminate()
        try:
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
