"""Attacks on the HTTP/JSON-RPC server (issue 12, item 4), each next to a well-behaved client:
half-open requests held to exhaust file descriptors, a web page on another site using the node's
loopback RPC (DNS rebinding, cross-site POST, websocket from a foreign Origin), CORS off by default."""
import asyncio

import aiohttp
from attack_kit import established_server_sockets, rpc_call, run, running_node

HALF_OPEN = 150
CAP = 24


async def open_half_requests(port: int, count: int):
    """``count`` connections that each send part of a request's headers and then nothing."""
    streams = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        streams.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in streams))
    return streams


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(4096), timeout) is not None  # b"" or a 503, then EOF
    except (TimeoutError, ConnectionError):
        return False


def test_half_open_requests_are_capped_timed_out_and_good_clients_still_served():
    run(_test_half_open_requests_are_capped_timed_out_and_good_clients_still_served())


async def _test_half_open_requests_are_capped_timed_out_and_good_clients_still_served():
    async with running_node(max_connections=CAP, header_timeout=1.0) as (node, session):
        port = node.http.port
        streams = await open_half_requests(port, HALF_OPEN)
        try:
            await asyncio.sleep(0.2)
            held = established_server_sockets(port)
            assert held <= CAP + 2, f"server holds {held} connections for {HALF_OPEN} half-open requests"
            for _ in range(3):                          # a well-behaved client is served meanwhile
                status, doc = await rpc_call(session, "dkb_peerId")
                assert status == 200 and doc["result"] == node.peer_id
                async with session.get("/health") as r:
                    assert r.status == 200
            # the ones still held by the server are closed once their header deadline passes
            survivors = [s for s in streams if not s[1].is_closing()]
            closed = await asyncio.gather(*(closed_by_server(r, 4.0) for r, _ in survivors[-CAP:]))
            assert all(closed)
            assert established_server_sockets(port) <= 2   # at most the client session's keep-alive
            assert node.http.guard.evicted + node.http.guard.timed_out >= HALF_OPEN - CAP
        finally:
            for _, writer in streams:
                writer.close()


def test_a_request_inside_its_handler_is_not_timed_out():
    run(_test_a_request_inside_its_handler_is_not_timed_out())


async def _test_a_request_inside_its_handler_is_not_timed_out():
    async with running_node(header_timeout=0.3) as (node, session), session.ws_connect("/ws") as ws:
        await asyncio.sleep(1.0)                        # > header_timeout, idle inside the websocket
        await ws.send_json({"jsonrpc": "2.0", "id": 7, "method": "dkb_peerId"})
        assert (await ws.receive_json(timeout=5))["result"] == node.peer_id


def test_foreign_origin_cannot_use_the_websocket_or_post_transactions():
    run(_test_foreign_origin_cannot_use_the_websocket_or_post_transactions())


async def _test_foreign_origin_cannot_use_the_websocket_or_post_transactions():
    async with running_node() as (node, session):
        evil = {"Origin": "http://attacker.example"}
        try:
            async with session.ws_connect("/ws", headers=evil):
                raise AssertionError("websocket upgrade from a foreign Origin was accepted")
        except aiohttp.WSServerHandshakeError as exc:
            assert exc.status == 403
        body = '{"jsonrpc":"2.0","id":1,"method":"dkb_sendRawTransaction","params":["00"]}'
        async with session.post("/", data=body, headers={**evil, "Content-Type": "text/plain"}) as r:
            assert r.status == 403
            assert "allowed_origins" in (await r.json())["error"]["message"]
        # DNS rebinding: the page's own name resolves to 127.0.0.1, so Host carries that name
        async with session.get("/status", headers={"Host": f"rebind.attacker.example:{node.http.port}"}) as r:
            assert r.status == 403 and "allowed_hosts" in (await r.json())["error"]["message"]
        # well-behaved clients: no Origin (curl, programs), a loopback page, Host by IP or localhost
        assert (await rpc_call(session, "dkb_peerId"))[1]["result"] == node.peer_id
        status, doc = await rpc_call(session, "dkb_peerId", headers={"Origin": "http://localhost:3000"})
        assert status == 200 and doc["result"] == node.peer_id
        async with session.get("/health", headers={"Host": f"localhost:{node.http.port}"}) as r:
            assert r.status == 200
            assert "Access-Control-Allow-Origin" not in r.headers       # CORS is off by default
        async with session.ws_connect("/ws", headers={"Origin": "http://127.0.0.1:8080"}) as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "dkb_peerId"})
            assert (await ws.receive_json(timeout=5))["result"] == node.peer_id


def test_cors_when_configured_answers_preflights_for_allowed_origins_only():
    run(_test_cors_when_configured_answers_preflights_for_allowed_origins_only())


async def _test_cors_when_configured_answers_preflights_for_allowed_origins_only():
    async with running_node(cors="true", allowed_origins="https://dash.example.org") as (node, session):
        good = {"Origin": "https://dash.example.org", "Access-Control-Request-Method": "POST"}
        async with session.options("/", headers=good) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "https://dash.example.org"
        status, doc = await rpc_call(session, "dkb_peerId", headers={"Origin": "https://dash.example.org"})
        assert status == 200 and doc["result"] == node.peer_id
        async with session.options("/", headers={"Origin": "http://localhost"}) as r:
            assert r.status == 403                         # the list replaced the loopback defaults


def test_idle_websockets_do_not_block_http_and_are_evicted_or_timed_out():
    """Issue 22 item 3: 256 idle websockets (clients answering pings, never sending) held every
    HTTP connection: /health and every RPC got 503 for as long as they stayed. Now websockets have a
    pool of their own: HTTP always has capacity, an idle flood makes room for a new websocket, and
    a websocket silent past ws_idle_timeout is closed."""
    run(_test_idle_websockets_do_not_block_http_and_are_evicted_or_timed_out())


async def _test_idle_websockets_do_not_block_http_and_are_evicted_or_timed_out():
    async with running_node(ws_idle_timeout=3.0) as (node, session):
        sockets, sessions = [], []
        try:
            for i in range(256):                          # from 127.0.0.2-9, 32 each
                if i % 32 == 0:
                    connector = aiohttp.TCPConnector(local_addr=(f"127.0.0.{2 + i // 32}", 0), limit=0)
                    sessions.append(aiohttp.ClientSession(base_url=node.http.url, connector=connector))
                try:
                    sockets.append(await sessions[-1].ws_connect("/ws", autoping=True))
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 503
            for _ in range(3):                            # plain HTTP is always served
                async with session.get("/health") as r:
                    assert r.status == 200
                status, doc = await rpc_call(session, "dkb_peerId")
                assert status == 200 and doc["result"] == node.peer_id
            async with session.ws_connect("/ws") as ws:   # a new client's websocket gets a slot
                await ws.send_json({"jsonrpc": "2.0", "id": 7, "method": "dkb_peerId"})
                assert (await ws.receive_json(timeout=5))["result"] == node.peer_id
            guard = node.http.guard
            print(f"\nfigure: 256 idle websockets: /health and RPC 200; {len(guard.websockets)} held, "
                  f"{guard.ws_evicted} evicted, {guard.ws_refused} refused")
            assert len(guard.websockets) <= node.http.policy.max_websockets
            assert guard.ws_evicted + guard.ws_refused >= 256 - node.http.policy.max_websockets
            await asyncio.sleep(5.0)                      # > ws_idle_timeout: the silent ones are closed
            assert len(guard.websockets) == 0 and guard.ws_timed_out > 0
            # left: keep-alive HTTP connections (one per session, after a 503) until their idle_timeout
            assert established_server_sockets(node.http.port) <= 1 + len(sessions)
            for ws in sockets[-4:]:
                msg = await ws.receive(timeout=2)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
        finally:
            for ws in sockets:
                await ws.close()
            for s in sessions:
                await s.close()
