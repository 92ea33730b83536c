"""Processes end to end: a 2-validator testnet (``devtools.testnet``) and ``dekube-node start --role
relay`` with ``[relay] ledger_rpc``: the relay registers itself with the relay role, admits peers
registered and bonded on the ledger (and refuses an unregistered one), relays a circuit between
two of them, and is paid on chain for the co-signed receipt."""
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from relay_harness import SINK_PROTOCOL, Sink, expected_answer, pattern, send_and_check, start_endpoint, stop_all
from test_relay_node_process import wait_for_status

from consensus.tx import build_tx
from devtools.testnet import Testnet
from node.identity import Identity
from node.ledger import LedgerGateway, jsonrpc
from relay.client import RelayRefused
from relay.messages import Status

REPO = Path(__file__).resolve().parents[2]
CHAIN = "relay-process-test"


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow  # ~40 s on the loaded 2-core machine: three node processes
def test_relay_process_admits_by_ledger_stake_and_is_paid(tmp_path):
    source, target, outsider = Identity.generate(), Identity.generate(), Identity.generate()
    net = Testnet.create(tmp_path / "net", 2, chain_id=CHAIN,
                         balances={source.peer_id: 10**6, target.peer_id: 10**6})
    rpc = net.nodes[0].rpc_url
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "DEKUBE_RELAY_LEDGER_RPC": net.nodes[1].rpc_url, "DEKUBE_RELAY_MIN_STAKE": "100",
           "DEKUBE_CONSENSUS_CHAIN_ID": CHAIN}
    home = tmp_path / "relay"
    proc = None
    try:
        net.up(wait_height=1, timeout=60)
        init = subprocess.run([sys.executable, "-m", "cli.main", "init", "--home", str(home), "--role", "relay",
                              "--insecure-unencrypted-key"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--home", str(home), "--role", "relay",
                                 "--rpc-port", "0", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        status = wait_for_status(proc)
        relay_addr, relay_id = status["listen_addrs"][0], status["peer_id"]
        faucet = net.faucet()  # the relay's own account pays its registration's and receipts' fees
        jsonrpc.call(rpc, "dkb_sendRawTransaction", build_tx(
            faucet, CHAIN, 0, "transfer", {"to": relay_id, "amount": 10**6}).raw.hex())

        def relay_registered():
            record = jsonrpc.call(rpc, "dkb_getNode", relay_id)
            return record is not None and "relay" in record["roles"]
        wait_until(relay_registered, 30, "the relay's registration")

        async def main():
            for ident in (source, target):  # registered and bonded: admitted by the relay's ledger lookup
                client = LedgerGateway(ident, [rpc])
                try:
                    await client.send("bond", {"amount": 500})
                    await client.send("register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                        "hardware": {"cpu_cores": 1, "ram_mb": 0, "gpu": "",
                                                                     "gpu_mem_mb": 0, "bandwidth_mbps": 0}})
                finally:
                    await client.close()
            a, b, stranger = (await start_endpoint(source, chain_id=CHAIN),
                              await start_endpoint(target, chain_id=CHAIN),
                              await start_endpoint(outsider, chain_id=CHAIN))
            try:
                await b.reserve(relay_addr)
                with pytest.raises(RelayRefused) as info:
                    await stranger.reserve(relay_addr)
                assert info.value.status == Status.PERMISSION_DENIED
                before = jsonrpc.call(rpc, "dkb_getBalance", source.peer_id)
                b.host.set_handler(SINK_PROTOCOL, Sink())
                conn = await a.dial(b.relayed_addrs)
                data = pattern(2 << 20)
                assert await send_and_check(conn, data) == expected_answer(data)
                await conn.close()  # the relay now asks both endpoints to co-sign the final receipt

                def paid():  # 2 MiB at 1 per MiB, paid by the source (the relay's gain is net of its fees)
                    return jsonrpc.call(rpc, "dkb_getBalance", source.peer_id) <= before - 2
                await asyncio.to_thread(wait_until, paid, 30, "the relay's payment")
            finally:
                await stop_all(a, b, stranger)

        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            finally:
                if proc.poll() is None:
                    proc.kill()
        net.down()
