"""The block explorer: a static page (HTML, JS, CSS in ``static/``, no build step, nothing loaded
from other sites) that every node with RPC serves at ``/explorer``. It reads only the public
JSON-RPC and the websocket of the node that served it (ADR 0156)."""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent / "static"
ASSETS = {"index.html": "text/html", "app.js": "application/javascript", "chart.js": "application/javascript",
          "style.css": "text/css"}
# the page may call other nodes' RPC (training progress from compute nodes), never load code from them
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self' ws: wss: http: https:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def add_routes(app: web.Application) -> None:
    """GET /explorer (redirect to /explorer/), /explorer/ and its assets; unknown names are 404."""
    bodies = {name: (STATIC_DIR / name).read_bytes() for name in ASSETS}

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/explorer/")

    async def serve(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in bodies:
            raise web.HTTPNotFound(text="no such explorer file")
        return web.Response(body=bodies[name], content_type=ASSETS[name], charset="utf-8",
                            headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                     "Cache-Control": "no-cache", "Referrer-Policy": "no-referrer"})

    app.router.add_get("/explorer", redirect)
    app.router.add_get("/explorer/", serve)
    app.router.add_get("/explorer/{name}", serve)
