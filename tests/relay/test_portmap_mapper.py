"""PortMapper against a scripted gateway on 127.0.0.1 (ADR 0221): PCP first; a NAT-PMP-only router's
"unsupported version" answer falls back to NAT-PMP at once; junk before the real answer is skipped;
junk alone, or silence, ends in a PortMapError within the budget; renew keeps PCP's nonce and
delete sends lifetime 0; datagrams from other addresses are never heard."""
from __future__ import annotations

import asyncio
import struct
import time

import pytest

from relay.portmap import natpmp
from relay.portmap.errors import PortMapError
from relay.portmap.mapper import PortMapper
from relay.portmap.transport import _Inbox
from tests.relay.test_portmap_wire import pcp_answer


class FakeGateway(asyncio.DatagramProtocol):
    """Answers each request with ``script(request)`` (a list of datagrams, maybe empty)."""

    def __init__(self, script) -> None:
        self.script, self.requests = script, []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.requests.append(data)
        for answer in self.script(data):
            self.transport.sendto(answer, addr)


async def serve(script):
    loop = asyncio.get_running_loop()
    transport, gateway = await loop.create_datagram_endpoint(lambda: FakeGateway(script),
                                                             local_addr=("127.0.0.1", 0))
    return transport, gateway, transport.get_extra_info("sockname")[1]


def natpmp_only(request: bytes) -> list[bytes]:
    if request[0] != 0:
        return [struct.pack("!BBHI", 0, 128 + request[1], natpmp.UNSUPPORTED_VERSION, 1)]
    if request[1] == natpmp.OP_EXTERNAL:
        return [struct.pack("!BBHI4s", 0, 128, 0, 1, bytes([11, 99, 0, 7]))]
    internal, _ext, lifetime = struct.unpack_from("!HHI", request, 4)
    return [struct.pack("!BBHIHHI", 0, 130, 0, 1, internal, 50000 if lifetime else 0, lifetime)]


async def _test_pcp_is_tried_first_and_renew_and_delete_keep_the_nonce():
    def pcp_router(request: bytes) -> list[bytes]:
        lifetime = struct.unpack_from("!I", request, 4)[0]
        return [pcp_answer(nonce=request[24:36], lifetime=lifetime, external=4001)]
    transport, gw, port = await serve(pcp_router)
    try:
        mapper = PortMapper("127.0.0.1", "127.0.0.1", 4001, lifetime=600, udp_port=port)
        mapping = await mapper.map()
        assert (mapping.protocol, mapping.multiaddr, mapping.lifetime) == ("pcp", "/ip4/11.99.0.101/tcp/4001", 600)
        renewed = await mapper.renew(mapping)
        assert renewed.nonce == mapping.nonce and gw.requests[1][24:36] == gw.requests[0][24:36]
        await mapper.delete(mapping)
        assert struct.unpack_from("!I", gw.requests[-1], 4)[0] == 0 and gw.requests[-1][24:36] == mapping.nonce
    finally:
        transport.close()


async def _test_a_natpmp_router_is_used_after_pcp_unsupported_version():
    transport, gw, port = await serve(natpmp_only)
    try:
        mapper = PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port, budget=8.0)
        started = time.monotonic()
        mapping = await mapper.map()
        assert time.monotonic() - started < 1.5      # no waiting out PCP's share of the budget (2 s)
        assert (mapping.protocol, mapping.multiaddr) == ("nat-pmp", "/ip4/11.99.0.7/tcp/50000")
        await mapper.delete(mapping)
        assert gw.requests[-1] == natpmp.map_request(4001, 0, 0)
    finally:
        transport.close()


async def _test_junk_before_the_answer_is_skipped():
    def noisy(request: bytes) -> list[bytes]:
        return [b"\x00", b"\xff" * 1500, b"junk" * 20, *natpmp_only(request)]
    transport, _gw, port = await serve(noisy)
    try:
        mapping = await PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port,
                                   protocols=("nat-pmp",)).map()
        assert mapping.external_port == 50000
    finally:
        transport.close()


async def _test_junk_only_or_silence_fails_clearly_within_the_budget():
    transport, _gw, port = await serve(lambda request: [b"\x02\x81junkjunk"])
    try:
        started = time.monotonic()
        with pytest.raises(PortMapError) as err:
            await PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port, budget=0.6,
                             protocols=("pcp", "nat-pmp")).map()
        assert time.monotonic() - started < 2.5   # within the budget, give or take a loaded machine
        assert "pcp: PCP answer" in str(err.value) and "nat-pmp: NAT-PMP answer has version 2" in str(err.value)
    finally:
        transport.close()
    transport, _gw, port = await serve(lambda request: [])
    try:
        with pytest.raises(PortMapError, match="no answer in"):
            await PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port, budget=0.4,
                             protocols=("nat-pmp",)).map()
    finally:
        transport.close()


def test_datagrams_from_other_addresses_are_not_heard():
    inbox = _Inbox("192.168.1.1")
    inbox.datagram_received(b"from the gateway", ("192.168.1.1", 5351))
    inbox.datagram_received(b"from a neighbour", ("192.168.1.66", 5351))
    inbox.datagram_received(b"x" * 5000, ("192.168.1.1", 5351))
    assert inbox.queue.qsize() == 1 and inbox.queue.get_nowait() == b"from the gateway"


def test_unknown_protocols_are_refused():
    with pytest.raises(ValueError, match="unknown port mapping"):
        PortMapper("192.168.1.1", "192.168.1.2", 4001, protocols=("smoke-signals",))


def test_pcp_is_tried_first_and_renew_and_delete_keep_the_nonce():
    asyncio.run(_test_pcp_is_tried_first_and_renew_and_delete_keep_the_nonce())


def test_a_natpmp_router_is_used_after_pcp_unsupported_version():
    asyncio.run(_test_a_natpmp_router_is_used_after_pcp_unsupported_version())


def test_junk_before_the_answer_is_skipped():
    asyncio.run(_test_junk_before_the_answer_is_skipped())


def test_junk_only_or_silence_fails_clearly_within_the_budget():
    asyncio.run(_test_junk_only_or_silence_fails_clearly_within_the_budget())
