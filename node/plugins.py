"""What the layers above node/ plug into a node (ADR 0201): node/ names none of them.

A `Plugins` value holds the role factories (by role name) and the services every node runs whatever
its roles (by name), each as a loader: a function that imports the module and returns the factory
(which takes the Node), so a role's module is imported only when it is used. It also holds the
config sections the roles and services own (section -> key -> `node.config.Key`, with defaults) and
how a transaction is encoded and what it pays (`TxEncoding`: the ledger's `signed_tx_bytes` and
`DEFAULT_FEE`). The product's is assembled in cli/assembly.py, which imports every layer;
`install(plugins)` makes it the one this process uses: the node's config then knows the sections,
`Node` resolves role names and builds the services, and `LedgerGateway` signs with the encoding.
Nothing is installed by default: a node that only carries traffic (`BasicRole`) needs none of it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from node.config import Key, add_sections
from node.identity import Identity

if TYPE_CHECKING:
    from node.roles import Role
    from node.runtime import Node

# (identity, chain id, nonce, tx type, payload, fee) -> the signed transaction's wire bytes
Encoder = Callable[[Identity, str, int, str, dict[str, Any], int], bytes]


@dataclass(frozen=True)
class TxEncoding:
    """How this node's ledger gateway encodes a transaction, and the fee it pays."""

    encode: Encoder
    fee: int


@dataclass(frozen=True)
class Plugins:
    """Role factories, node services, their config sections and the transaction encoding."""

    roles: Mapping[str, Callable[[], Callable[[Node], Role]]] = field(default_factory=dict)
    services: Mapping[str, Callable[[], Callable[[Node], Any]]] = field(default_factory=dict)
    sections: Mapping[str, Mapping[str, Key]] = field(default_factory=dict)
    tx: TxEncoding | None = None


_installed = Plugins()


def install(plugins: Plugins) -> None:
    """Make `plugins` this process's (idempotent for the same sections): the config learns its sections."""
    global _installed
    add_sections(plugins.sections)
    _installed = plugins


def installed() -> Plugins:
    """The plugins `install` was given (empty ones before)."""
    return _installed
