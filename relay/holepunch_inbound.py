"""The DCUtR spec's "B" role: a NAT'd peer starts the hole punch on each inbound relayed connection.

``upgrade_inbound(puncher, client)`` runs until cancelled. Every ``interval`` seconds it looks at
the relay client's circuits for inbound ones it has not seen, finds the relayed Connection riding
each, and runs ``puncher.direct_connect`` on it (in the background, one at a time per peer),
unless a direct connection to that peer is already open. The relay client has no callback for new
inbound circuits yet, hence the scan (ADR 0070); a punch costs at most ``interval`` of delay.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from node.p2p.host import Connection

from .client import RelayClient
from .holepunch import HolePuncher

SCAN_INTERVAL_S = 0.25
log = logging.getLogger(__name__)


def _relayed_connection(puncher: HolePuncher, peer: str, pipe) -> Connection | None:
    return next((c for c in puncher.host.connections(peer) if c.secure.tcp is pipe and not c.closed), None)


def _has_direct(puncher: HolePuncher, peer: str) -> bool:
    return any(c.remote_addr is not None and not c.closed for c in puncher.host.connections(peer))


async def upgrade_inbound(puncher: HolePuncher, client: RelayClient, interval: float = SCAN_INTERVAL_S) -> None:
    seen: set[bytes] = set()
    running: dict[str, asyncio.Task] = {}
    try:
        while True:
            seen &= set(client.circuits)  # forget circuits the client no longer keeps
            for session, (count, pipe) in list(client.circuits.items()):
                if session in seen or count.is_source or pipe.is_closed:
                    continue
                seen.add(session)
                peer = count.remote
                conn = _relayed_connection(puncher, peer, pipe)
                busy = running.get(peer)
                if conn is None or (busy is not None and not busy.done()) or _has_direct(puncher, peer):
                    continue
                log.debug("inbound relayed connection from %s: starting DCUtR", peer)
                running[peer] = asyncio.ensure_future(puncher.direct_connect(conn))
            for peer, task in list(running.items()):
                if task.done():
                    del running[peer]
            await asyncio.sleep(interval)
    finally:
        for task in running.values():
            task.cancel()
        for task in running.values():
            with contextlib.suppress(BaseException):
                await task
