"""Serving through the ledger, end to end (ADR 0174): on a dev chain, `serve --ledger` processes
announce their ranges in their node records (the second one picks the gap, `--blocks auto:2`; a third
with `--rebalance-every` moves to blocks left uncovered), a `generate --ledger` finds them there, pays
with co-signed receipts from its serving escrow (funded with `wallet serve-deposit`), gets the tokens
of local inference, and the servers' claims are paid on chain."""
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from cli.main import main
from node.identity import Identity
from node.keystore import load_identity, save_identity
from node.ledger.gateway import LedgerGateway
from tests.cli.test_operator_path import free_ports, rpc, stop, wait_height

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:4x32:4@5"
PRICE = 50_000


def start_server(url: str, key: Path, blocks: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", MODEL, "--blocks", blocks,
                             "--ledger", url, "--key", str(key), "--price", str(PRICE), "--claim-every", "1", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(line)


async def announce_elsewhere(url: str, server: Identity, model: str) -> None:
    """Rewrite `server`'s record to announce another model, as if it had left this one."""
    gateway = LedgerGateway(server, [url])
    try:
        record = await gateway.node_info(server.peer_id)
        hardware = {**record["hardware"], "serving": [{**record["hardware"]["serving"][0], "model": model + "-old"}]}
        await gateway.send("register_node", {"roles": record["roles"], "listen_addrs": record["listen_addrs"],
                                             "relay_addrs": record["relay_addrs"], "hardware": hardware})
    finally:
        await gateway.close()


async def fund(url: str, dev: Identity, servers: list[Identity]) -> None:
    gateway = LedgerGateway(dev, [url])
    try:
        for server in servers:
            await gateway.send("transfer", {"to": server.peer_id, "amount": 10_000})
    finally:
        await gateway.close()
    for server in servers:
        gateway = LedgerGateway(server, [url])
        try:
            await gateway.send("bond", {"amount": 1_000})
        finally:
            await gateway.close()


def start_dev_chain(tmp_path):
    """A `start --dev` chain process; (process, RPC port, RPC URL, home)."""
    p2p, http = free_ports(2)
    home = tmp_path / "dev"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DEKUBE_")}
    chain = subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--dev", "--home", str(home),
                              "--listen", f"/ip4/127.0.0.1/tcp/{p2p}", "--rpc-port", str(http)],
                             cwd=ROOT, env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return chain, http, f"http://127.0.0.1:{http}/", home


def fund_servers_and_deposit(tmp_path, url, home, count=3):
    """`count` funded, bonded server identities and their key files; the dev account deposits into its
    serving escrow. (servers, keys, dev_key, wallet CLI args)."""
    dev_key = home / "dev_key.json"
    dev = load_identity(dev_key)
    servers = [Identity.generate() for _ in range(count)]
    keys = [save_identity(tmp_path / f"server{i}.json", s) for i, s in enumerate(servers)]
    asyncio.run(fund(url, dev, servers))
    wallet = ["--rpc", url, "--key", str(dev_key), "--json"]
    assert main(["wallet", "serve-deposit", "1000000", "--wait", *wallet]) == 0
    return servers, keys, dev_key, wallet


def test_servers_found_on_the_ledger_are_paid_for_generation(tmp_path, capsys):
    chain, http, url, home = start_dev_chain(tmp_path)
    procs = []
    try:
        wait_height(http, 2, chain)
        servers, keys, dev_key, wallet = fund_servers_and_deposit(tmp_path, url, home)
        dev = load_identity(dev_key)
        capsys.readouterr()
        assert main(["wallet", "serve-escrow", *wallet]) == 0
        assert json.loads(capsys.readouterr().out) == {"client": dev.peer_id, "balance": 1_000_000, "unlock_height": 0}

        first, first_info = start_server(url, keys[0], "0:2")
        procs.append(first)
        second, second_info = start_server(url, keys[1], "auto:2")   # fills the gap the ledger shows
        procs.append(second)
        assert first_info["announced"] and second_info["announced"] and second_info["blocks"] == "2:4"
        record = rpc(http, "dkb_getNode", servers[1].peer_id)
        assert record["hardware"]["serving"][0]["start"] == 2 and record["hardware"]["serving"][0]["price"] == PRICE
        # a third server on 2:4 checks the ledger's coverage every second (with equal throughputs it stays)...
        third, third_info = start_server(url, keys[2], "2:4", "--rebalance-every", "1")
        procs.append(third)
        # ...until the first server's range is announced away: then it moves to the uncovered blocks
        asyncio.run(announce_elsewhere(url, servers[0], first_info["model"]))
        deadline = time.monotonic() + 60
        while rpc(http, "dkb_getNode", servers[2].peer_id)["hardware"]["serving"][0]["start"] != 0:
            assert time.monotonic() < deadline, "the third server did not move to the uncovered blocks"
            time.sleep(0.5)
        assert json.loads(third.stdout.readline()) == {"moved": "0:2", "announced": True}
        first.kill()   # its record now claims other blocks: retire it
        first.wait(10)
        listed = rpc(http, "dkb_listNodes", None, first_info["model"])
        assert {n["peer_id"] for n in listed} == {servers[1].peer_id, servers[2].peer_id}

        code = main(["generate", "--model", MODEL, "--ledger", url, "--key", str(dev_key), "--max-price",
                     str(PRICE), "--prompt", "hello", "--max-tokens", "8", "--check-local"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["identical_to_local"] is True and out["servers"] == 2 and out["paid"] > 0

        deadline = time.monotonic() + 60
        while rpc(http, "dkb_getServeEscrow", dev.peer_id)["balance"] != 1_000_000 - out["paid"]:
            assert time.monotonic() < deadline, "the servers' receipts were not paid"
            time.sleep(0.5)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        stop(chain)
