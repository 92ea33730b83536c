"""The node's one ledger gateway against an in-process chain (loopback validators): one sender for
a node's roles (50 concurrent transactions from the relay and compute roles' code paths commit with
gapless nonces), a nonce resync after a transaction the gateway did not send, failover to a second
validator URL, and the ``tasks`` and ``txs`` topics reaching a subscriber."""
import asyncio
import hashlib

import pytest
from ledger_testnet import CHAIN, LedgerTestnet, eventually, node_config

from consensus.state.tasks import task_id_for
from consensus.tx import relay_receipt_signing_bytes
from devtools.testnet import free_ports
from ml.compute.role import ComputeRole
from node.identity import Identity
from node.ledger import RESYNC, LedgerGateway
from relay.receipts import build_receipt, relay_receipt_payload
from relay.role import RelayRole

TXS = 50


def signed_receipt(relay: str, src: Identity, dst: Identity, n: int) -> dict:
    receipt = build_receipt(relay, src.peer_id, dst.peer_id, hashlib.sha256(b"s%d" % n).digest()[:16], 1 << 20, 1)
    message = relay_receipt_signing_bytes(CHAIN, receipt)
    return relay_receipt_payload(receipt, src.sign(message), dst.sign(message))


def test_relay_and_compute_roles_on_one_key_pipeline_50_txs_with_gapless_nonces(tmp_path):
    key, src, dst = Identity.generate(), Identity.generate(), Identity.generate()
    net = LedgerTestnet(tmp_path, 2, {key.peer_id: 10**9, src.peer_id: 10**9})

    async def main():
        await net.start()
        try:
            node = await net.add(node_config(extra={("ledger", "rpc_urls"): [net.url(0), net.url(1)]}), key,
                                 [RelayRole, ComputeRole])
            relay, compute = node.role("relay"), node.role("compute")
            assert relay.ledger is node.ledger and compute.ledger is node.ledger
            await eventually(lambda: relay.registered and compute.registered, 60, what="both roles registered")
            record = await node.ledger.node_info(key.peer_id)
            assert {"relay", "compute"} <= set(record["roles"]) and record["hardware"]["bandwidth_mbps"] == 100
            start = await node.ledger.call("dkb_getTransactionCount", key.peer_id, "latest")

            async def from_relay(n):   # the relay service's submit path: a co-signed usage receipt
                await relay.service._submit(signed_receipt(key.peer_id, src, dst, n))

            async def from_compute(n):  # the compute role's sender
                return await compute.ledger.send("transfer", {"to": dst.peer_id, "amount": 1 + n})

            sent_before = node.ledger.counters["sent"]
            await asyncio.gather(*(from_relay(n) if n % 2 else from_compute(n) for n in range(TXS)))
            assert relay.submissions == {"sent": TXS // 2, "failed": 0}
            assert node.ledger.counters["sent"] - sent_before == TXS and node.ledger.counters["failed"] == 0
            assert node.ledger.counters["nonce_resyncs"] == 0
            status = (await node.status.snapshot())["ledger"]
            assert status["ledger"] == net.url(0) and status["in_flight"] == 0 and status["txs_failed"] == 0
            assert status["receipt_feed_live"]   # receipts came on the txs topic
            assert {"relay", "compute"} <= set(status["record"]["roles"])
            assert await node.ledger.call("dkb_getTransactionCount", key.peer_id, "latest") == start + TXS
            # every one of the 50 is in a block, with the nonces start..start+49
            mine, heights = [], set()
            for height in range(1, await node.ledger.call("dkb_blockNumber") + 1):
                block = await asyncio.to_thread(net.validator_roles[0].block_json, height, True)
                ours = [tx["nonce"] for tx in block["transactions"]
                        if tx["from"] == key.peer_id and tx["nonce"] >= start]
                mine += ours
                heights |= {height} if ours else set()
            assert sorted(mine) == list(range(start, start + TXS))
            assert len(heights) <= TXS // 4   # pipelined: many of them per block, not one block each
        finally:
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 180))


def test_a_tx_sent_elsewhere_from_the_same_key_makes_the_gateway_resync_once(tmp_path):
    key, other = Identity.generate(), Identity.generate()
    net = LedgerTestnet(tmp_path, 1, {key.peer_id: 10**6})

    async def main():
        await net.start()
        gateway, elsewhere = LedgerGateway(key, [net.url(0)]), LedgerGateway(key, [net.url(0)])
        try:
            first = await gateway.send("transfer", {"to": other.peer_id, "amount": 1})
            await elsewhere.send("transfer", {"to": other.peer_id, "amount": 2})  # takes the nonce gateway expects
            again = await gateway.send("transfer", {"to": other.peer_id, "amount": 3})
            assert first["code"] == again["code"] == 0 and gateway.counters["nonce_resyncs"] == 1
            assert await gateway.call("dkb_getTransactionCount", key.peer_id, "latest") == 3
            assert await gateway.call("dkb_getBalance", other.peer_id) == 6
        finally:
            await gateway.close()
            await elsewhere.close()
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_reads_and_sends_fail_over_to_the_second_url_when_the_first_is_dead(tmp_path):
    key, other = Identity.generate(), Identity.generate()
    net = LedgerTestnet(tmp_path, 1, {key.peer_id: 10**6})
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"

    async def main():
        await net.start()
        gateway = LedgerGateway(key, [dead, net.url(0)])
        try:
            assert await gateway.call("dkb_chainId") == CHAIN
            assert gateway.pool.preferred == 1 and gateway.url == net.url(0)
            receipt = await gateway.send("transfer", {"to": other.peer_id, "amount": 5})
            assert receipt["code"] == 0 and await gateway.call("dkb_getBalance", other.peer_id) == 5
            gateway.pool.preferred = 0      # subscriptions fail over too
            heads = gateway.subscribe("newHeads")
            try:
                assert await asyncio.wait_for(anext(heads), 10) is RESYNC
                assert (await asyncio.wait_for(anext(heads), 10))["height"] >= receipt["height"]
            finally:
                await heads.aclose()
        finally:
            await gateway.close()
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_tasks_topic_delivers_a_created_event_and_the_txs_topic_a_receipt(tmp_path):
    owner = Identity.generate()
    net = LedgerTestnet(tmp_path, 1, {owner.peer_id: 10**6})
    payload = {"model": "m", "dataset": "d", "hyperparams": {}, "workers": 1, "sync_mode": "allreduce",
               "codec": "fp16", "price": 100, "profile": "cpu-x86-64-avx2/torch-2.13.0", "segments": 4}

    async def main():
        await net.start()
        gateway = LedgerGateway(owner, [net.url(0)])
        tasks, txs = gateway.subscribe("tasks"), gateway.subscribe("txs", owner.peer_id)
        try:
            assert await anext(tasks) is RESYNC and await anext(txs) is RESYNC   # subscribed
            receipt = await gateway.send("submit_task", payload)
            event = await asyncio.wait_for(anext(tasks), 10)
            assert event["event"] == "created" and event["owner"] == owner.peer_id
            assert event["task_id"] == task_id_for(owner.peer_id, 0).hex()
            assert event["height"] == receipt["height"]
            assert await gateway.call("dkb_getTask", event["task_id"]) is not None
            mine = await asyncio.wait_for(anext(txs), 10)
            assert mine["tx_hash"] == receipt["tx_hash"] and mine["code"] == 0
        finally:
            await tasks.aclose()
            await txs.aclose()
            await gateway.close()
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_gateways_ledger_constants_are_the_ledgers():
    from cli.assembly import PRODUCT
    from consensus.tx import DEFAULT_FEE, MAX_CPU_CORES, ROLES, signed_tx_bytes
    from node.ledger.record import LEDGER_ROLES
    from node.ledger.record import MAX_CPU_CORES as RECORD_MAX_CORES
    from node.plugins import installed
    assert LEDGER_ROLES == ROLES
    assert RECORD_MAX_CORES == MAX_CPU_CORES
    assert installed() is PRODUCT   # the gateway signs with the ledger's encoder and pays its DEFAULT_FEE
    assert PRODUCT.tx is not None and (PRODUCT.tx.encode, PRODUCT.tx.fee) == (signed_tx_bytes, DEFAULT_FEE)


def test_a_gateway_without_a_transaction_encoding_refuses_to_send(monkeypatch):
    """node/ names no encoder (ADR 0201): with none handed in or installed, a send fails saying so."""
    import node.ledger.gateway as gateway_module
    from node.ledger.errors import TxFailed
    from node.plugins import Plugins

    monkeypatch.setattr(gateway_module, "installed", Plugins)   # nothing installed

    async def main():
        gateway = LedgerGateway(Identity.generate(), ["http://127.0.0.1:9"])
        gateway._chain_id = "dekube-local"
        try:
            with pytest.raises(TxFailed, match="no transaction encoding installed"):
                await gateway.send("transfer", {"to": "x", "amount": 1})
        finally:
            await gateway.close()

    asyncio.run(main())


def test_a_subscription_reconnects_to_another_validator_and_says_resync(tmp_path):
    net = LedgerTestnet(tmp_path, 4, {})

    async def main():
        await net.start()
        gateway = LedgerGateway(Identity.generate(), [net.url(3), net.url(0)])
        heads = gateway.subscribe("newHeads")
        try:
            assert await asyncio.wait_for(anext(heads), 10) is RESYNC
            assert "height" in await asyncio.wait_for(anext(heads), 10)
            net.nodes[3].request_stop()                 # the validator we listen to goes away
            while (item := await asyncio.wait_for(anext(heads), 20)) is not RESYNC:
                assert "height" in item
            after = await asyncio.wait_for(anext(heads), 10)   # heads again, now from validator 0
            assert after["height"] >= 1
        finally:
            await heads.aclose()
            await gateway.close()
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 90))
