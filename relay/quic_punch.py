"""DCUtR over QUIC: the UDP half of a hole punch (the libp2p DCUtR spec's QUIC variant; ADR 0228).

A NAT maps a UDP socket's flows to one public port only while the node keeps using that socket, so
the QUIC punch goes through the Host's QUIC listener, the socket every QUIC dial leaves from:
``connect_public(addr)`` makes a QUIC connection from it to a public peer (a relay) and learns,
through identify, the ``/udp/P/quic-v1`` address the NAT maps it to; ``own_addrs`` (those over live
connections) is what CONNECT offers beside the TCP addresses. After the exchange the roles are the
spec's. The DCUtR responder, which acts the moment SYNC arrives, is the QUIC client (``dial``): it
dials every offered QUIC address from the listener and dials again after ``ANSWER_S`` without an
answer (its first Initials may die in the peer's NAT, which has sent nothing to us yet), at most
``MAX_DIALS`` times per address, until a handshake completes or the punch window ends. The
initiator, at RTT/2, is the QUIC server (``accept``): it sends ``RANDOM_BYTES`` random bytes to each
offered address at random 10-200 ms intervals (at most ``MAX_PACKETS`` per address), which opens
its NAT to the client's Initials, and waits for the Host to register the peer's inbound QUIC
connection. Both stop on success or at the deadline.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.multiaddr import Multiaddr

from .ipv6_addrs import global_ipv6
from .punch_io import no_path, observed_addr

ANSWER_S = 0.5          # a QUIC dial without an answer this long is made again (fresh Initials)
MAX_DIALS = 16          # QUIC dials per offered address and punch
RANDOM_BYTES = 64       # a NAT-opening datagram (too short to be taken for a QUIC Initial)
SPRAY_INTERVAL_S = (0.01, 0.2)   # the spec's random interval between those datagrams
MAX_PACKETS = 64        # NAT-opening datagrams per offered address and punch
POLL_S = 0.02
PUNCH_ERRORS = (ProtocolError, ConnectionError, TimeoutError, OSError, DialError, asyncio.IncompleteReadError)
log = logging.getLogger(__name__)
T = TypeVar("T")


async def first_success(attempts: Sequence[Awaitable[T]], what: str) -> T:
    """The result of the first of ``attempts`` to succeed; the others are cancelled (one that has
    already finished keeps its result: a connection it made stays registered with the Host).
    ConnectionError naming every failure when none succeeds."""
    tasks = [asyncio.ensure_future(a) for a in attempts]
    errors: list[str] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            try:
                return await next_done
            except PUNCH_ERRORS as exc:
                errors.append(repr(exc))
        raise no_path(what, errors, "nothing to try")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class QuicPunch:
    def __init__(self, host: Host, *, rng: random.Random | None = None) -> None:
        self.host = host
        self.observed: dict[str, Multiaddr] = {}   # public peer -> how it sees our QUIC listener
        self.packets_sent = 0                      # NAT-opening datagrams, all punches together
        self._public: dict[str, Connection] = {}   # QUIC connections to public peers
        self._rng = rng or random.Random()

    def enabled(self, ip: str) -> bool:
        """Whether a QUIC listener can punch toward ``ip``'s family."""
        return self.host.quic_listener_for(ip) is not None

    # ---- address discovery
    async def connect_public(self, addr: str | Multiaddr) -> Multiaddr | None:
        """Connect over QUIC to the public peer at ``addr`` (``.../quic-v1/p2p/<id>``) from our
        listener and return the QUIC address it observed us at (None if it named none)."""
        addr = Multiaddr.parse(addr)
        peer = addr.peer_id
        if peer is None or not addr.is_quic:
            raise ValueError(f"need a /quic-v1/p2p/<peer id> address: {addr}")
        if self.connected_public(peer):
            return self.observed.get(peer)
        conn = await self.host.dial_quic(peer, addr.without_peer_id(), answer_timeout=self.host.limits.connect_timeout)
        self._public[peer] = conn
        async with asyncio.timeout(self.host.limits.identify_timeout):
            observed = await observed_addr(conn)
        if observed is not None and observed.is_quic:
            self.observed[peer] = observed
            return observed
        return None

    def public_addrs(self, peer: str) -> list[Multiaddr]:
        """``peer``'s QUIC addresses in the peer book (identify fills it) that a listener reaches."""
        return [a for a in self.host.peerbook.addrs(peer) if a.is_quic and self.enabled(a.quic_endpoint()[0])]

    def connected_public(self, peer: str) -> bool:
        live = self._public.get(peer)
        return live is not None and not live.closed

    def own_addrs(self) -> list[Multiaddr]:
        """Our listener as public peers see it over live QUIC connections (a mapping whose
        connection is gone may have expired in the NAT)."""
        out: list[Multiaddr] = []
        for peer, addr in self.observed.items():
            if self.connected_public(peer) and addr not in out:
                out.append(addr)
        return out

    def ipv6_addrs(self) -> list[Multiaddr]:
        """Our QUIC listener on this host's global IPv6 addresses, which no NAT rewrites (behind a
        stateful firewall the punch opens like a port-restricted NAT; ADR 0224)."""
        out: list[Multiaddr] = []
        for ip in global_ipv6():
            endpoint = self.host.quic_listener_for(ip)
            bound = endpoint.sockname if endpoint is not None else None
            if bound is not None and bound[0] in ("::", ip):
                out.append(Multiaddr.from_quic(ip, bound[1]))
        return out

    # ---- the punch: client side (the DCUtR responder)
    async def dial(self, addrs: Sequence[Multiaddr], peer: str, deadline: float) -> Connection:
        """A QUIC connection to ``peer`` at one of ``addrs``, dialed again and again until
        ``deadline``."""
        targets = [a for a in addrs if a.is_quic and self.enabled(a.quic_endpoint()[0])]
        return await first_success([self._dial_until(a, peer, deadline) for a in targets], "QUIC punch")

    async def _dial_until(self, addr: Multiaddr, peer: str, deadline: float) -> Connection:
        for _ in range(MAX_DIALS):
            started = time.monotonic()
            left = deadline - started
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    return await self.host.dial_quic(peer, addr, answer_timeout=min(ANSWER_S, left))
            except ConnectionError as exc:   # no answer yet (or refused): dial again, not faster than ANSWER_S
                log.debug("QUIC punch dial to %s: %s", addr, exc)
                await asyncio.sleep(max(0.0, min(ANSWER_S - (time.monotonic() - started),
                                                 deadline - time.monotonic())))
        raise TimeoutError(f"no QUIC answer from {addr} in the punch window")

    # ---- the punch: server side (the DCUtR initiator)
    async def accept(self, addrs: Sequence[Multiaddr], peer: str, deadline: float) -> Connection:
        """Open our NAT toward ``addrs`` with random datagrams and return the QUIC connection
        ``peer`` makes to us (any live inbound one) before ``deadline``."""
        targets = [a.quic_endpoint() for a in addrs if a.is_quic and self.enabled(a.quic_endpoint()[0])]
        if not targets:
            raise ConnectionError("no QUIC address to punch toward")
        spray = asyncio.ensure_future(self._spray(targets, deadline))
        try:
            while (conn := self._inbound_from(peer)) is None:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"no QUIC connection from {peer} in the punch window")
                await asyncio.sleep(POLL_S)
            return conn
        finally:
            spray.cancel()
            with contextlib.suppress(BaseException):
                await spray

    def _inbound_from(self, peer: str) -> Connection | None:
        return next((c for c in self.host.connections(peer)
                     if c.quic and c.direction == "inbound" and not c.closed and not c.bulk), None)

    async def _spray(self, targets: list[tuple[str, int]], deadline: float) -> None:
        for _ in range(MAX_PACKETS):
            if time.monotonic() >= deadline:
                return
            for ip, port in targets:
                endpoint = self.host.quic_listener_for(ip)
                if endpoint is None:
                    return
                endpoint.send_datagram(os.urandom(RANDOM_BYTES), (ip, port))
                self.packets_sent += 1
            await asyncio.sleep(self._rng.uniform(*SPRAY_INTERVAL_S))
