"""How a role plugs into the node, and the registry that maps role names to implementations.

A role subclasses ``Role``: ``setup(node)`` registers its RPC methods, status section, metrics and
pub/sub topics before the node serves anything; ``run(node)`` does the work until cancelled.
``ROLE_IMPLEMENTATIONS`` maps each role name to a zero-argument factory (``"module:factory"``),
imported only when the role is started. ``NODE_SERVICES`` does the same for the services every
node runs whatever its roles (``create_service(name, node)`` builds one after the roles' setup;
it has an async ``run()``), so node/ names them without importing them. ``BasicRole`` is an idle
role (it runs no protocol and only reports that it runs) for embedding a Node whose only job is its
transport, as tests and tools do.
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
}


class RoleError(Exception):
    """A role name is unknown or its implementation cannot be loaded."""


class Role:
    """Base class of node roles (validator, relay, compute)."""

    name: str = ""

    def setup(self, node: Node) -> None:
        """Register RPC methods, status sections, metrics and topics. Runs before serving starts."""

    async def run(self, node: Node) -> None:
        """Do the role's work until cancelled."""
        raise NotImplementedError


class BasicRole(Role):
    """An idle role: logs that it started and shows a /status section; runs no protocol."""

    def __init__(self, name: str):
        self.name = name
        self.started_at: float | None = None

    def setup(self, node: Node) -> None:
        node.status.add_section(self.name, self._status)

    async def run(self, node: Node) -> None:
        self.started_at = time.time()
        log.info("role started", extra={"role": self.name})
        await asyncio.Event().wait()  # idle until cancelled

    def _status(self) -> dict[str, Any]:
        return {"running": self.started_at is not None, "implementation": "basic", "started_at": self.started_at}


def create_role(name: str) -> Role:
    """Instantiate the role called ``name`` from ``ROLE_IMPLEMENTATIONS``."""
    if name not in ROLE_NAMES or name not in ROLE_IMPLEMENTATIONS:
        raise RoleError(f"unknown role {name!r} (roles: {', '.join(ROLE_NAMES)})")
    target = ROLE_IMPLEMENTATIONS[name]
    factory = _import(target)
    role = factory()
    if not isinstance(role, Role) or role.name != name:
        raise RoleError(f"{target} did not create a Role named {name!r}")
    return role


def create_service(name: str, node: Node) -> Any:
    """Build the node service called ``name`` from ``NODE_SERVICES``."""
    return _import(NODE_SERVICES[name])(node)


def _import(target: str) -> Callable[[], Any]:
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        missing = missing_compute_module(exc)
        if missing:
            raise RoleError(missing_compute_message(f"role implementation {target}", missing)) from exc
        raise RoleError(f"cannot load role implementation {target}: {exc}") from exc
