"""Getting, renewing and deleting one TCP port mapping on the gateway: PCP first, then NAT-PMP (at
once when the router answers PCP with "unsupported version"), then UPnP-IGD, all within one
budget (``budget`` seconds in all; PCP and NAT-PMP a quarter each, UPnP the rest). The external
port asked for is the internal one. A `Mapping` remembers what renewing and deleting need (PCP's
nonce, UPnP's control URL)."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

from . import igd, natpmp, pcp
from .errors import PortMapError
from .transport import http, ssdp_search, udp_exchange

PROTOCOLS = ("pcp", "nat-pmp", "upnp")
LIFETIME_S = 7200            # what is asked for (RFC 6886 section 3.3 recommends two hours)
UPNP_CONFLICT = "718"        # ConflictInMappingEntry: another client holds the port


@dataclass(frozen=True)
class Mapping:
    protocol: str
    gateway: str
    external_ip: str
    external_port: int
    internal_port: int
    lifetime: int
    nonce: bytes = b""                    # PCP
    service: igd.Service | None = None   # UPnP

    @property
    def multiaddr(self) -> str:
        return f"/ip4/{self.external_ip}/tcp/{self.external_port}"


class PortMapper:
    """Maps TCP ``internal_port`` of ``local_ip`` (this host, as ``gateway`` sees it)."""

    def __init__(self, gateway: str, local_ip: str, internal_port: int, *, lifetime: int = LIFETIME_S,
                 budget: float = 2.0, protocols: tuple[str, ...] = PROTOCOLS, udp_port: int = pcp.PORT) -> None:
        unknown = set(protocols) - set(PROTOCOLS)
        if unknown:
            raise ValueError(f"unknown port mapping protocols: {sorted(unknown)}")
        self.gateway, self.local_ip, self.internal_port = gateway, local_ip, internal_port
        self.lifetime, self.budget, self.protocols = lifetime, budget, protocols
        self.udp_port = udp_port     # PCP and NAT-PMP share 5351 (another port only in tests)

    async def map(self) -> Mapping:
        """A new mapping by the first protocol that works; PortMapError naming every failure."""
        deadline = time.monotonic() + self.budget
        errors: list[str] = []
        for protocol in self.protocols:
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"{protocol}: out of time")
                continue
            share = left if protocol == "upnp" or protocol == self.protocols[-1] else min(left, self.budget / 4)
            try:
                return await self._map(protocol, share, None)
            except PortMapError as exc:
                errors.append(f"{protocol}: {exc}")
        raise PortMapError("; ".join(errors))

    async def renew(self, mapping: Mapping, timeout: float = 2.0) -> Mapping:
        """The same mapping with a fresh lifetime (same protocol, nonce and external port)."""
        return await self._map(mapping.protocol, timeout, mapping)

    async def delete(self, mapping: Mapping, timeout: float = 1.0) -> None:
        if mapping.protocol == "pcp":
            request = pcp.map_request(self.local_ip, mapping.nonce, self.internal_port, 0, 0)
            await udp_exchange(self.gateway, self.udp_port, request, lambda d: pcp.parse_map(d, mapping.nonce), timeout)
        elif mapping.protocol == "nat-pmp":
            request = natpmp.map_request(self.internal_port, 0, 0)
            await udp_exchange(self.gateway, self.udp_port, request, natpmp.parse_map, timeout)
        else:
            assert mapping.service is not None
            await self._soap(mapping.service, "DeletePortMapping", {
                "NewRemoteHost": "", "NewExternalPort": mapping.external_port, "NewProtocol": "TCP"}, timeout)

    async def _map(self, protocol: str, timeout: float, old: Mapping | None) -> Mapping:
        if protocol == "pcp":
            return await self._pcp(timeout, old)
        if protocol == "nat-pmp":
            return await self._natpmp(timeout, old)
        return await self._upnp(timeout, old)

    async def _pcp(self, timeout: float, old: Mapping | None) -> Mapping:
        nonce = old.nonce if old else os.urandom(12)
        external = old.external_port if old else self.internal_port
        request = pcp.map_request(self.local_ip, nonce, self.internal_port, external, self.lifetime,
                                  old.external_ip if old else "0.0.0.0")
        got = await udp_exchange(self.gateway, self.udp_port, request, lambda d: pcp.parse_map(d, nonce), timeout)
        if got.internal_port != self.internal_port or not got.external_port or not got.lifetime:
            raise PortMapError(f"PCP answer maps {got.internal_port}->{got.external_port} for {got.lifetime} s")
        return Mapping("pcp", self.gateway, got.external_address, got.external_port, self.internal_port,
                       got.lifetime, nonce=nonce)

    async def _natpmp(self, timeout: float, old: Mapping | None) -> Mapping:
        deadline = time.monotonic() + timeout
        address = await udp_exchange(self.gateway, self.udp_port, natpmp.external_address_request(),
                                     natpmp.parse_external_address, timeout)
        request = natpmp.map_request(self.internal_port, old.external_port if old else self.internal_port,
                                     self.lifetime)
        got = await udp_exchange(self.gateway, self.udp_port, request, natpmp.parse_map,
                                 max(deadline - time.monotonic(), 0.05))
        if got.internal_port != self.internal_port or not got.external_port or not got.lifetime:
            raise PortMapError(f"NAT-PMP answer maps {got.internal_port}->{got.external_port} for {got.lifetime} s")
        return Mapping("nat-pmp", self.gateway, address.address, got.external_port, self.internal_port, got.lifetime)

    async def _upnp(self, timeout: float, old: Mapping | None) -> Mapping:
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 0.05)
        service = old.service if old and old.service else None
        if service is None:
            location = await ssdp_search(self.gateway, left())
            status, description = await http("GET", location, left())
            if status != 200:
                raise PortMapError(f"UPnP description {location[:80]}: HTTP {status}")
            service = igd.find_service(description, location, self.gateway)
        external_ip = igd.external_ip(await self._soap(service, "GetExternalIPAddress", {}, left()))
        port = old.external_port if old else self.internal_port
        try:
            await self._add(service, port, left())
        except PortMapError as exc:  # the port is taken by another client: one random other port
            if old is not None or f"refused: {UPNP_CONFLICT} " not in f"{exc} ":
                raise
            port = random.randint(1024, 65535)
            await self._add(service, port, left())
        return Mapping("upnp", self.gateway, external_ip, port, self.internal_port, self.lifetime, service=service)

    async def _add(self, service: igd.Service, port: int, timeout: float) -> None:
        await self._soap(service, "AddPortMapping", {
            "NewRemoteHost": "", "NewExternalPort": port, "NewProtocol": "TCP", "NewInternalPort": self.internal_port,
            "NewInternalClient": self.local_ip, "NewEnabled": 1, "NewPortMappingDescription": "dekube",
            "NewLeaseDuration": self.lifetime}, timeout)

    async def _soap(self, service: igd.Service, action: str, args: dict[str, str | int], timeout: float) -> dict:
        headers, body = igd.soap_request(service, action, args)
        status, data = await http("POST", service.control_url, timeout, headers, body)
        return igd.parse_soap(status, data, action)
