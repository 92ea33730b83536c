"""How a role plugs into the node, and the registry that maps role names to implementations.

A role subclasses ``Role``: ``setup(node)`` registers its RPC methods, status section, metrics and
pub/sub topics before the node serves anything; ``run(node)`` does the work until cancelled.
To plug a real role in, point its entry in ``ROLE_IMPLEMENTATIONS`` at a zero-argument factory
(``"consensus.role:ValidatorRole"``); it is imported only when the role is started. Until then a
role is a ``BasicRole``: it reports that it runs and does nothing else.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from node.config import ROLE_NAMES

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

# role name -> "module:factory", or None while the role has no implementation yet (BasicRole).
ROLE_IMPLEMENTATIONS: dict[str, str | None] = {
    "validator": "consensus.validator:ValidatorRole",
    "relay": "relay.role:RelayRole",
    "compute": "ml.compute.role:ComputeRole",
}


class RoleError(Exception):
    """A role name is unknown or its implementation cannot be loaded."""


class Role:
    """Base class of node roles (validator, relay, compute)."""

    name: str = ""

    def setup(self, node: "Node") -> None:
        """Register RPC methods, status sections, metrics and topics. Runs before serving starts."""

    async def run(self, node: "Node") -> None:
        """Do the role's work until cancelled."""
        raise NotImplementedError


class BasicRole(Role):
    """A role without an implementation yet: logs that it started and shows a /status section."""

    def __init__(self, name: str):
        self.name = name
        self.started_at: float | None = None

    def setup(self, node: "Node") -> None:
        node.status.add_section(self.name, self._status)

    async def run(self, node: "Node") -> None:
        self.started_at = time.time()
        log.info("role started", extra={"role": self.name})
        await asyncio.Event().wait()  # nothing to do until an implementation lands; wait for cancellation

    def _status(self) -> dict[str, Any]:
        return {"running": self.started_at is not None, "implementation": "basic", "started_at": self.started_at}


def create_role(name: str) -> Role:
    """Instantiate the role called ``name`` from ``ROLE_IMPLEMENTATIONS``."""
    if name not in ROLE_NAMES or name not in ROLE_IMPLEMENTATIONS:
        raise RoleError(f"unknown role {name!r} (roles: {', '.join(ROLE_NAMES)})")
    target = ROLE_IMPLEMENTATIONS[name]
    if target is None:
        return BasicRole(name)
    factory = _import(target)
    role = factory()
    if not isinstance(role, Role) or role.name != name:
        raise RoleError(f"{target} did not create a Role named {name!r}")
    return role


def _import(target: str) -> Callable[[], Any]:
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise RoleError(f"cannot load role implementation {target}: {exc}") from exc
