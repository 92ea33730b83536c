"""The provider's local dashboard at ``/`` (GET; POST / stays JSON-RPC): status, earnings, slashes and a
pause switch on one page (docs/adr/0195). Like the explorer, a static page (``static/``, nothing from
other sites) but served only to loopback clients, whatever address the server binds.

``GET /dashboard/data`` answers what ``Dashboard.sections`` produce (the node adds ``node``, the compute
role ``compute``) and the log tail (``log``, node/dashboard/logtail.py). ``POST /dashboard/pause``
(``{"paused": true|false}``) calls ``Dashboard.pause``; it needs the per-start token the page carries
(``X-Dekube-Token``), which a page of another site cannot read, and it refuses a request whose
``Origin`` is not this server's own or whose ``Sec-Fetch-Site`` says cross-site, so a web page cannot
press the switch. ``POST /dashboard/limits`` (some of ``{"hours", "max_task_s", "cuda_devices"}``) sets
the compute role's limits (ml/compute/limits.py) under the same checks.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from node.dashboard.logtail import LogTail
from node.rpc.limits import same_origin

STATIC_DIR = Path(__file__).parent / "static"
TOKEN_HEADER = "X-Dekube-Token"
MAX_BODY_BYTES = 1024
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


class Dashboard:
    """What the page shows and controls; parts of the node add to it while they are built."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(24)
        self.sections: dict[str, Callable[[], Awaitable[dict]]] = {}
        self.pause: Callable[[bool], dict] | None = None
        self.limits: Callable[[Any], dict] | None = None   # POST /dashboard/limits: ValueError if invalid
        self.log = LogTail()

    async def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, section in self.sections.items():
            try:
                out[name] = await section()
            except Exception as exc:   # one part failing (the ledger unreachable) still shows the others
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out["log"] = self.log.tail()
        return out


def is_loopback(request: web.BaseRequest) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def cross_site(request: web.BaseRequest) -> str | None:
    """Why a state-changing request is not from this server's own page, or None."""
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(origin, request):
        return f"origin {origin} may not use the dashboard controls"
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    return None


def add_routes(app: web.Application, dashboard: Dashboard) -> None:
    """GET / (the page), /dashboard/app.js, /dashboard/style.css, /dashboard/data; POST /dashboard/pause and
    /dashboard/limits."""
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    assets = {"app.js": ((STATIC_DIR / "app.js").read_bytes(), "application/javascript"),
              "style.css": ((STATIC_DIR / "style.css").read_bytes(), "text/css")}

    async def index(request: web.Request) -> web.Response:
        if not is_loopback(request):
            return _refuse(403, "the dashboard is served to this machine only")
        body = page.replace("{{TOKEN}}", dashboard.token)
        return web.Response(text=body, content_type="text/html", charset="utf-8", headers=HEADERS)

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in assets or not is_loopback(request):
            raise web.HTTPNotFound(text="no such dashboard file")
        body, kind = assets[name]
        return web.Response(body=body, content_type=kind, charset="utf-8", headers=HEADERS)

    async def data(request: web.Request) -> web.Response:
        if not is_loopback(request):
            return _refuse(403, "the dashboard is served to this machine only")
        return web.json_response(await dashboard.data(), headers={"Cache-Control": "no-store"})

    async def control(request: web.Request, name: str, action: Callable[[Any], dict] | None,
                      wanted: Callable[[Any], bool], shape: str) -> web.Response:
        """A state-changing request of the page: loopback, same origin, the page's token, a small JSON body."""
        if not is_loopback(request):
            return _refuse(403, "the dashboard is served to this machine only")
        why = cross_site(request)
        if why is not None:
            return _refuse(403, why)
        if not hmac.compare_digest(request.headers.get(TOKEN_HEADER, ""), dashboard.token):
            return _refuse(403, f"missing or wrong {TOKEN_HEADER} (the dashboard page carries it)")
        if action is None:
            return _refuse(404, f"this node runs no compute role: no {name}")
        raw = await request.content.read(MAX_BODY_BYTES + 1)
        try:
            body = json.loads(raw) if len(raw) <= MAX_BODY_BYTES else None
        except ValueError:
            body = None
        if not wanted(body):
            return _refuse(400, f"expected {shape}")
        try:
            return web.json_response(action(body))
        except ValueError as exc:   # a limit out of range: said, nothing changed
            return _refuse(400, str(exc))

    async def pause(request: web.Request) -> web.Response:
        switch = dashboard.pause

        def press(body: dict) -> dict:
            assert switch is not None
            return switch(body["paused"])
        return await control(request, "pause switch", None if switch is None else press,
                             lambda body: isinstance(body, dict) and isinstance(body.get("paused"), bool),
                             '{"paused": true|false}')

    async def limits(request: web.Request) -> web.Response:
        return await control(request, "limits", dashboard.limits, lambda body: isinstance(body, dict),
                             '{"hours": "22-7", "max_task_s": N, "cuda_devices": N} (any of them)')

    async def attach(_app: web.Application) -> None:
        dashboard.log.attach()

    async def detach(_app: web.Application) -> None:
        dashboard.log.detach()

    app.on_startup.append(attach)
    app.on_cleanup.append(detach)
    app.router.add_get("/", index)
    app.router.add_get("/dashboard/data", data)
    app.router.add_post("/dashboard/pause", pause)
    app.router.add_post("/dashboard/limits", limits)
    app.router.add_get("/dashboard/{name}", asset)
