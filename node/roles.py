"""How a role plugs into the node.

A role is built whole (docs/adr/0140): the Node builds it after its own services exist, by calling a
``RoleFactory`` with itself, and the role's constructor takes what it needs from the node (config,
identity, ``ledger``, ``host``, ``rpc``, ``hub``, ``status``, ``metrics``, ``data_dir``) and
registers its RPC methods, status section, metrics, HTTP routes and pub/sub topics before the node
serves anything; ``run()`` does the work until cancelled. A ``Role`` subclass is itself a factory
(``ValidatorRole(node)``). node/ names no role above it (ADR 0201): the factories by name, and the
services every node runs whatever its roles, are handed in as ``node.plugins.Plugins`` (the
product's: cli/assembly.py); ``role_factory(name)`` and ``create_service`` read the installed ones.
``BasicRole`` is an idle role (it runs no protocol and only reports that it runs) for embedding a
Node whose only job is its transport, as tests and tools do (``basic_role("relay")`` is its factory).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from node.config import ROLE_NAMES
from node.extras import missing_compute_message, missing_compute_module
from node.plugins import Plugins, installed

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

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


def role_factory(name: str, plugins: Plugins | None = None) -> RoleFactory:
    """The factory of the role called ``name`` among ``plugins``' roles (default: the installed ones)."""
    roles = (plugins or installed()).roles
    if name not in ROLE_NAMES or name not in roles:
        known = [role for role in ROLE_NAMES if role in roles]
        raise RoleError(f"unknown role {name!r} (roles: {', '.join(known) or 'none installed'})")
    factory = load(roles[name], f"role implementation of {name!r}")

    def build(node: Node) -> Role:
        role = factory(node)
        if not isinstance(role, Role) or role.name != name:
            raise RoleError(f"the factory of role {name!r} did not create a Role named {name!r}")
        return role

    return build


def create_role(name: str, node: Node) -> Role:
    """Build the installed role called ``name`` for ``node``."""
    return role_factory(name)(node)


def create_service(name: str, node: Node) -> Any:
    """Build the installed node service called ``name``."""
    return load(installed().services[name], f"node service {name!r}")(node)


def load(factory: Callable[[], Callable[..., Any]], what: str) -> Callable[..., Any]:
    """``factory()`` (which imports a role's module), with a missing optional extra reported as a RoleError."""
    try:
        return factory()
    except ImportError as exc:
        missing = missing_compute_module(exc)
        if missing:
            raise RoleError(missing_compute_message(what, missing)) from exc
        raise RoleError(f"cannot load {what}: {exc}") from exc
