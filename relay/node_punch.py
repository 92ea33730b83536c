"""Hole punching for a node behind NAT (ADR 0073): the relay node client starts it when the node has
``[relay] relays`` and ``[relay] hole_punch`` is on.

``prepare()`` picks the punch port and connects to every configured relay from it
(``HolePuncher.connect_public``) before any reservation, so each relay observes the NAT's mapping
of that port and the reservation shares that connection; a relay that listens on QUIC is connected
over QUIC as well, from the node's QUIC listener, whose mapping a QUIC punch offers (ADR 0228).
``dial_circuit`` is the Host's circuit dialer: the Host has already tried the peer's direct
addresses; this dials through a relay and runs the DCUtR punch over the relayed connection,
waiting up to ``punch_wait`` seconds for it, so
``host.open_stream(peer, proto)`` gets the punched connection where both NATs keep ports, and the
relayed one otherwise (a punch still going on then finishes in the background and, if it works,
retires the relayed connection). As the DCUtR spec says, the inbound side of the circuit sends
CONNECT: ``run()`` starts the punch on each inbound relayed connection at once (the spec's "B",
``upgrade_inbound``), and the dialer waits ``upgrade_relayed``'s ``peer_first`` for it before
punching itself (a peer that does not punch); ``run()`` also reconnects to relays from the punch
port when those connections drop, and punches again, with backoff, each peer a dial left relayed
(``relay/repunch.py``: 30 s after the failure, doubling to 15 min; docs/adr/0225). Bulk connections
are not punched by the dialer (each would need a punch of its own); the dialed side, which cannot tell
them from shared ones, may punch around one and retire it: the all-reduce link on it moves to a new
connection (docs/adr/0233).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.multiaddr import Multiaddr

from .client import RelayClient
from .holepunch import HolePuncher
from .holepunch_dial import upgrade_relayed
from .holepunch_inbound import upgrade_inbound
from .repunch import RepunchSchedule

PUNCH_WAIT_S = 2.0       # a dial waits this long for the punch before it settles for the relay
INBOUND_DEFER_S = 0.0    # the inbound side of a circuit starts DCUtR at once (the spec's B; ADR 0204)
RECONNECT_S = 5.0        # how often lost punch-port connections to relays are re-made
CONNECT_TIMEOUT_S = 10.0
log = logging.getLogger(__name__)


class NodeHolePunching:
    def __init__(self, host: Host, client: RelayClient, relays: list[str], *, punch_wait: float = PUNCH_WAIT_S,
                 inbound_defer: float = INBOUND_DEFER_S, punch_port: int = 0) -> None:
        self.host = host
        self.client = client
        self.relays = [Multiaddr.parse(r) for r in relays]
        self.punch_wait = punch_wait
        self.inbound_defer = inbound_defer
        self.puncher = HolePuncher(host, punch_port)
        self.punched = 0    # dials that ended on a punched connection
        self.relayed = 0    # dials that stayed relayed
        self.repunched = 0  # relayed peers a later punch reached directly
        self.repunch = RepunchSchedule()
        self._relayed_conns: dict[str, Connection] = {}   # peer -> the relayed connection a retry upgrades
        self._background: set[asyncio.Task] = set()

    def status(self) -> dict:
        return {"punch_port": self.puncher.port, "observed": [str(a) for a in self.puncher.own_addrs()],
                "dials_punched": self.punched, "dials_relayed": self.relayed, "repunched": self.repunched,
                "repunch_pending": len(self.repunch),
                "direct_peers": sorted(p for p, c in self.puncher.direct.items() if not c.closed)}

    async def prepare(self) -> None:
        """Pick the punch port and learn its public mapping from the relays (failures are logged)."""
        self.puncher.start()
        await self._connect_relays()

    async def _connect_relays(self) -> None:
        missing = [r for r in self.relays if not r.is_quic
                   and (r.peer_id is None or not self.puncher.connected_public(r.peer_id))]
        results = await asyncio.gather(*(self._connect_public(r) for r in missing), return_exceptions=True)
        for relay, result in zip(missing, results):
            if isinstance(result, BaseException):
                if not isinstance(result, (ConnectionError, ProtocolError, TimeoutError, OSError, ValueError)):
                    raise result
                log.info("connecting to relay %s from the punch port failed: %s", relay, result)
        await self._connect_relays_quic()

    async def _connect_relays_quic(self) -> None:
        """Connect over QUIC to every relay that listens on QUIC, so it observes our QUIC listener's
        mapping (what a QUIC punch offers, ADR 0228); failures are logged."""
        quic = self.puncher.quic
        for relay in self.relays:
            peer = relay.peer_id
            if peer is None or quic.connected_public(peer):
                continue
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    addrs = [relay] if relay.is_quic else quic.public_addrs(peer)
                    if addrs:
                        await quic.connect_public(addrs[0].with_peer_id(peer))
            except (ConnectionError, ProtocolError, TimeoutError, OSError, ValueError) as exc:
                log.info("connecting to relay %s over QUIC failed: %s", relay, exc)

    async def _connect_public(self, relay: Multiaddr) -> Multiaddr | None:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await self.puncher.connect_public(relay)

    async def dial_circuit(self, maddr: Multiaddr, bulk: bool) -> Connection:
        """The Host's circuit dialer: a relayed connection, upgraded by a hole punch if one works."""
        relayed = await self.client.dial([str(maddr)], bulk=bulk)
        if bulk:
            return relayed
        path = await upgrade_relayed(self.puncher, relayed, punch_wait=self.punch_wait)
        for task in (path.retiring, path.upgrading):
            if task is not None:
                self._keep(task)
        if path.kind == "punched":
            self.punched += 1
        else:
            self.relayed += 1
            if path.upgrading is None:
                self._punch_failed(relayed)
            else:   # the punch goes on in the background: schedule a retry only if it fails
                path.upgrading.add_done_callback(functools.partial(self._punch_ended, relayed))
        if path.conn.closed:
            raise DialError(f"the connection to {relayed.remote_peer} closed during the hole punch")
        return path.conn

    def _keep(self, task: asyncio.Task) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _punch_failed(self, relayed: Connection) -> None:
        """Schedule a retry over ``relayed`` (kept while the schedule holds its peer)."""
        self._relayed_conns[relayed.remote_peer] = relayed
        self.repunch.failed(relayed.remote_peer, time.monotonic())

    def _punch_ended(self, relayed: Connection, task: asyncio.Task) -> None:
        direct = None if task.cancelled() or task.exception() is not None else task.result()
        if direct is None:
            self._punch_failed(relayed)

    def _reached_directly(self, peer: str) -> bool:
        return any(not c.closed and self.client.pipe_for(c) is None for c in self.host.connections(peer))

    def _repunch_due(self) -> None:
        """Start a punch for every relayed peer whose retry is due (forget those reached otherwise);
        drop the relayed connections of peers the schedule no longer holds."""
        for peer in [p for p in self._relayed_conns if p not in self.repunch]:
            del self._relayed_conns[peer]
        for peer in self.repunch.due(time.monotonic()):
            relayed = self._relayed_conns.get(peer)
            if relayed is None or relayed.closed or self._reached_directly(peer):
                self.repunch.forget(peer)
                self._relayed_conns.pop(peer, None)
                continue
            self._keep(asyncio.ensure_future(self._repunch_one(peer, relayed)))

    async def _repunch_one(self, peer: str, relayed: Connection) -> None:
        try:
            path = await upgrade_relayed(self.puncher, relayed, punch_wait=None)
        except Exception as exc:  # a failed retry is a failed punch: wait longer, try again
            log.info("punching %s again failed: %s", peer, exc)
            path = None
        if path is not None and path.kind == "punched":
            if path.retiring is not None:
                self._keep(path.retiring)
            self.repunched += 1
            self.repunch.succeeded(peer)
            self._relayed_conns.pop(peer, None)
            log.info("relayed peer %s reached directly by a later punch", peer)
        else:
            self._punch_failed(relayed)

    async def run(self) -> None:
        """Punch inbound relayed connections, keep the punch-port connections and punch relayed peers
        again when their retry is due; until cancelled."""
        inbound = asyncio.ensure_future(upgrade_inbound(self.puncher, self.client, defer=self.inbound_defer))
        try:
            while True:
                await asyncio.sleep(RECONNECT_S)
                await self._connect_relays()
                self._repunch_due()
        finally:
            inbound.cancel()
            for task in self._background:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(inbound, *self._background, return_exceptions=True)
                await self.puncher.close()
