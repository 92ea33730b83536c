"""The ``relay`` node role: runs the circuit relay v2 service (and an AutoNAT dial-back server)
on the node's Host.

Settings come from the ``[relay]`` config section (allow-list, minimum stake, reservation TTL,
per-IP and per-peer limits, price). Admission: the static allow-list, plus peers registered on the
ledger with at least ``min_stake`` bonded, looked up through the node's ledger gateway
(``node.ledger``: this node's own ledger when it is also a validator, else a validator's JSON-RPC,
cached ``lookup_ttl`` seconds); ``stake_of`` overrides the lookup. With a ledger the role
contributes the ``relay`` role to this node's ledger record (the ledger pays receipts only to
registered relays; the gateway's record publisher keeps it there). Co-signed receipts go to
``submit`` (an async callable taking the ``relay_receipt`` payload), by default a ``relay_receipt``
transaction sent by the gateway (pipelined with the node's other transactions); without a ledger
they are only kept in memory and counted in ``/status``. The per-peer connection limit is raised to
fit one bulk connection per circuit.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from node.identity import is_valid_peer_id
from node.roles import Role, RoleError

from .ledger_access import StakeLookup
from .reachability import AutoNATServer
from .service import Admission, RelayService, Submit
from .service import StakeLookup as StakeLookupFn
from .settings import limits as relay_limits

if TYPE_CHECKING:
    from node.ledger import LedgerGateway
    from node.p2p.host import Host
    from node.runtime import Node

log = logging.getLogger(__name__)

REGISTER_RETRY_S = 5.0
EXTRA_CONNECTIONS_PER_PEER = 2   # a peer's shared connection and one being set up, besides circuits


def fit_connection_limit(host: Host, circuits_per_peer: int) -> None:
    """Raise the Host's per-peer connection limit to hold ``circuits_per_peer`` bulk circuits
    (each its own connection between an endpoint and the relay) besides the shared connection."""
    need = circuits_per_peer + EXTRA_CONNECTIONS_PER_PEER
    if host.limits.max_connections_per_peer < need:
        log.info("per-peer connection limit raised to %d for relayed circuits", need)
        host.limits = dataclasses.replace(host.limits, max_connections_per_peer=need)


def receipt_sender(ledger: LedgerGateway) -> Submit:
    """``submit`` that sends each co-signed receipt as a ``relay_receipt`` transaction."""
    async def send(payload: dict) -> None:
        await ledger.send("relay_receipt", payload)
    return send


class RelayRole(Role):
    name = "relay"

    def __init__(self, node: Node, stake_of: StakeLookupFn | None = None, submit: Submit | None = None) -> None:
        super().__init__(node)
        settings = node.config["relay"]
        self.stake = settings["stake"]
        bad = [p for p in settings["allow_list"] if not is_valid_peer_id(p)]
        if bad:
            raise RoleError(f"[relay] allow_list holds invalid peer IDs: {', '.join(bad)}")
        if settings["min_stake"] < 0:
            raise RoleError("[relay] min_stake must not be negative")
        self.ledger: LedgerGateway | None = node.ledger if node.ledger.available else None
        self.registered = False
        self.last_error: str | None = None
        self.submissions = {"sent": 0, "failed": 0}   # receipts handed to the ledger
        if stake_of is None and self.ledger is not None:
            stake_of = StakeLookup(self.ledger, 0 if self.ledger.is_local else settings["lookup_ttl"],
                                   min_client_balance=settings["min_client_balance"])
        admission = Admission(set(settings["allow_list"]), settings["min_stake"], stake_of)
        limits = relay_limits(settings)
        chain_id = node.config["consensus"]["chain_id"]
        if submit is None and self.ledger is not None:
            submit = receipt_sender(self.ledger)
        self.service = RelayService(node.host, admission, limits, chain_id=chain_id,
                                    submit=self._counting(submit) if submit is not None else None)
        self.service.start()
        AutoNATServer(node.host).start()
        fit_connection_limit(node.host, settings["max_circuits_per_peer"])
        node.status.add_section(self.name, self._status)
        self._register_metrics(node)

    def _counting(self, submit: Submit) -> Submit:
        """``submit`` that counts the receipts handed to the ledger and those it could not send."""
        async def counted(payload: dict) -> None:
            try:
                await submit(payload)
            except Exception:
                self.submissions["failed"] += 1
                raise
            self.submissions["sent"] += 1
        return counted

    def _status(self) -> dict:
        return {**self.service.status(), "ledger": None if self.ledger is None else self.ledger.url,
                "registered": self.registered,
                "last_error": self.last_error, "receipts_sent": self.submissions["sent"],
                "receipts_send_failed": self.submissions["failed"]}

    def _register_metrics(self, node: Node) -> None:
        service, metrics = self.service, node.metrics
        metrics.gauge("dekube_relay_reservations", "Live reservations on this relay.").set_function(
            lambda: service.status()["reservations"])
        metrics.gauge("dekube_relay_circuits", "Circuits open through this relay.").set_function(
            lambda: len(service.circuits))
        metrics.counter_function("dekube_relay_bytes_total",
                                 "Bytes relayed, both directions, open and closed circuits.",
                                 lambda: service.counters["bytes_closed_circuits"]
                                 + sum(c.bytes_total for c in service.circuits))
        metrics.counter_function("dekube_relay_receipts_total", "Usage receipts co-signed by both endpoints.",
                                 lambda: service.counters["receipts"])
        metrics.counter_function("dekube_relay_receipts_sent_total",
                                 "Co-signed receipts accepted by the ledger's JSON-RPC.",
                                 lambda: self.submissions["sent"])

    async def run(self) -> None:
        log.info("relay serving circuit relay v2", extra={"role": self.name})
        try:
            if self.ledger is not None:
                await self._keep_registered(self.node, self.ledger)  # until cancelled
            else:
                await asyncio.Event().wait()
        finally:
            await self.service.stop()

    async def _keep_registered(self, node: Node, ledger: LedgerGateway) -> None:
        """Contribute the relay role to this node's ledger record and see it published (retrying
        every REGISTER_RETRY_S); the gateway's record publisher keeps it there afterwards."""
        await node.ready.wait()
        ledger.record.contribute(self.name, roles={r.name for r in node.roles},
                                 listen_addrs=node.host.listen_addrs)
        while not self.registered:
            try:
                bonded = await ledger.bonded(node.peer_id)
                if bonded < self.stake:   # receipts are paid only to staked relays (ADR 0165)
                    await ledger.send("bond", {"amount": self.stake - bonded})
                if await ledger.record.sync():
                    log.info("relay registered on the ledger", extra={"peer_id": node.peer_id})
                self.registered = True
                self.last_error = None
            except Exception as exc:  # a ledger that is down, refuses or answers junk must not stop the relay
                self.last_error = f"registering: {type(exc).__name__}: {exc}"
                log.warning("relay registration failed (retrying): %s", self.last_error)
                await asyncio.sleep(REGISTER_RETRY_S)
        await asyncio.Event().wait()
