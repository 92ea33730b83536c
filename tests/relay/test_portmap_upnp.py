"""UPnP-IGD through PortMapper against a fake IGD on 127.0.0.1 (aiohttp; the SSDP step is replaced
by the fake's description URL): external address, AddPortMapping with a 718 conflict retried once
on another port, DeletePortMapping; a description far over the size cap, a redirect and a closed
port each end in a PortMapError (ADR 0221)."""
from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp import web

from relay.portmap import igd, mapper
from relay.portmap.errors import PortMapError
from relay.portmap.mapper import PortMapper
from relay.portmap.transport import http
from tests.relay.test_portmap_wire import DESCRIPTION

SOAP_OK = ('<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body><u:{action}Response xmlns:u="x">'
           '{fields}</u:{action}Response></s:Body></s:Envelope>')
FAULT = ('<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/"><s:Body><s:Fault><detail><UPnPError>'
         '<errorCode>718</errorCode><errorDescription>ConflictInMappingEntry</errorDescription></UPnPError>'
         '</detail></s:Fault></s:Body></s:Envelope>')


async def fake_igd(calls: list[tuple[str, str]]):
    async def description(request):
        return web.Response(body=DESCRIPTION, content_type="text/xml")

    async def control(request):
        action = request.headers["SOAPAction"].strip('"').split("#")[1]
        body = await request.text()
        port = (re.search(r"<NewExternalPort>(\d+)</NewExternalPort>", body) or [None, ""])[1]
        calls.append((action, port))
        if action == "GetExternalIPAddress":
            fields = "<NewExternalIPAddress>11.99.0.101</NewExternalIPAddress>"
        elif action == "AddPortMapping" and port == "4001":   # another client holds 4001
            return web.Response(status=500, text=FAULT, content_type="text/xml")
        else:
            fields = ""
        return web.Response(text=SOAP_OK.format(action=action, fields=fields), content_type="text/xml")

    async def big(request):
        return web.Response(body=b"<root>" + b"x" * (4 * igd.MAX_XML) + b"</root>")

    async def moved(request):
        raise web.HTTPFound("http://10.1.2.3/rootDesc.xml")

    app = web.Application()
    app.router.add_get("/rootDesc.xml", description)
    app.router.add_post("/ctl/IPConn", control)
    app.router.add_get("/big.xml", big)
    app.router.add_get("/moved.xml", moved)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def _upnp_maps_retries_a_conflict_and_deletes(monkeypatch):
    calls: list[tuple[str, str]] = []
    runner, port = await fake_igd(calls)
    try:
        async def found(gateway, timeout):
            return f"http://127.0.0.1:{port}/rootDesc.xml"
        monkeypatch.setattr(mapper, "ssdp_search", found)
        pm = PortMapper("127.0.0.1", "192.168.1.2", 4001, protocols=("upnp",))
        mapping = await pm.map()
        assert mapping.protocol == "upnp" and mapping.external_ip == "11.99.0.101"
        assert mapping.external_port != 4001 and mapping.service is not None
        assert mapping.service.control_url == f"http://127.0.0.1:{port}/ctl/IPConn"
        assert [c[0] for c in calls] == ["GetExternalIPAddress", "AddPortMapping", "AddPortMapping"]
        renewed = await pm.renew(mapping)
        assert renewed.external_port == mapping.external_port
        await pm.delete(mapping)
        assert calls[-1] == ("DeletePortMapping", str(mapping.external_port))
    finally:
        await runner.cleanup()


async def _oversized_redirected_and_refused_answers_fail_clearly():
    runner, port = await fake_igd([])
    try:
        status, body = await http("GET", f"http://127.0.0.1:{port}/big.xml", 2.0)
        assert status == 200 and len(body) == igd.MAX_XML + 1          # read no further than the cap
        with pytest.raises(PortMapError, match="too long"):
            igd.find_service(body, f"http://127.0.0.1:{port}/big.xml", "127.0.0.1")
        status, _ = await http("GET", f"http://127.0.0.1:{port}/moved.xml", 2.0)
        assert status == 302                                            # not followed
    finally:
        await runner.cleanup()
    with pytest.raises(PortMapError, match="UPnP GET"):
        await http("GET", f"http://127.0.0.1:{port}/rootDesc.xml", 1.0)   # nothing listens any more


def test_upnp_maps_retries_a_conflict_and_deletes(monkeypatch):
    asyncio.run(_upnp_maps_retries_a_conflict_and_deletes(monkeypatch))


def test_oversized_redirected_and_refused_answers_fail_clearly():
    asyncio.run(_oversized_redirected_and_refused_answers_fail_clearly())
