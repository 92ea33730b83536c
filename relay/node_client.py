"""The relay client as a node service, whatever the node's roles (installed through ``node.plugins``; cli/assembly.py
names it; the runtime builds and starts it; ADR 0062).

Every node dials relayed addresses (``.../p2p/R/p2p-circuit/p2p/T``, from the peer book) for its
Host through this client (the circuit dialer; its relay ranking tries the least loaded relay first),
so ``host.open_stream(peer, proto)`` reaches a NAT'd peer; ``learn_peer`` puts a peer's relayed
addresses from its ledger record into the peer book. A node configured with ``[relay] relays`` also
holds reservations on ``[relay] reservations`` (2) of them, the least loaded (then the nearest by
round-trip time), refreshed before expiry, replaced when a relay dies and moved when another is much
less loaded (``RelayClient.maintain``, ADR 0227): always when ``[relay] reserve`` is true, else only while
AutoNAT through the relays says this node is private (re-assessed every ``REASSESS_S``). Its
relayed addresses are shown in ``/status`` ("relay_client") and contributed to its ledger record
(``relay_addrs``) whenever they change; the ledger gateway's record publisher merges them with the
other roles' fields and restores them when another writer replaced the record. Since each bulk
circuit it opens is also a connection to its relay, such a node's per-peer connection limit is
raised to what a relay allows. With ``[relay] hole_punch`` (default on) such a node also hole
punches (``relay/node_punch.py``): it connects to its relays from a punch port before reserving, its
Host's circuit dialer upgrades relayed connections by DCUtR where the NATs allow it, and inbound
relayed connections are punched from its side too, so a peer reached by a relayed address ends up on
a direct connection when both NATs keep ports.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from node.p2p.multiaddr import Multiaddr

from . import reachability
from .client import RelayClient
from .node_punch import NodeHolePunching
from .role import fit_connection_limit
from .service import RelayLimits

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

PUBLISH_POLL_S = 0.5     # how often the relayed addresses are compared with the published ones
PUBLISH_RETRY_S = 5.0
REASSESS_S = 300.0       # how often a node that found itself reachable asks again
RESTART_S = 5.0          # pause before restarting reservations after an unexpected failure


class RelayNodeClient:
    def __init__(self, node: Node, *, assess=reachability.assess) -> None:
        settings = node.config["relay"]
        self.node = node
        self.relays: list[str] = list(settings["relays"])
        self._relay_ids = [Multiaddr.parse(r).peer_id or r for r in self.relays]
        self.always_reserve: bool = settings["reserve"]
        self.client = RelayClient(node.host, chain_id=node.config.get("consensus", "chain_id"),
                                  max_price_per_mib=settings["max_price_per_mib"], want=settings["reservations"])
        self.ledger = node.ledger if node.ledger.available else None
        self.punching = (NodeHolePunching(node.host, self.client, self.relays)
                         if self.relays and settings["hole_punch"] else None)
        self.reachability: reachability.Reachability | None = None
        self.published: list[str] | None = None   # relay_addrs the ledger record is known to hold
        self.last_error: str | None = None
        self._assess = assess
        if self.relays:  # NAT'd: as many bulk circuits (connections to a relay) as a relay allows
            fit_connection_limit(node.host, RelayLimits.max_circuits_per_peer)
        node.status.add_section("relay_client", self.status)
        node.metrics.gauge("dekube_relay_client_reservations", "Relays this node holds a reservation on.") \
            .set_function(lambda: len(self.client.reservations))

    def status(self) -> dict:
        now = time.time()
        return {
            "relays": self.relays,
            "relay_load": {relay: self.client.loads.utilization(relay) for relay in self._relay_ids},
            "reserving": self._wants_reservations(),
            "reachability": self.reachability.value if self.reachability is not None else None,
            "reservations": {relay: {"expires_in_s": round(r.expire - now, 1), "rtt_ms": round(r.rtt * 1000, 2)}
                             for relay, r in self.client.reservations.items()},
            "relayed_addrs": self.client.relayed_addrs,
            "published_relay_addrs": self.published,
            "hole_punch": self.punching.status() if self.punching is not None else None,
            "ledger": None if self.ledger is None else self.ledger.url,
            "last_error": self.last_error,
        }

    def _wants_reservations(self) -> bool:
        return bool(self.relays) and (self.always_reserve or self.reachability == reachability.Reachability.PRIVATE)

    async def run(self) -> None:
        """Dial circuits for the Host; with ``[relay] relays``, also reserve and publish."""
        await self.node.ready.wait()
        self.client.start()
        if self.punching is not None:
            self.node.host.register_circuit_dialer(self.punching.dial_circuit)
        else:
            self.node.host.register_circuit_dialer(lambda maddr, bulk: self.client.dial([str(maddr)], bulk=bulk))
        self.node.host.register_relay_ranking(self.client.rank_circuit_addrs)
        try:
            if not self.relays:
                await asyncio.Event().wait()
            self.node.host.advertise_extra_addrs(lambda: self.client.relayed_addrs)  # identify shows them too
            if self.ledger is not None:
                await self._first_publish()  # registered before the relays look us up, if the ledger answers
            if self.punching is not None:
                await self.punching.prepare()  # the relays see our punch port's mapping before we reserve
            async with asyncio.TaskGroup() as tasks:
                if self.punching is not None:
                    tasks.create_task(self.punching.run())
                tasks.create_task(self._reserve_when_needed())
                if self.ledger is not None:
                    tasks.create_task(self._keep_published())
        finally:
            self.node.host.register_circuit_dialer(None)
            self.node.host.register_relay_ranking(None)

    # ---- reservations
    async def _reserve_when_needed(self) -> None:
        while not self.always_reserve:
            try:
                self.reachability = await self._assess(self.node.host, self.relays)
            except Exception as exc:  # no relay answering is a verdict of UNKNOWN, not a failure
                log.info("reachability check failed: %s", exc)
                self.reachability = reachability.Reachability.UNKNOWN
            log.info("reachability: %s", self.reachability.value)
            if self.reachability == reachability.Reachability.PRIVATE:
                break
            await asyncio.sleep(REASSESS_S)
        while True:
            try:
                await self.client.maintain(self.relays)
            except Exception as exc:  # a relay answering junk must not stop the node: start over
                self.last_error = f"keeping reservations: {type(exc).__name__}: {exc}"
                log.exception("relay client failed; restarting in %s s", RESTART_S)
                await asyncio.sleep(RESTART_S)

    # ---- the ledger record
    async def _keep_published(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_POLL_S)
            current = self.client.relayed_addrs
            if current != self.published:
                if not await self._publish(current):
                    await asyncio.sleep(PUBLISH_RETRY_S)

    async def _first_publish(self) -> None:
        await self._publish(self.client.relayed_addrs)  # on failure _keep_published retries

    async def _publish(self, relay_addrs: list[str]) -> bool:
        """Make the ledger record carry ``relay_addrs``; False (and ``last_error``) on failure."""
        ledger = self.ledger
        assert ledger is not None   # called only with a ledger (run, _keep_published)
        ledger.record.contribute("relay_client", roles={r.name for r in self.node.roles},
                                 listen_addrs=self.node.host.listen_addrs, relay_addrs=relay_addrs)
        try:
            sent = await ledger.record.sync()
        except Exception as exc:  # a ledger that is down, refuses or answers junk must not stop the node
            self.last_error = f"publishing the node record: {type(exc).__name__}: {exc}"
            log.warning("%s", self.last_error)
            return False
        if sent:
            log.info("ledger record updated", extra={"relay_addrs": " ".join(relay_addrs)})
        self.published = relay_addrs
        self.last_error = None
        return True

    # ---- reaching others
    async def learn_peer(self, peer_id: str) -> list[str]:
        """Add the relayed addresses of ``peer_id``'s ledger record to the peer book; returns them."""
        if self.ledger is None:
            return []
        record = await self.ledger.node_info(peer_id)
        addrs = list(record.get("relay_addrs", [])) if record else []
        with contextlib.suppress(ValueError):  # a record naming other peers' addresses is ignored
            self.node.host.peerbook.add_addrs(peer_id, addrs)
        return addrs
