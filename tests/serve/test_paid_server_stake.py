"""A paid server the ledger would not pay does not start as if it would be (ADR 0174): `serve --price`
bonds what its key lacks of min_serve_stake from its free balance, or refuses at start with the
reason and what to send it (an unfunded key ran unannounced; an unbonded one had every receipt claim
refused, said only in its log), and prints each address with one /p2p/ part. A client is told
"paid" only for receipts to servers that can claim them."""
import asyncio
import json
import subprocess
import sys

import pytest

from consensus.genesis import Params
from ml.serve.claimable import claimable_servers, paid_report, stake_plan
from node.identity import Identity
from node.keystore import load_identity, save_identity
from node.ledger.gateway import LedgerGateway
from tests.cli.test_operator_path import rpc, stop, wait_height
from tests.serve.test_paid_serving_cli import MODEL, PRICE, ROOT, start_dev_chain

MIN = Params().min_serve_stake


def test_stake_plan_bonds_the_shortfall_or_refuses_with_what_to_send():
    assert stake_plan("P", free=1_000, bonded=MIN, min_stake=MIN, fee=1).bond == 0
    assert stake_plan("P", free=1_000, bonded=30, min_stake=MIN, fee=1).bond == MIN - 30
    refused = stake_plan("P", free=50, bonded=30, min_stake=MIN, fee=1)
    assert refused.bond == 0 and f"min_serve_stake = {MIN}" in refused.refusal
    assert f"send it {MIN - 30 + 2 - 50} more" in refused.refusal and "wallet send P" in refused.refusal
    assert stake_plan("P", free=0, bonded=MIN, min_stake=MIN, fee=1).refusal   # nothing to pay fees with


class FakeGateway:
    def __init__(self, nodes: dict, stakes: dict, params: dict | None):
        self.nodes, self.stakes, self.params = nodes, stakes, params

    async def call(self, method, *params):
        from node.ledger.errors import LedgerUnavailable

        if method == "dkb_getParams":
            if self.params is None:
                raise LedgerUnavailable("dkb_getParams: not a validator's JSON-RPC")
            return self.params
        assert method == "dkb_chainId"
        return "test"

    async def node_info(self, peer):
        return self.nodes.get(peer)

    async def bonded(self, peer):
        return self.stakes.get(peer, 0)


def test_client_is_told_paid_only_for_receipts_servers_can_claim():
    good, thin, gone = "12D3KooWgood", "12D3KooWthin", "12D3KooWgone"
    nodes = {good: {"roles": ["compute"]}, thin: {"roles": ["compute"]}}
    receipts = [{"server": good, "amount": 40}, {"server": good, "amount": 2}, {"server": thin, "amount": 7},
                {"server": gone, "amount": 5}]
    for params, needed in (({"min_serve_stake": 500}, 500), (None, MIN)):   # None: an older validator
        gateway = FakeGateway(nodes, {good: 500, thin: needed - 1}, params)
        why = asyncio.run(claimable_servers(gateway, {r["server"] for r in receipts}))
        assert why == {thin: f"{needed - 1} bonded < min_serve_stake {needed}", gone: "not a registered compute node"}
        report = paid_report(receipts, why)
        assert report["paid"] == 42
        assert report["unclaimable"] == {thin: {"amount": 7, "why": why[thin]}, gone: {"amount": 5, "why": why[gone]}}


def serve(url: str, key, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", MODEL, "--blocks", "0:4",
                             "--ledger", url, "--key", str(key), "--price", str(PRICE), "--claim-every", "1", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def transfer(url: str, sender, to: str, amount: int) -> None:
    gateway = LedgerGateway(sender, [url])
    try:
        await gateway.send("transfer", {"to": to, "amount": amount})
    finally:
        await gateway.close()


def test_served_addresses_have_one_p2p_part():
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--model", MODEL, "--blocks", "0:4"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert info["addrs"] and all(addr.count("/p2p/") == 1 and addr.endswith(f"/p2p/{info['peer_id']}")
                                     for addr in info["addrs"]), info["addrs"]
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow   # a dev chain and two servers: ~40 s
def test_paid_server_refuses_unfunded_and_bonds_what_it_lacks(tmp_path):
    chain, http, url, home = start_dev_chain(tmp_path)
    procs = []
    try:
        wait_height(http, 2, chain)
        server = Identity.generate()
        key = save_identity(tmp_path / "server.json", server)
        refused = serve(url, key)
        procs.append(refused)
        out, err = refused.communicate(timeout=120)
        assert refused.returncode == 1 and out == "", out
        assert f"min_serve_stake = {MIN}" in err and f"wallet send {server.peer_id}" in err

        asyncio.run(transfer(url, load_identity(home / "dev_key.json"), server.peer_id, 1_000))   # free, unbonded
        proc = serve(url, key)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert info["announced"] is True and rpc(http, "dkb_getStake", server.peer_id)["bonded"] == MIN
        assert info["addrs"] and all(addr.count("/p2p/") == 1 and addr.endswith(f"/p2p/{server.peer_id}")
                                     for addr in info["addrs"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        stop(chain)
