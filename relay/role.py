"""The ``relay`` node role: runs the circuit relay v2 service on the node's Host.

Settings come from the ``[relay]`` config section (allow-list, minimum stake, reservation TTL,
per-IP and per-peer limits, price). Admission by ledger stake uses ``stake_of`` when the node
provides one (a callable peer ID -> stake or None); until then only the allow-list is admitted.
Co-signed receipts go to ``submit`` (an async callable taking the ``relay_receipt`` payload), by
default a ``dkb_sendRawTransaction`` client of the ``[relay] receipt_rpc`` URL; without either they
are only kept in memory and counted in ``/status``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from node.identity import is_valid_peer_id
from node.roles import Role, RoleError

from .service import Admission, RelayLimits, RelayService, StakeLookup, Submit
from .submit import rpc_receipt_submitter

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)


class RelayRole(Role):
    name = "relay"

    def __init__(self, stake_of: StakeLookup | None = None, submit: Submit | None = None) -> None:
        self._stake_of = stake_of
        self._submit = submit
        self.service: RelayService | None = None

    def setup(self, node: "Node") -> None:
        settings = node.config["relay"]
        bad = [p for p in settings["allow_list"] if not is_valid_peer_id(p)]
        if bad:
            raise RoleError(f"[relay] allow_list holds invalid peer IDs: {', '.join(bad)}")
        if settings["min_stake"] < 0:
            raise RoleError("[relay] min_stake must not be negative")
        stake_of = self._stake_of or getattr(node, "stake_of", None)
        admission = Admission(set(settings["allow_list"]), settings["min_stake"], stake_of)
        limits = RelayLimits(reservation_ttl=settings["reservation_ttl"],
                             max_reservations_per_ip=settings["max_reservations_per_ip"],
                             max_circuits_per_peer=settings["max_circuits_per_peer"],
                             price_per_mib=settings["price_per_mib"])
        chain_id = node.config["consensus"]["chain_id"]
        submit = self._submit
        if submit is None and settings["receipt_rpc"]:
            submit = rpc_receipt_submitter(settings["receipt_rpc"], node.identity, chain_id)
        self.service = RelayService(node.host, admission, limits, chain_id=chain_id, submit=submit)
        self.service.start()
        node.status.add_section(self.name, self.service.status)
        self._register_metrics(node)

    def _register_metrics(self, node: "Node") -> None:
        service = self.service
        gauges = {
            "dekube_relay_reservations": ("Live reservations on this relay.",
                                          lambda: service.status()["reservations"]),
            "dekube_relay_circuits": ("Circuits open through this relay.", lambda: len(service.circuits)),
            "dekube_relay_bytes": ("Bytes relayed, both directions, open and closed circuits.",
                                   lambda: service.counters["bytes_closed_circuits"]
                                   + sum(c.bytes_total for c in service.circuits)),
            "dekube_relay_receipts": ("Usage receipts co-signed by both endpoints.",
                                      lambda: service.counters["receipts"]),
        }
        for name, (text, read) in gauges.items():
            node.metrics.gauge(name, text).set_function(read)

    async def run(self, node: "Node") -> None:
        log.info("relay serving circuit relay v2", extra={"role": self.name})
        try:
            await asyncio.Event().wait()
        finally:
            await self.service.stop()
