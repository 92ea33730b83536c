"""The one JSON-RPC client (node/ledger/jsonrpc.py, ADR 0190): the blocking form the CLI and tools
use and the node's async ValidatorPool read answers the same way: a result, an error answer as
RpcAnswerError (code, message, data), a dead or non-JSON-RPC endpoint as LedgerUnavailable; batch
answers come back in request order whatever order the server sends them in."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError


def answer(request: dict) -> dict:
    if request["method"] == "echo":
        return {"jsonrpc": "2.0", "id": request["id"], "result": request["params"]}
    return {"jsonrpc": "2.0", "id": request["id"],
            "error": {"code": -32001, "message": "nonce too low", "data": {"code": "NONCE_TOO_LOW"}}}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (the stdlib's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/broken/":
            self.send_error(500)
            return
        if self.path == "/plain/":
            reply = [1, 2]
        elif isinstance(body, list):
            reply = [answer(r) for r in reversed(body) if r["method"] != "drop"]
        else:
            reply = answer(body)
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_blocking_call_result_error_and_unreachable(url):
    assert jsonrpc.call(url, "echo", 1, "a") == [1, "a"]
    with pytest.raises(RpcAnswerError) as info:
        jsonrpc.call(url, "refuse")
    assert (info.value.code, info.value.message, info.value.tx_code) == (-32001, "nonce too low", "NONCE_TOO_LOW")
    assert str(info.value) == 'nonce too low (code -32001, {"code": "NONCE_TOO_LOW"})'
    with pytest.raises(LedgerUnavailable, match="HTTP 500"):
        jsonrpc.call(url + "/broken", "echo")
    with pytest.raises(LedgerUnavailable, match="not a JSON-RPC object"):
        jsonrpc.call(url + "/plain", "echo")
    with pytest.raises(LedgerUnavailable):
        jsonrpc.call("http://127.0.0.1:9", "echo", timeout=2)


def test_blocking_batch_keeps_request_order_and_marks_missing_answers(url):
    results = jsonrpc.batch(url, [("echo", [1]), ("refuse", []), ("drop", []), ("echo", [2])])
    assert results[0] == [1] and results[3] == [2]
    assert isinstance(results[1], RpcAnswerError) and results[1].code == -32001
    assert isinstance(results[2], RpcAnswerError) and results[2].message == "no response"
    assert jsonrpc.batch(url, []) == []


def test_the_node_pool_reads_answers_the_same_way_and_fails_over(url):
    async def scenario():
        pool = jsonrpc.ValidatorPool(["http://127.0.0.1:9", url])
        try:
            assert await pool.call("echo", 3) == [3]
            assert pool.url == url                       # the one that answered is preferred now
            with pytest.raises(RpcAnswerError) as info:
                await pool.call("refuse")
            assert info.value.tx_code == "NONCE_TOO_LOW"
        finally:
            await pool.close()
        dead = jsonrpc.ValidatorPool([url + "/broken", url + "/plain"])
        try:
            with pytest.raises(LedgerUnavailable, match="no validator answered"):
                await dead.call("echo")
        finally:
            await dead.close()
    asyncio.run(scenario())
