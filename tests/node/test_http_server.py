"""HTTP endpoints of a running Node: /health, /status, /metrics, JSON-RPC POST, body limit, /ws pub/sub."""
import asyncio
import contextlib
import json

import aiohttp
import pytest
from node_harness import local_config, running_node

from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_health_status_metrics():
    async def scenario():
        async with running_node() as (node, http):
            async with http.get("/health") as resp:
                assert resp.status == 200 and await resp.json() == {"ok": True}
            async with http.get("/status") as resp:
                status = await resp.json()
            assert status["peer_id"] == node.peer_id and status["roles"] == ["relay"]
            assert status["relay"]["running"] is True and status["uptime_s"] >= 0
            assert {"version", "listen_addrs", "chain_id"} <= status.keys()
            async with http.get("/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await resp.text()
            assert "# TYPE dekube_node_uptime_seconds gauge" in text
            assert 'dekube_http_requests_total{route="/health",status="200"} 1.0' in text

    run(scenario())


def test_status_shows_failing_section_without_failing():
    async def scenario():
        async with running_node() as (node, http):
            node.status.add_section("broken", lambda: 1 / 0)
            async with http.get("/status") as resp:
                assert resp.status == 200
                assert "ZeroDivisionError" in (await resp.json())["broken"]["error"]

    run(scenario())


def test_json_rpc_over_http():
    async def scenario():
        async with running_node() as (node, http):
            for path in ("/", "/rpc"):
                async with http.post(path, json={"jsonrpc": "2.0", "id": 1, "method": "dkb_peerId"}) as resp:
                    assert resp.status == 200 and (await resp.json())["result"] == node.peer_id
            async with http.post("/", data=b"{junk") as resp:
                assert (await resp.json())["error"]["code"] == -32700
            async with http.post("/", json={"jsonrpc": "2.0", "method": "dkb_version"}) as resp:
                assert resp.status == 204
            batch = [{"jsonrpc": "2.0", "id": i, "method": m} for i, m in enumerate(["dkb_health", "dkb_version"])]
            async with http.post("/", json=batch) as resp:
                answers = await resp.json()
            assert answers[0]["result"]["ok"] is True and isinstance(answers[1]["result"], str)
            async with http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe",
                                            "params": ["newHeads"]}) as resp:
                assert (await resp.json())["error"]["code"] == -32004

    run(scenario())


def test_oversized_body_gets_413():
    async def scenario():
        async with running_node(max_body_bytes=1000) as (node, http):
            async with http.post("/", data=b"x" * 5000) as resp:
                assert resp.status == 413
            async with http.get("/health") as resp:  # still serving
                assert resp.status == 200

    run(scenario())


def test_websocket_subscribe_receive_unsubscribe():
    async def scenario():
        async with running_node() as (node, http):
            node.hub.add_topic("newHeads")
            async with http.ws_connect("/ws") as ws:
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe",
                                              "params": ["newHeads"]}))
                sub_id = json.loads((await ws.receive()).data)["result"]
                assert node.hub.publish("newHeads", {"height": 1}) == 1
                note = json.loads((await ws.receive(timeout=5)).data)
                assert note == {"jsonrpc": "2.0", "method": "dkb_subscription",
                                "params": {"subscription": sub_id, "result": {"height": 1}}}
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "dkb_peerId"}))
                assert json.loads((await ws.receive()).data)["result"] == node.peer_id
                await ws.send_bytes(b"\xff\x00junk")
                assert json.loads((await ws.receive()).data)["error"]["code"] == -32700
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "dkb_subscribe",
                                              "params": ["noSuchTopic"]}))
                assert json.loads((await ws.receive()).data)["error"]["code"] == -32602
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 4, "method": "dkb_unsubscribe",
                                              "params": [sub_id]}))
                assert json.loads((await ws.receive()).data)["result"] is True
                assert node.hub.publish("newHeads", {"height": 2}) == 0
            await asyncio.sleep(0.05)
            assert node.hub.count() == 0

    run(scenario())


def test_closing_the_websocket_ends_its_subscriptions():
    async def scenario():
        async with running_node() as (node, http):
            node.hub.add_topic("newHeads")
            async with http.ws_connect("/ws") as ws:
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe",
                                              "params": ["newHeads"]}))
                await ws.receive()
                assert node.hub.count() == 1
            for _ in range(100):
                if node.hub.count() == 0:
                    break
                await asyncio.sleep(0.02)
            assert node.hub.count() == 0

    run(scenario())


def test_node_stop_closes_open_websockets():
    async def scenario():
        node = Node(local_config(), Identity.generate(), [basic_role("compute")])
        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(node.http.url + "/ws") as ws:
                node.request_stop()
                msg = await ws.receive(timeout=5)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await asyncio.wait_for(task, 10)

    run(scenario())


def test_port_in_use_is_a_clear_start_error():
    from node.runtime import NodeStartError

    async def scenario():
        async with running_node() as (node, http):
            other = Node(local_config({("rpc", "port"): str(node.http.port)}),
                         Identity.generate(), [basic_role("relay")])
            with pytest.raises(NodeStartError, match=f"cannot serve HTTP on http://127.0.0.1:{node.http.port}"):
                await other.run()

    run(scenario())


def test_raw_tcp_junk_does_not_hurt_the_server():
    async def scenario():
        async with running_node() as (node, http):
            for junk in (b"\x00\xff" * 500, b"GET / HTTP/9.9\r\n\r\n",
                         b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n"):
                reader, writer = await asyncio.open_connection("127.0.0.1", node.http.port)
                writer.write(junk)
                await writer.drain()
                with contextlib.suppress(ConnectionError):
                    await asyncio.wait_for(reader.read(4096), 5)
                writer.close()
            async with http.get("/health") as resp:
                assert resp.status == 200

    run(scenario())
