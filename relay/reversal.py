"""Connection reversal: the side of a relayed connection that can reach the other directly does so
before any hole punch (the DCUtR spec's "unilateral connection upgrade"; ADR 0204).

When a peer dials us through a relay and identify tells us it listens on a publicly reachable
address (a public host, or a port its router maps), a plain TCP dial to that address gives a direct
connection at the cost of one round trip, where a punch costs an exchange over the relay and a
timed simultaneous open that a symmetric NAT on our side would defeat. ``reverse`` waits a bounded
time for the peer's identify, dials its direct addresses one by one (each bounded, at most
``MAX_ADDRS``) and returns the connection, or None when none answered: the caller then punches.
``dial_direct`` is the bounded direct dial shared with the dialer's policy (``holepunch_dial``).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Iterable

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, Host
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from node.p2p.secure_conn import TcpConnection

IDENTIFY_WAIT_S = 1.0    # how long the peer's identify (its listen addresses) is waited for
DIAL_TIMEOUT_S = 1.5     # per address
MAX_ADDRS = 4            # addresses tried per reversal
log = logging.getLogger(__name__)


def reachable_addrs(addrs: Iterable[Multiaddr], *, private: bool = False) -> list[Multiaddr]:
    """The TCP addresses among ``addrs`` worth a reversal dial: not relayed and, unless ``private``
    (a LAN or loopback deployment), with a globally routable IP; at most MAX_ADDRS."""
    out: list[Multiaddr] = []
    for addr in addrs:
        if addr.is_relayed:
            continue
        try:
            ip, _port = addr.tcp_endpoint()
            routable = ipaddress.ip_address(ip).is_global
        except (MultiaddrError, ValueError):
            continue
        if (routable or private) and addr not in out:
            out.append(addr)
    return out[:MAX_ADDRS]


async def dial_direct(host: Host, peer_id: str, addrs: Iterable[Multiaddr | str], timeout: float) -> Connection | None:
    """A live direct connection to ``peer_id``, or a new one to the first of ``addrs`` that answers
    (dialed here because ``Host.connect`` would reuse a relayed shared connection)."""
    for conn in host.connections(peer_id):
        if not conn.bulk and not conn.closed and conn.remote_addr is not None:
            return conn
    loop = asyncio.get_running_loop()
    for raw in addrs:
        addr = Multiaddr.parse(raw) if isinstance(raw, str) else raw
        if addr.is_relayed:
            continue
        try:
            ip, port = addr.tcp_endpoint()
            async with asyncio.timeout(timeout):
                _transport, tcp = await loop.create_connection(TcpConnection, ip, port)
            return await host.upgrade(tcp, is_initiator=True, expected_peer=peer_id)
        except (ConnectionError, ProtocolError, TimeoutError, OSError, MultiaddrError) as exc:
            log.debug("direct dial %s failed: %s", addr, exc)
    return None


async def reverse(host: Host, peer_id: str, *, private: bool = False,
                  identify_wait: float = IDENTIFY_WAIT_S, timeout: float = DIAL_TIMEOUT_S) -> Connection | None:
    """Dial ``peer_id`` directly at the reachable addresses its identify announced; None if it
    announced none within ``identify_wait`` seconds or none answered."""
    deadline = time.monotonic() + identify_wait
    while True:
        record = host.peerbook.get(peer_id)
        identified = record is not None and bool(record.protocols)
        addrs = reachable_addrs(host.peerbook.addrs(peer_id), private=private)
        if addrs or identified or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    if not addrs:
        return None
    conn = await dial_direct(host, peer_id, addrs, timeout)
    if conn is not None:
        log.info("connection reversal to %s: direct at %s", peer_id, conn.remote_addr)
    return conn
