"""The dial policy for a peer that may sit behind NAT: direct, else relayed and then hole punched.

``dial_peer`` tries the peer's direct addresses (each bounded by ``direct_timeout``), then a
relayed connection through the relay client, then a DCUtR upgrade of it (``upgrade_relayed``).
When the punch works the relayed connection is retired (``retire_relayed``: GoAway at once, so
the Host's next stream to the peer takes the direct connection; streams already open on it get
``retire_after`` seconds to finish). Where the punch fails the peer stays relayed. With
``punch_wait`` the caller waits at most that long for the punch: a punch still going on then
(one that will fail, typically, a symmetric NAT's SYNs vanishing for the whole punch window)
carries on in the background (``PeerPath.upgrading``) and the relayed connection is returned.
Returns a ``PeerPath`` saying which way the peer is reached.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from node.p2p.host import Connection, DialError, Host

from .client import RelayClient
from .holepunch import EXCHANGE_TIMEOUT, HolePuncher
from .holepunch_inbound import retire_relayed
from .reversal import dial_direct

DIRECT_TIMEOUT = 3.0
RETIRE_AFTER = 5.0
PEER_FIRST_S = 1.0   # how long the dialer waits for the dialed peer's DCUtR CONNECT before sending its own
log = logging.getLogger(__name__)


@dataclass
class PeerPath:
    conn: Connection
    kind: str                              # "direct" | "punched" | "relayed"
    retiring: asyncio.Task | None = None   # retires the relayed connection a punch replaced
    upgrading: asyncio.Task | None = None  # a punch still going on (returns the direct connection or None)


async def dial_peer(host: Host, client: RelayClient, puncher: HolePuncher | None, peer_id: str,
                    direct_addrs, circuit_addrs, *, direct_timeout: float = DIRECT_TIMEOUT,
                    retire_after: float = RETIRE_AFTER, punch_wait: float | None = None) -> PeerPath:
    """Reach ``peer_id``: directly, by a punched connection, or relayed. Raises DialError when no
    relay reaches it either."""
    conn = await dial_direct(host, peer_id, direct_addrs, direct_timeout)
    if conn is not None:
        return PeerPath(conn, "direct")
    if not circuit_addrs:
        raise DialError(f"could not dial {peer_id} directly and it has no relayed address")
    relayed = await client.dial(list(circuit_addrs))
    return await upgrade_relayed(puncher, relayed, retire_after=retire_after, punch_wait=punch_wait)


async def upgrade_relayed(puncher: HolePuncher | None, relayed: Connection, *, retire_after: float = RETIRE_AFTER,
                          punch_wait: float | None = None, peer_first: float = PEER_FIRST_S) -> PeerPath:
    """Hole punch ``relayed`` (waiting at most ``punch_wait`` seconds, None: until it ends). As the
    DCUtR spec has it, the peer (the inbound side of the circuit) starts the exchange: we wait
    ``peer_first`` seconds for its CONNECT and start it ourselves only if none came (a peer that
    does not punch, ADR 0204)."""
    if puncher is None or not puncher.own_addrs():
        return PeerPath(relayed, "relayed")
    punch = asyncio.ensure_future(_punch(puncher, relayed, peer_first))
    done, _ = await asyncio.wait({punch}, timeout=punch_wait)
    if not done:
        return PeerPath(relayed, "relayed", upgrading=asyncio.ensure_future(_finish(punch, relayed, retire_after)))
    direct = punch.result()
    if direct is None:
        return PeerPath(relayed, "relayed")
    return PeerPath(direct, "punched", asyncio.ensure_future(retire_relayed(relayed, retire_after)))


async def _punch(puncher: HolePuncher, relayed: Connection, peer_first: float) -> Connection | None:
    peer = relayed.remote_peer
    direct = await puncher.peer_punch(peer, peer_first, puncher.attempts * (EXCHANGE_TIMEOUT + puncher.punch_window))
    if direct is not None or puncher.busy(peer) or relayed.closed:
        return direct
    return await puncher.direct_connect(relayed)


async def _finish(punch: asyncio.Task, relayed: Connection, retire_after: float) -> Connection | None:
    try:
        direct = await punch
    finally:
        punch.cancel()
    if direct is not None:
        await retire_relayed(relayed, retire_after)
    return direct
