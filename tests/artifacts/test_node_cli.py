"""``node.artifacts`` on every Node, and the CLI end to end: ``artifact add`` into the homes of two
running ``dekube-node start`` processes (one while it runs), ``artifact ls``, then ``artifact get``
from both at once through a client node."""
import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from node.artifacts import artifact_id_of_bytes
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node
from tests.node.node_harness import local_config

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_every_node_has_an_artifact_service(tmp_path):
    async def main():
        bare = Node(local_config(), Identity.generate(), [basic_role("relay")])
        kept = Node(local_config(), Identity.generate(), [basic_role("relay")], home=tmp_path / "home")
        assert kept.artifacts.root == tmp_path / "home" / "data" / "artifacts"
        temp_root = bare.artifacts.root
        assert temp_root.is_dir()
        tasks = [asyncio.create_task(n.run()) for n in (bare, kept)]
        await asyncio.gather(bare.ready.wait(), kept.ready.wait())
        ident = await kept.artifacts.add_bytes(b"hello artifacts")
        bare.host.peerbook.add_addrs(kept.peer_id, kept.host.listen_addrs)
        path = await bare.artifacts.fetch(ident, [kept.peer_id])
        assert path.read_bytes() == b"hello artifacts" and bare.artifacts.has(ident)
        assert (await bare.status.snapshot())["artifacts"]["root"] == str(temp_root)
        for n in (bare, kept):
            n.request_stop()
        await asyncio.gather(*tasks)
        assert not temp_root.exists()              # a node without a data dir leaves nothing behind
        assert kept.artifacts.path(ident).exists()  # one with a data dir keeps its store
    asyncio.run(asyncio.wait_for(main(), 30))


def cli(*argv):
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)


def start(home):
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--home", str(home), "--role", "relay",
                             "--rpc-port", "0", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"],
                            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            record = json.loads(lines.get(timeout=0.5))
        except (queue.Empty, ValueError):
            assert proc.poll() is None, "node exited"
            continue
        if record.get("msg") == "p2p listening":
            return proc, record["addrs"].split()[0]
    proc.kill()
    raise AssertionError("node did not start")


def test_cli_add_ls_get_from_two_running_nodes(tmp_path):
    data = os.urandom(5 * (1 << 20) + 99)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    homes = [tmp_path / "h1", tmp_path / "h2"]
    for home in homes:
        assert cli("init", "--home", str(home), "--role", "relay", "--insecure-unencrypted-key").returncode == 0
    added = cli("artifact", "add", str(src), "--home", str(homes[0]))
    assert added.returncode == 0, added.stderr
    ident = added.stdout.strip()
    assert ident == artifact_id_of_bytes(data)
    procs = []
    try:
        addrs = []
        for home in homes:
            proc, addr = start(home)
            procs.append(proc)
            addrs.append(addr)
        # added while the second node runs: it serves it without a restart
        assert cli("artifact", "add", str(src), "--home", str(homes[1])).stdout.strip() == ident
        listed = json.loads(cli("artifact", "ls", "--json", "--home", str(homes[1])).stdout)
        assert listed == [{"id": ident, "size": len(data), "complete": True, "chunks": 6, "have": 6}]
        out = tmp_path / "out" / "fetched.bin"
        got = cli("artifact", "get", ident, "--out", str(out), "--from", addrs[0], "--from", addrs[1],
                  "--home", str(tmp_path / "client"))
        assert got.returncode == 0, got.stderr
        assert out.read_bytes() == data and ident in got.stderr
        missing = cli("artifact", "get", "ab" * 32, "--out", str(tmp_path / "x"), "--from", addrs[0], "--quiet",
                      "--home", str(tmp_path / "client"))
        assert missing.returncode == 1 and "no holder could serve" in missing.stderr
        bad = cli("artifact", "get", "nope", "--out", str(tmp_path / "x"), "--from", addrs[0])
        assert bad.returncode == 1 and "not an artifact id" in bad.stderr
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)



def test_holder_process_killed_mid_transfer_then_resume_from_another(tmp_path):
    """A client node (cli/client_node.py) fetches from a ``dekube-node start`` process that is
    SIGKILLed mid-transfer: the fetch fails clearly; a new client node on the same data dir resumes
    from a second holder and fetches only what was missing."""
    import pytest

    from cli.client_node import client_node
    from node.artifacts import ArtifactError
    from node.p2p.multiaddr import Multiaddr

    size = 64 << 20
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(size))
    homes = [tmp_path / "h1", tmp_path / "h2"]
    for home in homes:
        assert cli("init", "--home", str(home), "--role", "relay", "--insecure-unencrypted-key").returncode == 0
        ident = cli("artifact", "add", str(src), "--home", str(home)).stdout.strip()
    procs, addrs = [], []
    try:
        for home in homes:
            proc, addr = start(home)
            procs.append(proc)
            addrs.append(addr)
        first, second = (Multiaddr.parse(a) for a in addrs)

        async def fetch_from(holder, kill=None):
            async with client_node(Identity.generate(), data_dir=tmp_path / "client",
                                   listen="/ip4/127.0.0.1/tcp/0") as node:
                node.host.peerbook.add_addrs(holder.peer_id, [holder])

                def progress(done, total):
                    if kill is not None and done >= 8 << 20 and kill.poll() is None:
                        kill.kill()

                return await node.artifacts.fetch_report(ident, [holder.peer_id], progress=progress)

        with pytest.raises(ArtifactError, match="chunks missing"):
            asyncio.run(asyncio.wait_for(fetch_from(first, kill=procs[0]), 60))
        report = asyncio.run(asyncio.wait_for(fetch_from(second), 60))
        assert report.path.read_bytes() == src.read_bytes()
        assert 8 << 20 <= report.resumed_bytes < size
        assert report.received_bytes == size - report.resumed_bytes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(20)
