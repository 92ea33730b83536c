"""The dial policy for a peer that may sit behind NAT: direct, else relayed and then hole punched.

``dial_peer`` tries the peer's direct addresses (each bounded by ``direct_timeout``), then a
relayed connection through the relay client, then a DCUtR upgrade of it (``HolePuncher``). When
the punch works the relayed connection is retired after ``retire_after`` seconds (streams already
open on it get that long to finish), after which the Host's shared connection to the peer is the
direct one. Where the punch fails the peer stays relayed. Returns a ``PeerPath`` saying which way
the peer is reached.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.multiaddr import Multiaddr
from node.p2p.secure_conn import TcpConnection

from .client import RelayClient
from .holepunch import HolePuncher

DIRECT_TIMEOUT = 3.0
RETIRE_AFTER = 5.0
log = logging.getLogger(__name__)


@dataclass
class PeerPath:
    conn: Connection
    kind: str                              # "direct" | "punched" | "relayed"
    retiring: asyncio.Task | None = None   # closes the relayed connection a punch replaced (cancel to keep it)


async def _retire(conn: Connection, delay: float) -> None:
    await asyncio.sleep(delay)
    try:
        await conn.close()
    except (ConnectionError, ProtocolError, OSError) as exc:
        log.debug("retiring the relayed connection to %s: %s", conn.remote_peer, exc)


async def _dial_direct(host: Host, peer_id: str, addrs, timeout: float) -> Connection | None:
    """A live direct connection to ``peer_id``, or a new one to the first of ``addrs`` that answers
    (dialed here because ``Host.connect`` would reuse a relayed shared connection)."""
    for conn in host.connections(peer_id):
        if not conn.bulk and not conn.closed and conn.remote_addr is not None:
            return conn
    loop = asyncio.get_running_loop()
    for addr in addrs:
        addr = Multiaddr.parse(addr)
        if addr.is_relayed:
            continue
        try:
            ip, port = addr.tcp_endpoint()
            async with asyncio.timeout(timeout):
                _transport, tcp = await loop.create_connection(TcpConnection, ip, port)
            return await host.upgrade(tcp, is_initiator=True, expected_peer=peer_id)
        except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
            log.debug("direct dial %s failed: %s", addr, exc)
    return None


async def dial_peer(host: Host, client: RelayClient, puncher: HolePuncher | None, peer_id: str,
                    direct_addrs, circuit_addrs, *, direct_timeout: float = DIRECT_TIMEOUT,
                    retire_after: float = RETIRE_AFTER) -> PeerPath:
    """Reach ``peer_id``: directly, by a punched connection, or relayed. Raises DialError when no
    relay reaches it either."""
    conn = await _dial_direct(host, peer_id, direct_addrs, direct_timeout)
    if conn is not None:
        return PeerPath(conn, "direct")
    if not circuit_addrs:
        raise DialError(f"could not dial {peer_id} directly and it has no relayed address")
    relayed = await client.dial(list(circuit_addrs))
    if puncher is None or not puncher.own_addrs():
        return PeerPath(relayed, "relayed")
    direct = await puncher.direct_connect(relayed)
    if direct is None:
        return PeerPath(relayed, "relayed")
    retiring = asyncio.get_running_loop().create_task(_retire(relayed, retire_after))
    return PeerPath(direct, "punched", retiring)

