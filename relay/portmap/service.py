"""Port mapping as a node service (ADR 0221; installed through ``node.plugins``, named in
cli/assembly.py): with ``[nat] port_mapping`` (default on) and a listen address that is not
loopback, the node asks its default route's gateway for a mapping of its TCP listen port (PCP,
then NAT-PMP, then UPnP-IGD, 2 s in all, in the background: start is not delayed) and
advertises ``/ip4/<external>/tcp/<port>`` in identify, so peers that learn it dial the node
directly. Where the relay client hole punches, the punch port is mapped too and the mapping
offered first in DCUtR's CONNECT. Mappings are renewed at half their lifetime and deleted when
the node stops; ``/status`` shows them under "port_mapping"."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import TYPE_CHECKING

from node.p2p.multiaddr import Multiaddr

from .gateway import default_gateway, local_address
from .keeper import MappingKeeper
from .mapper import Mapping, PortMapper

if TYPE_CHECKING:
    from node.runtime import Node

PUNCH_PORT_POLL_S = 0.5
log = logging.getLogger(__name__)


def listen_port(addrs: list[str]) -> int | None:
    """The TCP port of the first bound IPv4 address that is not loopback (None: nothing to map)."""
    for text in addrs:
        addr = Multiaddr.parse(text)
        if addr.is_quic:   # a QUIC (UDP) listener: the mapping asked for is TCP
            continue
        host, port = addr.tcp_endpoint()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:   # a DNS name: not an address of ours to map
            continue
        if address.version == 4 and not address.is_loopback:
            return port
    return None


class PortMapService:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.enabled: bool = node.config["nat"]["port_mapping"]
        self.keepers: dict[str, MappingKeeper] = {}   # "listen" / "punch" -> its keeper
        self.state = "off" if not self.enabled else "starting"
        node.status.add_section("port_mapping", self.status)

    def status(self) -> dict:
        return {"state": self.state, "mappings": {
            name: {"addr": k.mapping.multiaddr, "protocol": k.mapping.protocol, "lifetime_s": k.mapping.lifetime}
            if k.mapping else {"addr": None, "last_error": k.last_error} for name, k in self.keepers.items()}}

    def advertised(self) -> list[str]:
        keeper = self.keepers.get("listen")
        return [keeper.mapping.multiaddr] if keeper is not None and keeper.mapping is not None else []

    async def run(self) -> None:
        if not self.enabled:
            return
        await self.node.ready.wait()
        port = listen_port(self.node.host.listen_addrs)
        gateway = await asyncio.to_thread(default_gateway) if port is not None else None
        if port is None or gateway is None:
            self.state = "no listen address to map" if port is None else "no default gateway"
            log.info("port mapping: not tried (%s)", self.state)
            return
        try:
            local = await asyncio.to_thread(local_address, gateway)
        except OSError as exc:   # no route to it after all
            self.state = f"gateway {gateway} unreachable: {exc}"
            log.info("port mapping: not tried (%s)", self.state)
            return
        self.state = f"gateway {gateway}"
        self.keepers["listen"] = MappingKeeper(PortMapper(gateway, local, port))
        self.node.host.advertise_extra_addrs(self.advertised, source="port_mapping")
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.keepers["listen"].run())
                tasks.create_task(self._map_punch_port(gateway, local))
        finally:
            self.node.host.advertise_extra_addrs(None, source="port_mapping")

    async def _map_punch_port(self, gateway: str, local: str) -> None:
        client = self.node.relay_client
        punching = getattr(client, "punching", None)
        if punching is None:
            return
        puncher = punching.puncher
        while not puncher.port:   # picked when the relay client prepares hole punching
            await asyncio.sleep(PUNCH_PORT_POLL_S)

        def offer(mapping: Mapping | None) -> None:
            puncher.mapped = [Multiaddr.parse(mapping.multiaddr)] if mapping else []
        self.keepers["punch"] = MappingKeeper(PortMapper(gateway, local, puncher.port), offer)
        await self.keepers["punch"].run()
