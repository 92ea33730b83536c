"""Birthday-paradox probing for a punch where exactly one side's NAT maps every flow to a random
port (a random symmetric NAT; ADR 0204), as Tailscale does it.

The random side ("spray") opens ``SPRAY_SOCKETS`` connections to the peer's punch address, each
from its own local port, so its NAT holds that many random public ports towards the peer; the
other side ("probe") dials ``PROBE_PORTS`` random ports of the random side's public IP from its
punch port, each SYN opening its own NAT's filter towards that port. Any port in both sets joins a
socket on each side (TCP simultaneous open): with 256 x 256 over ~64,000 ports, about 64% of
exchanges. Bounded: the socket and port counts, a start spread over ``SPREAD_S`` (the initial SYN
rate), a redial of a refused socket no sooner than ``RETRY_S`` later, all ending at the punch
window's deadline or at the first connected socket (the caller cancels the rest). When both sides
are random, probing is pointless and neither side does it.
"""
from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Coroutine
from typing import Any

from node.p2p.multiaddr import Multiaddr

from .punch_io import connect_until

SPRAY_SOCKETS = 256
PROBE_PORTS = 256
SPREAD_S = 0.5
RETRY_S = 0.25
PORTS = (1024, 65535)


async def _dial(local_port: int, ip: str, port: int, delay: float, deadline: float) -> socket.socket:
    """Connect from ``local_port`` (0: one ephemeral port, kept across redials, so the NAT's mapping
    stays the same flow) to ``ip:port`` until ``deadline``, starting after ``delay``."""
    await asyncio.sleep(delay)
    return await connect_until(ip, port, local_port, deadline, RETRY_S)


def birthday_dials(addrs: tuple[Multiaddr, ...], punch_port: int, *, own_random: bool, peer_random: bool,
                   deadline: float, rng: random.Random | None = None,
                   ) -> list[Coroutine[Any, Any, socket.socket]]:
    """The extra dials of a punch: spray when our NAT is the random one, probe when the peer's is,
    nothing when both or neither are. Each returns a connected socket."""
    if own_random == peer_random or not addrs:
        return []
    ip, port = addrs[0].tcp_endpoint()
    if own_random:
        return [_dial(0, ip, port, i * SPREAD_S / SPRAY_SOCKETS, deadline) for i in range(SPRAY_SOCKETS)]
    rng = rng or random.SystemRandom()
    ports = rng.sample(range(PORTS[0], PORTS[1] + 1), PROBE_PORTS)
    return [_dial(punch_port, ip, p, i * SPREAD_S / PROBE_PORTS, deadline) for i, p in enumerate(ports)]
