"""The DCUtR spec's "B" role: a NAT'd peer starts the hole punch on each inbound relayed connection.

``upgrade_inbound(puncher, client, defer=...)`` runs until cancelled. The relay client calls it back
(``RelayClient.on_inbound``) for every inbound relayed connection; after ``defer`` seconds, left to
a dialer that punches itself, it first dials the peer directly where identify says it is reachable
(connection reversal, ``relay/reversal.py``; private addresses only with ``reverse_private``, for
a LAN or loopback) and otherwise runs ``puncher.direct_connect`` on the connection, unless the
peer already has a direct connection or a punch with it is under way (one at a time per peer).
When either works the relayed connection is retired
(``retire_relayed``: no new streams, open ones get ``retire_after`` seconds to finish), so the
Host's shared connection to the peer becomes the direct one. The relayed connection may be one of
the peer's bulk connections (this side cannot tell): its all-reduce link moves to a new connection
on the GoAway and ends the old stream, which takes a frame, a dial and the bytes in flight over the
relay; ``RETIRE_AFTER_S`` leaves room for that on a slow home link (docs/adr/0233).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection

from .client import RelayClient
from .holepunch import HolePuncher
from .reversal import reverse

RETIRE_AFTER_S = 30.0   # the most open streams get; a retire ends as soon as they have finished
log = logging.getLogger(__name__)


def has_direct(host, peer: str) -> bool:
    """Whether ``host`` has an open direct (not relayed) connection to ``peer``."""
    return any(c.remote_addr is not None and not c.closed for c in host.connections(peer))


async def retire_relayed(conn: Connection, drain: float) -> None:
    """Close ``conn`` gracefully: GoAway at once (the Host's next stream goes to another connection
    to the peer), open streams get ``drain`` seconds to finish."""
    try:
        if conn.muxed is not None:
            await conn.muxed.close(drain_timeout=drain)
        await conn.close()
    except (ConnectionError, ProtocolError, OSError) as exc:
        log.debug("retiring the relayed connection to %s: %s", conn.remote_peer, exc)


async def _upgrade(puncher: HolePuncher, conn: Connection, defer: float, retire_after: float,
                   reverse_private: bool) -> None:
    await asyncio.sleep(defer)
    peer = conn.remote_peer
    if conn.closed or has_direct(puncher.host, peer) or puncher.busy(peer):
        return
    with puncher.reversing(peer):  # the dialer waits for us rather than punching meanwhile
        direct = await reverse(puncher.host, peer, private=reverse_private)
    if direct is None and not conn.closed and not has_direct(puncher.host, peer) and not puncher.busy(peer):
        log.debug("inbound relayed connection from %s: starting DCUtR", peer)
        direct = await puncher.direct_connect(conn)
    if direct is not None:
        await retire_relayed(conn, retire_after)


async def upgrade_inbound(puncher: HolePuncher, client: RelayClient, *, defer: float = 0.0,
                          retire_after: float = RETIRE_AFTER_S, reverse_private: bool = False) -> None:
    running: dict[str, asyncio.Task] = {}

    def on_inbound(conn: Connection) -> None:
        busy = running.get(conn.remote_peer)
        if busy is not None and not busy.done():
            return
        running[conn.remote_peer] = asyncio.ensure_future(_upgrade(puncher, conn, defer, retire_after, reverse_private))

    client.on_inbound(on_inbound)
    try:
        await asyncio.Event().wait()
    finally:
        client.on_inbound(None)
        for task in running.values():
            task.cancel()
        for task in running.values():
            with contextlib.suppress(BaseException):
                await task
