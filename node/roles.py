"""How a role plugs into the node, and the registry that maps role names to implementations.

A role is built whole (docs/adr/0140): the Node builds it after its own services exist, by calling a
``RoleFactory`` with itself, and the role's constructor takes what it needs from the node (config,
identity, ``ledger``, ``host``, ``rpc``, ``hub``, ``status``, ``metrics``, ``data_dir``) and
registers its RPC methods, status section, metrics, HTTP routes and pub/sub topics before the node
serves anything; ``run()`` does the work until cancelled. A ``Role`` subclass is itself a factory
(``ValidatorRole(node)``). ``ROLE_IMPLEMENTATIONS`` maps each role name to such a factory
(``"module:factory"``), imported only when the role is started. ``NODE_SERVICES`` does the same for
the services every node runs whatever its roles (``create_service(name, node)`` builds one after
the roles; it has an async ``run()``), so node/ names them without importing them. ``BasicRole`` is
an idle role (it runs no protocol and only reports that it runs) for embedding a Node whose only job
is its transport, as tests and tools do (``basic_role("relay")`` is its factory).
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node.config import ROLE_NAMES
from node.extras import missing_compute_message, missing_compute_module

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

# role name -> "module:factory"
ROLE_IMPLEMENTATIONS: dict[str, str] = {
    "validator": "consensus.validator.role:ValidatorRole",
    "relay": "relay.role:RelayRole",
    "compute": "ml.compute.role:ComputeRole",
}

# service name -> "module:factory"; the factory takes the Node and returns an object with async run()
NODE_SERVICES: dict[str, str] = {
    "relay_client": "relay.node_client:RelayNodeClient",   # circuits and reservations (ADR 0062)
    "bandwidth": "node.bandwidth:BandwidthService",         # measured bandwidth and latency (ADR 0158)
    "serving": "ml.serve.service:ServingService",           # [serve]: a block server beside compute (ADR 0177)
}


class RoleError(Exception):
    """A role name is unknown or its implementation cannot be loaded."""


class RoleStartError(Exception):
    """A role cannot start (missing genesis, damaged database...): the node reports the message as
    one line and exits with code 1 (docs/adr/0142)."""


class Role:
    """Base class of node roles (validator, relay, compute).

    A subclass's constructor takes the Node first, builds every field and registers its RPC
    methods, status sections, metrics and topics (it runs before serving starts). ``prepare()``
    does the role's blocking start-up checks (opening its database) before the node listens."""

    name: str = ""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def prepare(self) -> object:
        """Start-up work that must succeed before the node serves anything; raise RoleStartError
        with a message for the operator if the role cannot start. Runs on the event loop: do
        blocking work with ``asyncio.to_thread`` or an executor. A role may return what it opened
        (the validator: its chain state); the node ignores it."""
        return None

    async def run(self) -> None:
        """Do the role's work until cancelled."""
        raise NotImplementedError


# builds a role for the node it is given (a Role subclass is one)
RoleFactory = Callable[["Node"], Role]


class BasicRole(Role):
    """An idle role: logs that it started and shows a /status section; runs no protocol."""

    def __init__(self, node: Node, name: str):
        super().__init__(node)
        self.name = name
        self.started_at: float | None = None
        node.status.add_section(self.name, self._status)

    async def run(self) -> None:
        self.started_at = time.time()
        log.info("role started", extra={"role": self.name})
        await asyncio.Event().wait()  # idle until cancelled

    def _status(self) -> dict[str, Any]:
        return {"running": self.started_at is not None, "implementation": "basic", "started_at": self.started_at}


def basic_role(name: str) -> RoleFactory:
    """The factory of an idle ``BasicRole`` called ``name``."""
    return lambda node: BasicRole(node, name)


def role_factory(name: str) -> RoleFactory:
    """The factory of the role called ``name`` from ``ROLE_IMPLEMENTATIONS`` (imports its module)."""
    if name not in ROLE_NAMES or name not in ROLE_IMPLEMENTATIONS:
        raise RoleError(f"unknown role {name!r} (roles: {', '.join(ROLE_NAMES)})")
    target = ROLE_IMPLEMENTATIONS[name]
    factory = _import(target)

    def build(node: Node) -> Role:
        role = factory(node)
        if not isinstance(role, Role) or role.name != name:
            raise RoleError(f"{target} did not create a Role named {name!r}")
        return role

    return build


def create_role(name: str, node: Node) -> Role:
    """Build the role called ``name`` from ``ROLE_IMPLEMENTATIONS`` for ``node``."""
    return role_factory(name)(node)


def create_service(name: str, node: Node) -> Any:
    """Build the node service called ``name`` from ``NODE_SERVICES``."""
    return _import(NODE_SERVICES[name])(node)


def _import(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        missing = missing_compute_module(exc)
        if missing:
            raise RoleError(missing_compute_message(f"role implementation {target}", missing)) from exc
        raise RoleError(f"cannot load role implementation {target}: {exc}") from exc
