"""Multi-process: a 4-validator testnet under wallet load survives kill -9 + restart and SIGSTOP/SIGCONT,
then every chain invariant holds over RPC; junk RPC and bad transactions get clear errors, no crash."""
import json
import signal
import threading
import time
import urllib.request

import pytest

from consensus.tx import build_tx
from devtools.chaincheck import check_chain
from devtools.loadgen import WalletLoad
from devtools.testnet import Testnet
from node.identity import Identity
from node.ledger import jsonrpc
from node.ledger.errors import RpcAnswerError

ACCOUNTS = [Identity.from_seed(i.to_bytes(32, "big")) for i in range(1, 61)]
SETTINGS = {"consensus.timeout_propose": "1.0", "consensus.timeout_vote": "0.5", "node.log_level": "info"}


@pytest.fixture(scope="module")
def testnet(tmp_path_factory):
    net = Testnet.create(tmp_path_factory.mktemp("testnet"), 4,
                         balances={a.peer_id: 10**9 for a in ACCOUNTS}, settings=SETTINGS)
    try:
        net.up(wait_height=2, timeout=60)
        yield net
    finally:
        for node in net.nodes:
            net.kill_node(node)


def rpc(node, method, *params):
    return jsonrpc.call(node.rpc_url, method, *params)


def rejection(node, raw_hex):
    with pytest.raises(RpcAnswerError) as info:
        rpc(node, "dkb_sendRawTransaction", raw_hex)
    return info.value


def test_faults_under_load_keep_every_invariant(testnet):
    nodes = testnet.nodes
    load = WalletLoad([n.rpc_url for n in nodes], testnet.chain_id, ACCOUNTS, [a.peer_id for a in ACCOUNTS],
                      rate=30.0)
    stop = threading.Event()
    loader = threading.Thread(target=load.run, args=(stop,), daemon=True)
    loader.start()
    try:
        time.sleep(3)
        testnet.kill_node(nodes[1])                 # kill -9 under load
        time.sleep(3)
        testnet.start_node(nodes[1])                # restart: recovers from its DB, catches up by sync
        time.sleep(3)
        assert testnet.signal_node(nodes[2], signal.SIGSTOP)
        time.sleep(4)                               # 3 of 4 alive: still a quorum
        assert testnet.signal_node(nodes[2], signal.SIGCONT)
        time.sleep(3)
    finally:
        stop.set()
        loader.join(10)
    assert load.drain(40), f"{len(load.in_flight)} transactions never got a receipt"
    top = max(testnet.height(n) or 0 for n in nodes)
    testnet.wait_height(top, timeout=40)            # the killed and the stopped node caught up
    assert all(testnet.is_running(n) for n in nodes)

    assert len(load.confirmed) >= 100, (len(load.confirmed), load.errors)
    assert not load.failed
    violations = check_chain([n.rpc_url for n in nodes], testnet.genesis(), load.confirmed)
    assert violations == []
    status = json.loads(urllib.request.urlopen(nodes[1].rpc_url + "/status", timeout=5).read())
    assert status["consensus"]["height"] >= top and status["consensus"]["in_committee"]


def test_bad_input_over_rpc_gets_clear_errors(testnet):
    node = testnet.nodes[0]
    sender, chain = ACCOUNTS[-1], testnet.chain_id
    nonce = rpc(node, "dkb_getTransactionCount", sender.peer_id, "pending")

    for body in (b"{not json", b"[]", b'{"jsonrpc":"2.0","id":1,"method":"dkb_getBalance","params":[7]}',
                 b"\xff\xfe" * 100, b"[" * 5000):
        request = urllib.request.Request(node.rpc_url + "/", data=body, headers={"Content-Type": "application/json"})
        doc = json.loads(urllib.request.urlopen(request, timeout=5).read())
        assert doc["error"]["code"] in (-32700, -32600, -32602)

    assert rejection(node, "zz").code == -32602                                   # not hex
    assert rejection(node, "ab" * 200_000).code == -32602                         # oversized hex
    junk = rejection(node, "c0ffee")
    assert junk.code == -32000 and junk.data["code"] == "BAD_ENCODING"
    assert rejection(node, "00" * 20_000).data["code"] == "OVERSIZED"             # > max_tx_bytes
    other_chain = build_tx(sender, "another-chain", nonce, "transfer", {"to": sender.peer_id, "amount": 1})
    assert rejection(node, other_chain.raw.hex()).data["code"] == "WRONG_CHAIN"
    assert rejection(node, build_tx(sender, chain, nonce + 100, "transfer",
                                    {"to": sender.peer_id, "amount": 1}).raw.hex()).code == -32002
    poor = build_tx(sender, chain, nonce, "transfer", {"to": sender.peer_id, "amount": 10**18})
    assert rejection(node, poor.raw.hex()).code == -32003
    good = build_tx(sender, chain, nonce, "transfer", {"to": ACCOUNTS[0].peer_id, "amount": 5}, 1)
    forged = bytearray(good.raw)
    forged[-1] ^= 1
    assert rejection(node, bytes(forged).hex()).code == -32004
    assert rpc(node, "dkb_sendRawTransaction", good.raw.hex()) == good.hash.hex()
    assert rejection(node, good.raw.hex()).code == -32005                         # already known (pending)
    deadline = time.monotonic() + 20
    while rpc(node, "dkb_getTransactionReceipt", good.hash.hex()) is None:
        assert time.monotonic() < deadline, "transfer never committed"
        time.sleep(0.1)
    receipt = rpc(testnet.nodes[3], "dkb_getTransactionReceipt", good.hash.hex()) or \
        rpc(node, "dkb_getTransactionReceipt", good.hash.hex())
    assert receipt["status"] == "ok"
    assert rejection(node, good.raw.hex()).code == -32005                         # already known (committed)
    stale = build_tx(sender, chain, nonce, "transfer", {"to": ACCOUNTS[1].peer_id, "amount": 1}, 1)
    assert rejection(node, stale.raw.hex()).code == -32001                        # nonce too low

    for method, params in (("dkb_getBalance", ["not-a-peer-id"]), ("dkb_getTask", ["00"]),
                           ("dkb_getTransactionReceipt", ["12"]), ("dkb_getBlockByNumber", ["soon"]),
                           ("dkb_listTasks", [None, None, 10**9])):
        with pytest.raises(RpcAnswerError) as info:
            rpc(node, method, *params)
        assert info.value.code == -32602
    assert rpc(node, "dkb_getBlockByNumber", 10**9) is None
    assert rpc(node, "dkb_getTask", "00" * 32) is None
    assert rpc(node, "dkb_listTasks") == []
    assert rpc(node, "dkb_getValidators")["total_power"] > 0
    assert rpc(node, "dkb_getNode", testnet.nodes[1].peer_id)["roles"] == ["validator"]
    height = rpc(node, "dkb_blockNumber")
    testnet.wait_height(height + 2, timeout=20)                                   # still producing blocks
