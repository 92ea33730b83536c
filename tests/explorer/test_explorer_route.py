"""/explorer is served by every node with RPC: the page and its assets (CSP, no other site), 404 for
other names; a page served through the node's own (allow-listed) name may call its RPC and open its
websocket (same origin), while other origins stay refused."""
import asyncio

from harness import running_node

from node.explorer import ASSETS


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_page_and_assets_served():
    async def scenario():
        async with running_node() as (node, http):
            async with http.get("/explorer", allow_redirects=False) as resp:
                assert resp.status == 302 and resp.headers["Location"] == "/explorer/"
            async with http.get("/explorer/") as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
                html = await resp.text()
            assert '<script src="app.js">' in html and "http" not in html.split("<body>")[0].replace(
                'name="viewport"', "")
            for name, kind in ASSETS.items():
                async with http.get(f"/explorer/{name}") as resp:
                    assert resp.status == 200 and resp.content_type == kind, name
                    body = await resp.text()
                    assert "//cdn" not in body and "https://" not in body, name
            async with http.get("/explorer/../metrics") as resp:
                assert resp.status in (200, 404)   # normalised to /metrics or refused, never a file
            async with http.get("/explorer/secret.py") as resp:
                assert resp.status == 404

    run(scenario())


def test_same_origin_requests_pass_other_origins_refused():
    async def scenario():
        async with running_node(allowed_hosts="node.example") as (node, http):
            port = node.http.port
            body = {"jsonrpc": "2.0", "id": 1, "method": "dkb_peerId"}
            own = {"Host": f"node.example:{port}", "Origin": f"http://node.example:{port}"}
            async with http.post("/", json=body, headers=own) as resp:
                assert resp.status == 200 and (await resp.json())["result"] == node.peer_id
            async with http.ws_connect("/ws", headers=own) as ws:
                await ws.send_json(body)
                assert (await ws.receive_json())["result"] == node.peer_id
            for origin in ("http://evil.example", f"http://node.example:{port + 1}", f"https://node.example:{port}",
                           f"http://evil.example:{port}"):
                async with http.post("/", json=body, headers={"Host": f"node.example:{port}", "Origin": origin}) as r:
                    assert r.status == 403, origin
            # a name outside allowed_hosts is refused before any Origin comparison (DNS rebinding)
            async with http.post("/", json=body, headers={"Host": f"evil.example:{port}",
                                                          "Origin": f"http://evil.example:{port}"}) as resp:
                assert resp.status == 403

    run(scenario())
