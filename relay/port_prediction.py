"""Port prediction for a NAT that maps every new flow to the next port of a counter (a sequential
symmetric NAT; ADR 0204).

Such a NAT gives the punch port a new public port for every destination, so the mapping a relay
observed is not the one the peer's SYNs must reach; but the next flow through the router takes the
next port. Just before a DCUtR exchange, ``fresh_mapping`` opens one new connection to the relay
from an ephemeral port and reads, through identify, the port the NAT gave it: the counter's current
value. ``predicted_addrs`` then offers that address's next ``count`` ports beside the observed one;
the peer dials them all (each SYN also opens its own NAT's filter towards that port), and our punch
SYN, the next flow, leaves from one of them. It only runs when the NAT rewrote the punch port (an
observation whose port differs from the local one): a port-preserving NAT gets no extra SYNs.
Bounded: one probe connection per exchange (``PROBE_TIMEOUT_S``), ``PREDICT_PORTS`` addresses.
"""
from __future__ import annotations

import asyncio
import logging
import socket

from node.p2p.errors import ProtocolError
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from node.p2p.secure_conn import TcpConnection

from .punch_io import observed_addr

PREDICT_PORTS = 8
PROBE_TIMEOUT_S = 2.0
log = logging.getLogger(__name__)


def rewrites_ports(observed: Multiaddr, local_port: int) -> bool:
    """Whether the NAT gave the punch port another public port (prediction may help)."""
    try:
        return observed.tcp_endpoint()[1] != local_port
    except MultiaddrError:
        return False


def predicted_addrs(fresh: Multiaddr, count: int = PREDICT_PORTS) -> list[Multiaddr]:
    """The ``count`` addresses after ``fresh`` (the NAT's latest mapping): the next flows' ports."""
    ip, port = fresh.tcp_endpoint()
    proto = fresh.without_peer_id().parts[0][0]
    return [Multiaddr.parse(f"/{proto}/{ip}/tcp/{port + i}") for i in range(1, count + 1) if port + i < 65536]


async def fresh_mapping(host: Host, relay: Multiaddr) -> Multiaddr | None:
    """The address the relay at ``relay`` (``.../p2p/<id>``) observes a brand-new connection from us
    at; None when it cannot be learnt within PROBE_TIMEOUT_S."""
    peer = relay.peer_id
    conn = None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            ip, port = relay.tcp_endpoint()
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            loop = asyncio.get_running_loop()
            _transport, tcp = await loop.create_connection(TcpConnection, ip, port, family=family)
            conn = await host.upgrade(tcp, is_initiator=True, expected_peer=peer, bulk=True)
            return await observed_addr(conn)
    except (ConnectionError, ProtocolError, TimeoutError, OSError, MultiaddrError) as exc:
        log.debug("mapping probe to %s failed: %s", relay, exc)
        return None
    finally:
        if conn is not None:
            await conn.close()
