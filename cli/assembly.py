"""The product's plugins (ADR 0201): what the layers above node/ hand the node, assembled here, where
every layer may be imported.

`PRODUCT` names the roles (validator: consensus, relay: relay, compute: ml.compute), the services every
node runs whatever its roles (the relay client, port mapping, serving), the config sections their owners
define (consensus/validator/settings.py, relay/settings.py, relay/portmap/settings.py, ml/settings.py)
and the ledger's transaction encoding with its `DEFAULT_FEE`. Each role and service is imported only
when a node uses it (a node without the compute extra still runs a validator). `install_product()` installs them
(node.plugins.install); the CLI's `main` does it first, and so do devtools entry points and the tests'
conftest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from consensus.tx import DEFAULT_FEE, signed_tx_bytes
from consensus.validator.settings import SECTIONS as CONSENSUS_SECTIONS
from ml.settings import SECTIONS as ML_SECTIONS
from node.plugins import Plugins, TxEncoding, install
from relay.portmap.settings import SECTIONS as PORTMAP_SECTIONS
from relay.settings import SECTIONS as RELAY_SECTIONS

if TYPE_CHECKING:
    from node.roles import Role
    from node.runtime import Node


def _validator() -> Callable[[Node], Role]:
    from consensus.validator.role import ValidatorRole

    return ValidatorRole


def _relay() -> Callable[[Node], Role]:
    from relay.role import RelayRole

    return RelayRole


def _compute() -> Callable[[Node], Role]:
    from ml.compute.role import ComputeRole

    return ComputeRole


def _relay_client() -> Callable[[Node], Any]:
    from relay.node_client import RelayNodeClient  # circuits and reservations (ADR 0062)

    return RelayNodeClient


def _port_mapping() -> Callable[[Node], Any]:
    from relay.portmap.service import PortMapService  # [nat] port_mapping: PCP/NAT-PMP/UPnP (ADR 0221)

    return PortMapService


def _serving() -> Callable[[Node], Any]:
    from ml.serve.service import ServingService  # [serve]: a block server beside compute (ADR 0177)

    return ServingService


PRODUCT = Plugins(
    roles={"validator": _validator, "relay": _relay, "compute": _compute},
    services={"relay_client": _relay_client, "port_mapping": _port_mapping, "serving": _serving},
    sections={**CONSENSUS_SECTIONS, **RELAY_SECTIONS, **PORTMAP_SECTIONS, **ML_SECTIONS},
    tx=TxEncoding(signed_tx_bytes, DEFAULT_FEE),
)


def install_product() -> Plugins:
    """Install the product's plugins for this process; returns them."""
    install(PRODUCT)
    return PRODUCT
