"""The CLI's transactions go through the node's one sender (``cli.tx_sender`` over
``node.ledger.LedgerGateway``), against a `start --dev` chain process: `wallet send` without
``--wait`` returns once the mempool took it and with ``--wait`` reports its block; a transaction
the mempool refuses and one that fails in its block each end in one line that says why, with the
nonce book intact for the next one; and `wallet` and `task` commands agree on nonces."""
import asyncio
import json

import pytest

from cli.errors import CliError
from cli.main import main
from cli.tx_sender import send_tx
from node.identity import Identity
from node.keystore import load_identity
from tests.cli.test_operator_path import rpc, stop, wait_height
from tests.serve.test_paid_serving_cli import start_dev_chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    proc, http, url, home = start_dev_chain(tmp_path_factory.mktemp("txsender"))
    try:
        wait_height(http, 1, proc)
        yield http, url, home / "dev_key.json"
    finally:
        stop(proc)


def wallet(capsys, url: str, key, *args: str) -> dict:
    capsys.readouterr()
    assert main(["wallet", *args, "--rpc", url, "--key", str(key), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_send_without_and_with_wait(chain, capsys):
    http, url, key = chain
    dev = load_identity(key)
    to = Identity.generate().peer_id
    nonce = rpc(http, "dkb_getTransactionCount", dev.peer_id, "pending")
    first = wallet(capsys, url, key, "send", to, "5")
    assert first["nonce"] == nonce and first["type"] == "transfer" and "height" not in first
    second = wallet(capsys, url, key, "send", to, "7", "--wait")
    assert second["nonce"] == nonce + 1 and second["status"] == "ok" and second["height"] >= 1
    receipt = rpc(http, "dkb_getTransactionReceipt", first["tx_hash"])
    assert receipt is not None and receipt["status"] == "ok"   # the first one committed too
    assert rpc(http, "dkb_getBalance", to) == 12


def test_a_refused_and_a_failed_transaction_say_why(chain, capsys):
    http, url, key = chain
    poor = Identity.generate()
    with pytest.raises(CliError, match=r"transfer not accepted \([A-Z_]+\): .*balance is 0"):   # refused by the mempool
        asyncio.run(send_tx([url], poor, "transfer", {"to": poor.peer_id, "amount": 1}))
    dev = load_identity(key)
    # the dev account has no bond: unbonding executes with an error in its block
    with pytest.raises(CliError, match=r"unbond [0-9a-f]{64} refused by the ledger in block \d+: "):
        asyncio.run(send_tx([url], dev, "unbond", {"amount": 1}))
    after = wallet(capsys, url, key, "send", poor.peer_id, "3", "--wait")   # nonces go on
    assert after["status"] == "ok" and rpc(http, "dkb_getBalance", poor.peer_id) == 3


def test_an_unreachable_node_is_one_line(capsys):
    with pytest.raises(CliError, match="cannot reach the node"):
        asyncio.run(send_tx(["http://127.0.0.1:9/"], Identity.generate(), "transfer",
                            {"to": Identity.generate().peer_id, "amount": 1}))
    with pytest.raises(CliError, match="fee must not be negative"):
        asyncio.run(send_tx(["http://127.0.0.1:9/"], Identity.generate(), "unjail", {}, fee=-1))
