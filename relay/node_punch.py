"""Hole punching for a node behind NAT (ADR 0073): the relay node client starts it when the node has
``[relay] relays`` and ``[relay] hole_punch`` is on.

``prepare()`` picks the punch port and connects to every configured relay from it
(``HolePuncher.connect_public``) before any reservation, so each relay observes the NAT's mapping
of that port and the reservation shares that connection. ``dial_circuit`` is the Host's circuit
dialer: the Host has already tried the peer's direct addresses; this dials through a relay and
runs the DCUtR punch over the relayed connection, waiting up to ``punch_wait`` seconds for it, so
``host.open_stream(peer, proto)`` gets the punched connection where both NATs keep ports, and the
relayed one otherwise (a punch still going on then finishes in the background and, if it works,
retires the relayed connection). As the DCUtR spec says, the inbound side of the circuit sends
CONNECT: ``run()`` starts the punch on each inbound relayed connection at once (the spec's "B",
``upgrade_inbound``), and the dialer waits ``upgrade_relayed``'s ``peer_first`` for it before
punching itself (a peer that does not punch); ``run()`` also reconnects to relays from the punch
port when those connections drop. Bulk connections stay relayed (each would need a punch of its own).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.multiaddr import Multiaddr

from .client import RelayClient
from .holepunch import HolePuncher
from .holepunch_dial import upgrade_relayed
from .holepunch_inbound import upgrade_inbound

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
        self._background: set[asyncio.Task] = set()

    def status(self) -> dict:
        return {"punch_port": self.puncher.port, "observed": [str(a) for a in self.puncher.own_addrs()],
                "dials_punched": self.punched, "dials_relayed": self.relayed,
                "direct_peers": sorted(p for p, c in self.puncher.direct.items() if not c.closed)}

    async def prepare(self) -> None:
        """Pick the punch port and learn its public mapping from the relays (failures are logged)."""
        self.puncher.start()
        await self._connect_relays()

    async def _connect_relays(self) -> None:
        missing = [r for r in self.relays if r.peer_id is None or not self.puncher.connected_public(r.peer_id)]
        results = await asyncio.gather(*(self._connect_public(r) for r in missing), return_exceptions=True)
        for relay, result in zip(missing, results):
            if isinstance(result, BaseException):
                if not isinstance(result, (ConnectionError, ProtocolError, TimeoutError, OSError, ValueError)):
                    raise result
                log.info("connecting to relay %s from the punch port failed: %s", relay, result)

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
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        if path.kind == "punched":
            self.punched += 1
        else:
            self.relayed += 1
        if path.conn.closed:
            raise DialError(f"the connection to {relayed.remote_peer} closed during the hole punch")
        return path.conn

    async def run(self) -> None:
        """Punch inbound relayed connections and keep the punch-port connections; until cancelled."""
        inbound = asyncio.ensure_future(upgrade_inbound(self.puncher, self.client, defer=self.inbound_defer))
        try:
            while True:
                await asyncio.sleep(RECONNECT_S)
                await self._connect_relays()
        finally:
            inbound.cancel()
            for task in self._background:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(inbound, *self._background, return_exceptions=True)
