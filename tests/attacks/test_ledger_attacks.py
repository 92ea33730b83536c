"""Attacks on the ledger through a one-validator testnet on loopback (issue 12, items 1 and 2), each
next to a well-behaved client: a transaction held behind a nonce gap (it used to make the proposer
skip its empty-block wait forever: ~178 blocks/s), free spam and permanent records from empty
accounts, an oversized register_node record, and out-of-range block heights. Plus the ledger's own
rule, checked on a block a malicious proposer could build: an empty account gets nothing committed."""
import json
import time
import urllib.error
import urllib.request

import pytest

from consensus.block import build_block
from consensus.encoding import encode
from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.state.ledger import Ledger
from consensus.tx import SIGN_DOMAIN, VERSION, build_tx
from consensus.txcodes import TxCode
from devtools.testnet import Testnet
from node.identity import Identity
from node.ledger import jsonrpc
from node.ledger.errors import RpcAnswerError

FUNDED = Identity.from_seed(b"\x71" * 32)
EMPTY_BLOCK_WAIT = 0.2
TASK = {"task_id": bytes(32)}
# the record the issue stored from an empty account: 4096 cores, 2**40 MB, relay_addrs not multiaddrs
BAD_RECORD = {"roles": ["validator", "verifier"], "listen_addrs": ["/ip4/1.2.3.4/tcp/1"],
              "relay_addrs": ["relay.attacker.example:4001"] * 1,
              "hardware": {"cpu_cores": 4096, "ram_mb": 2**40, "gpu": "x" * 64, "gpu_mem_mb": 2**40,
                           "bandwidth_mbps": 10**7}}
GOOD_RECORD = {"roles": ["compute"], "listen_addrs": ["/ip4/127.0.0.1/tcp/4001"], "relay_addrs": [],
               "hardware": {"cpu_cores": 8, "ram_mb": 32_000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100}}


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    testnet = Testnet.create(tmp_path_factory.mktemp("attacks") / "net", validators=1,
                             balances={FUNDED.peer_id: 10**6},
                             settings={"consensus.empty_block_wait": str(EMPTY_BLOCK_WAIT),
                                       "consensus.idle_block_wait": str(EMPTY_BLOCK_WAIT)})
    try:
        testnet.up(wait_height=2, timeout=60)
        yield testnet
    finally:
        testnet.down()


class Forged:
    """A signed transaction built without the client-side checks ``build_tx`` runs (an attacker's)."""

    def __init__(self, identity, chain_id, nonce, tx_type, payload, fee):
        body = [VERSION, chain_id, identity.peer_id, nonce, tx_type, payload, fee]
        self.raw = encode(body + [identity.sign(SIGN_DOMAIN + encode(body))])


def send(url, tx):
    return jsonrpc.call(url, "dkb_sendRawTransaction", tx.raw.hex())


def rejection(url, tx) -> RpcAnswerError:
    with pytest.raises(RpcAnswerError) as info:
        send(url, tx)
    return info.value


def wait_receipt(url, tx, timeout=15.0) -> dict:
    deadline = time.monotonic() + timeout
    while (receipt := jsonrpc.call(url, "dkb_getTransactionReceipt", tx.hash.hex())) is None:
        assert time.monotonic() < deadline, "transaction not committed in time"
        time.sleep(0.1)
    return receipt


def mempool_txs(url) -> int:
    with urllib.request.urlopen(url + "/status", timeout=5) as r:
        return json.loads(r.read())["consensus"]["mempool_txs"]


def block_rate(url, seconds) -> float:
    start = jsonrpc.call(url, "dkb_blockNumber")
    time.sleep(seconds)
    return (jsonrpc.call(url, "dkb_blockNumber") - start) / seconds


def faucet_transfer(net, to, amount=5):
    """The well-behaved client: a faucet transfer, committed with an OK receipt."""
    url, faucet = net.nodes[0].rpc_url, net.faucet()
    nonce = jsonrpc.call(url, "dkb_getTransactionCount", faucet.peer_id, "pending")
    tx = build_tx(faucet, net.chain_id, nonce, "transfer", {"to": to, "amount": amount})
    send(url, tx)
    assert wait_receipt(url, tx)["status"] == "ok"


def test_a_gapped_transaction_keeps_the_idle_block_pace_and_expires(net):
    url = net.nodes[0].rpc_url
    idle_max = 1 / EMPTY_BLOCK_WAIT                       # at most 5 blocks/s when idle
    gapped = build_tx(FUNDED, net.chain_id, 1, "cancel_task", TASK)   # nonce 1 while the account's next is 0
    send(url, gapped)
    assert mempool_txs(url) == 1
    rate = block_rate(url, 2.5)
    assert rate <= 1.5 * idle_max, f"{rate:.0f} blocks/s with a gapped tx in the mempool (idle: <= {idle_max:.0f})"
    faucet_transfer(net, Identity.generate().peer_id)      # served meanwhile
    deadline = time.monotonic() + 20                       # gap TTL: 20 blocks (~4-5 s at the idle pace)
    while mempool_txs(url):
        assert time.monotonic() < deadline, "the gapped transaction was never evicted"
        time.sleep(0.2)
    assert jsonrpc.call(url, "dkb_getTransactionReceipt", gapped.hash.hex()) is None
    assert jsonrpc.call(url, "dkb_getTransactionCount", FUNDED.peer_id) == 0


def test_empty_accounts_get_nothing_in_and_records_are_validated(net):
    url = net.nodes[0].rpc_url
    spammers = [Identity.generate() for _ in range(20)]
    for key in spammers:
        for nonce, fee in ((0, 0), (0, 1), (1, 1)):
            error = rejection(url, build_tx(key, net.chain_id, nonce, "cancel_task", TASK, fee))
            assert error.data["code"] in ("FEE_TOO_LOW", "INSUFFICIENT_FUNDS")
        error = rejection(url, build_tx(key, net.chain_id, 0, "register_node", GOOD_RECORD, 1))
        assert error.code == -32003 and error.data["code"] == "INSUFFICIENT_FUNDS"
    bad = rejection(url, Forged(FUNDED, net.chain_id, 0, "register_node", BAD_RECORD, 1))
    assert bad.data["code"] == "BAD_PAYLOAD" and "payload." in bad.message
    good = build_tx(FUNDED, net.chain_id, 0, "register_node", GOOD_RECORD, 1)
    send(url, good)
    assert wait_receipt(url, good)["status"] == "ok"
    faucet_transfer(net, Identity.generate().peer_id)
    assert jsonrpc.call(url, "dkb_getNode", FUNDED.peer_id)["hardware"]["cpu_cores"] == 8
    for key in spammers:                                    # no record, no nonce, no account
        assert jsonrpc.call(url, "dkb_getNode", key.peer_id) is None
        assert jsonrpc.call(url, "dkb_getTransactionCount", key.peer_id) == 0
    assert mempool_txs(url) == 0


def test_out_of_range_heights_are_invalid_params_not_internal_errors(net):
    url = net.nodes[0].rpc_url
    for number in (2**64, -1, "0x10000000000000000", "-1", "9" * 5000, 1.5, None):
        with pytest.raises(RpcAnswerError) as info:
            jsonrpc.call(url, "dkb_getBlockByNumber", number)
        assert info.value.code == -32602, (number, info.value)
    for height in (str(2**64), "-1", "abc"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{url}/block?height={height}", timeout=5)
        assert info.value.code == 400
        assert json.loads(info.value.read())["error"]["code"] == -32602
    with urllib.request.urlopen(f"{url}/block?height=1", timeout=5) as r:
        assert json.loads(r.read())["height"] == 1
    assert jsonrpc.call(url, "dkb_getBlockByNumber", 10**12) is None   # in range, not there yet


def test_the_ledger_commits_nothing_from_an_empty_account_even_without_a_fee_floor():
    """A proposer may put anything in its block; execution itself refuses empty senders."""
    proposer, rich = Identity.from_seed(b"\x72" * 32), Identity.from_seed(b"\x73" * 32)
    genesis = Genesis("attack-ledger", 0, {rich.peer_id: 10**6}, (GenesisValidator(proposer.peer_id, 10_000),),
                      Params(min_fee=0))
    ledger = Ledger.from_genesis(genesis)
    spam = [build_tx(Identity.generate(), genesis.chain_id, 0, tx_type, payload, 0)
            for _ in range(100) for tx_type, payload in (("cancel_task", TASK), ("register_node", GOOD_RECORD))]
    honest = build_tx(rich, genesis.chain_id, 0, "transfer", {"to": proposer.peer_id, "amount": 1}, 0)
    txs = [t.raw for t in spam] + [honest.raw]
    block = build_block(genesis.chain_id, 1, 1000, ledger.last_block_hash, ledger.app_hash, proposer,
                        ledger.beacon, txs, [])
    accounts_before = len(ledger.state.accounts)
    result = ledger.apply_block(block)
    assert [r.code for r in result.receipts[:-1]] == [TxCode.INSUFFICIENT_FUNDS] * len(spam)
    assert not any(r.executed for r in result.receipts[:-1])
    assert result.receipts[-1].code == TxCode.OK
    assert len(ledger.state.accounts) == accounts_before + 1      # only the honest transfer's recipient
    assert not ledger.state.nodes.keys() - {proposer.peer_id}
    ledger.check_invariants()
