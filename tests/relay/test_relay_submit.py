"""Receipt submission over JSON-RPC: a signed relay_receipt transaction with the pending nonce."""
import asyncio

from aiohttp import web

from consensus.tx import decode_tx
from node.identity import Identity
from relay.receipts import build_receipt, relay_receipt_payload
from relay.submit import rpc_receipt_submitter


def test_submitter_sends_signed_transactions_with_increasing_nonces():
    relay, src, dst = Identity.generate(), Identity.generate(), Identity.generate()
    received = []

    async def handle(request):
        body = await request.json()
        if body["method"] == "dkb_getTransactionCount":
            assert body["params"] == [relay.peer_id, "pending"]
            result = 7 + len(received)
        else:
            tx = decode_tx(bytes.fromhex(body["params"][0]), chain_id="c")
            received.append(tx)
            result = tx.hash.hex()
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async def main():
        app = web.Application()
        app.router.add_post("/", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            submit = rpc_receipt_submitter(f"http://127.0.0.1:{port}", relay, "c")
            receipt = build_receipt(relay.peer_id, src.peer_id, dst.peer_id, b"s" * 16, 1 << 26, 1)
            payload = relay_receipt_payload(receipt, b"\x01" * 64, b"\x02" * 64)
            await asyncio.gather(submit(payload), submit(payload))
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert [tx.nonce for tx in received] == [7, 8]
    assert all(tx.type == "relay_receipt" and tx.sender == relay.peer_id and tx.verify_signature() for tx in received)
    assert received[0].payload["receipt"]["bytes_total"] == 1 << 26
