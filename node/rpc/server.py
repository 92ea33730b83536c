"""aiohttp server: GET /health, /status, /metrics, /explorer/; POST / and /rpc (JSON-RPC 2.0); GET /ws;
plus JSON GET routes that components add (e.g. ``/block?height=``). Connection limits and the
Host/Origin allow-list (node/rpc/limits.py) apply to every route, the websocket included; websockets
have a pool of their own (per-client caps, idle timeout, eviction), so they never use up HTTP's.

A thin driver around the sans-I/O Dispatcher, the pub/sub Hub and the StatusBoard. The websocket
speaks the same JSON-RPC plus ``dkb_subscribe(topic, key?)`` (key: e.g. a peer ID for ``txs``) /
``dkb_unsubscribe(id)``; notifications are
``{"jsonrpc":"2.0","method":"dkb_subscription","params":{"subscription":id,"result":payload}}`` and
a subscription dropped for being slow gets one ``dkb_subscriptionDropped`` notice.
"""
from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from node import dashboard as dashboard_page
from node import explorer
from node.metrics import CONTENT_TYPE, Registry
from node.rpc.dispatcher import Dispatcher, encode_json
from node.rpc.errors import (
    INVALID_INPUT,
    INVALID_PARAMS,
    LIMIT_EXCEEDED,
    RESOURCE_NOT_FOUND,
    RESOURCE_UNAVAILABLE,
    InvalidParams,
    LimitExceeded,
    MethodNotSupported,
    RpcError,
)
from node.rpc.limits import ConnectionGuard, HttpPolicy, RequestRefused
from node.rpc.pubsub import Hub, Subscription, SubscriptionClosed, UnknownTopic
from node.rpc.status import StatusBoard

log = logging.getLogger(__name__)

MAX_SUBSCRIPTIONS_PER_CONNECTION = 32
MAX_SUBSCRIPTION_KEY_CHARS = 128
BUILTIN_PATHS = frozenset({"/", "/rpc", "/health", "/status", "/metrics", "/ws", "/explorer", "/explorer/",
                           "/dashboard/data", "/dashboard/pause"})
JsonGet = Callable[[Mapping[str, str]], Awaitable[Any]]
_HTTP_STATUS_FOR_CODE = {INVALID_PARAMS: 400, INVALID_INPUT: 400, RESOURCE_NOT_FOUND: 404, RESOURCE_UNAVAILABLE: 503}
_DROP_NOTICE_TIMEOUT_S = 1.0
SHUTDOWN_GRACE_S = 2.0  # in-flight requests get this long to finish when the node stops


class HttpServer:
    """Serves one node's HTTP endpoints; ``start()`` binds (port 0 picks one), ``stop()`` closes."""

    def __init__(self, *, dispatcher: Dispatcher, hub: Hub, status: StatusBoard, metrics: Registry,
                 host: str = "127.0.0.1", port: int = 0, json_gets: Mapping[str, JsonGet] | None = None,
                 policy: HttpPolicy | None = None, dashboard: dashboard_page.Dashboard | None = None):
        self.dispatcher = dispatcher
        self.dashboard = dashboard or dashboard_page.Dashboard()
        self.policy = policy or HttpPolicy()
        self.guard = ConnectionGuard(self.policy)
        self.json_gets = dict(json_gets or {})
        self.hub = hub
        self.status = status
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._sockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        self._http_requests = metrics.counter("dekube_http_requests_total", "HTTP requests by route and status.",
                                              ["route", "status"])
        dispatcher.register("dkb_subscribe", self._subscribe_over_http, replace=True)
        dispatcher.register("dkb_unsubscribe", self._subscribe_over_http, replace=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=self.dispatcher.max_body_bytes,
                               middlewares=[self._count_requests, self._apply_policy, self.guard.middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/", self._rpc)
        app.router.add_post("/rpc", self._rpc)
        app.router.add_get("/ws", self._websocket)
        explorer.add_routes(app)
        dashboard_page.add_routes(app, self.dashboard)
        for path, handler in self.json_gets.items():
            app.router.add_get(path, self._json_get_handler(handler))
        app.on_shutdown.append(self._close_websockets)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        assert self._runner.server is not None   # made by setup()
        self.guard.install(self._runner.server)
        self.guard.start()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real port when port 0 was asked for
        log.info("HTTP server listening", extra={"url": self.url})

    async def stop(self) -> None:
        await self.guard.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _count_requests(self, request: web.Request, handler: Any) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "<unmatched>"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self._http_requests.inc(route=route, status=str(exc.status))
            raise
        self._http_requests.inc(route=route, status=str(response.status))
        return response

    @web.middleware
    async def _apply_policy(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Host/Origin allow-list (403 with a JSON error), CORS preflight and headers when enabled."""
        try:
            self.policy.check_request(request)
        except RequestRefused as refused:
            return web.json_response({"error": {"code": -32600, "message": refused.message}}, status=refused.status)
        cors = self.policy.cors_headers(request)
        if cors and request.method == "OPTIONS":
            return web.Response(status=204, headers={**cors, "Access-Control-Max-Age": "600"})
        response = await handler(request)
        if cors and not response.prepared:
            response.headers.update(cors)
        return response

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(await self.status.snapshot(), dumps=_dumps_lenient)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _rpc(self, request: web.Request) -> web.Response:
        body = await request.read()  # raises 413 past client_max_size
        answer = await self.dispatcher.handle(body)
        if answer is None:
            return web.Response(status=204)
        return web.Response(body=answer, content_type="application/json")

    @staticmethod
    def _json_get_handler(handler: JsonGet) -> Callable[[web.Request], Awaitable[web.Response]]:
        """Wrap ``handler(query) -> JSON``: RpcErrors become 400/404/503 with the error object, others 500."""

        async def serve(request: web.Request) -> web.Response:
            try:
                result = await handler(dict(request.query))
            except RpcError as exc:
                return web.json_response({"error": exc.to_json()}, status=_HTTP_STATUS_FOR_CODE.get(exc.code, 400))
            except Exception:
                log.exception("HTTP GET %s failed", request.path)
                return web.json_response({"error": {"code": -32603, "message": "Internal error"}}, status=500)
            return web.json_response(result, dumps=_dumps_lenient)

        return serve

    async def _subscribe_over_http(self, *args: Any) -> None:
        raise MethodNotSupported("Method not supported: subscriptions need a websocket connection at /ws")

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        refused = self.guard.admit_websocket(request)  # its own pool: HTTP keeps its capacity (ADR 0186)
        if refused is not None:
            return web.json_response({"error": {"code": LIMIT_EXCEEDED, "message": refused}}, status=503)
        try:
            ws = web.WebSocketResponse(max_msg_size=self.dispatcher.max_body_bytes, heartbeat=30.0)
            await ws.prepare(request)
            self._sockets.add(ws)
            connection = _WebsocketSession(ws, self.dispatcher.child(), self.hub,
                                           lambda: self.guard.websocket_active(request))
            try:
                await connection.serve()
            finally:
                connection.close()
            return ws
        finally:
            self.guard.websocket_closed(request)

    async def _close_websockets(self, app: web.Application) -> None:
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"node shutting down")


class _WebsocketSession:
    """One websocket: JSON-RPC requests in, responses and subscription notifications out."""

    def __init__(self, ws: web.WebSocketResponse, dispatcher: Dispatcher, hub: Hub, active: Callable[[], None]):
        self.ws = ws
        self.active = active  # a message went either way: not idle
        self.dispatcher = dispatcher
        self.hub = hub
        self.pumps: dict[str, tuple[Subscription, asyncio.Task]] = {}
        dispatcher.register("dkb_subscribe", self.subscribe, replace=True)
        dispatcher.register("dkb_unsubscribe", self.unsubscribe, replace=True)

    async def serve(self) -> None:
        async for msg in self.ws:
            if msg.type == WSMsgType.TEXT:
                body = msg.data.encode()
            elif msg.type == WSMsgType.BINARY:
                body = msg.data
            else:
                break
            self.active()
            answer = await self.dispatcher.handle(body)
            if answer is not None:
                await self.ws.send_str(answer.decode())

    async def subscribe(self, topic: str, key: str | None = None) -> str:
        if len(self.pumps) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            raise LimitExceeded(
                f"Limit exceeded: at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions per connection")
        if key is not None and len(key) > MAX_SUBSCRIPTION_KEY_CHARS:
            raise InvalidParams(f"Invalid params: key longer than {MAX_SUBSCRIPTION_KEY_CHARS} characters")
        try:
            sub = self.hub.subscribe(topic, key=key)
        except UnknownTopic:
            raise InvalidParams(
                f"Invalid params: unknown topic {topic[:100]!r} (topics: {self.hub.topics()})") from None
        self.pumps[sub.id] = (sub, asyncio.create_task(self._pump(sub), name=f"ws-pump-{sub.id}"))
        return sub.id

    async def unsubscribe(self, subscription: str) -> bool:
        entry = self.pumps.pop(subscription, None)
        if entry is None:
            return False
        sub, task = entry
        sub.close()
        task.cancel()
        return True

    async def _pump(self, sub: Subscription) -> None:
        try:
            while True:
                payload = await sub.next()
                self.active()
                await self.ws.send_str(encode_json({"jsonrpc": "2.0", "method": "dkb_subscription",
                                                    "params": {"subscription": sub.id, "result": payload}}))
        except SubscriptionClosed as closed:
            self.pumps.pop(sub.id, None)
            notice = {"jsonrpc": "2.0", "method": "dkb_subscriptionDropped",
                      "params": {"subscription": sub.id, "reason": str(closed)}}
            try:
                await asyncio.wait_for(self.ws.send_str(encode_json(notice)), _DROP_NOTICE_TIMEOUT_S)
            except (TimeoutError, ConnectionError, RuntimeError):
                pass
        except (ConnectionError, RuntimeError):
            sub.close("connection closed")  # the peer went away mid-send

    def close(self) -> None:
        for sub, task in self.pumps.values():
            sub.close("connection closed")
            task.cancel()
        self.pumps.clear()


def _dumps_lenient(doc: Any) -> str:
    """/status is for operators: show odd values as strings rather than fail."""
    return json.dumps(doc, default=str)
