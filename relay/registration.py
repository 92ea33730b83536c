"""This node's ledger record as the relay wiring keeps it: the ``relay`` role on relay nodes, the
relayed addresses (``relay_addrs``) on nodes that hold reservations.

``register_node`` replaces the whole record, so ``record_update`` starts from the current one: roles
are merged (another role's registration is never undone), listen addresses and declared hardware
are kept, only what the relay wiring owns changes. It returns None when the record already says it.
"""
from __future__ import annotations

import os

from consensus.tx import MAX_CPU_CORES, ROLES as LEDGER_ROLES
from node.p2p.multiaddr import Multiaddr

from .ledger_access import RelayLedger

MAX_ADDRS = 8          # register_node takes at most 8 listen and 8 relay addresses
MAX_ADDR_CHARS = 256


def dialable(addrs: list[str]) -> list[str]:
    """Addresses worth publishing: no wildcard hosts, within the ledger's size limits."""
    out = []
    for text in addrs:
        addr = Multiaddr.parse(text)
        if not addr.is_relayed and addr.tcp_endpoint()[0] in ("0.0.0.0", "::"):
            continue
        if len(text) <= MAX_ADDR_CHARS:
            out.append(text)
    return out[:MAX_ADDRS]


def default_hardware() -> dict:
    return {"cpu_cores": min(os.cpu_count() or 1, MAX_CPU_CORES), "ram_mb": 0, "gpu": "", "gpu_mem_mb": 0,
            "bandwidth_mbps": 0}


def record_update(current: dict | None, *, roles: set[str], listen_addrs: list[str],
                  relay_addrs: list[str] | None = None) -> dict | None:
    """The register_node payload that adds ``roles`` and sets ``relay_addrs`` (None: keep them),
    or None when ``current`` already says so."""
    current = current or {}
    merged_roles = sorted((set(current.get("roles", [])) | set(roles)) & LEDGER_ROLES)
    payload = {
        "roles": merged_roles,
        "listen_addrs": list(current.get("listen_addrs") or dialable(listen_addrs)),
        "relay_addrs": dialable(relay_addrs) if relay_addrs is not None else list(current.get("relay_addrs", [])),
        "hardware": dict(current.get("hardware") or default_hardware()),
    }
    if current and all(current.get(key) == value for key, value in payload.items()):
        return None
    return payload


async def publish_record(ledger: RelayLedger, peer_id: str, *, roles: set[str], listen_addrs: list[str],
                         relay_addrs: list[str] | None = None) -> bool:
    """Bring this node's ledger record up to date; True if a register_node transaction was sent.
    Raises LedgerUnavailable or TxFailed."""
    payload = record_update(await ledger.node_info(peer_id), roles=roles, listen_addrs=listen_addrs,
                            relay_addrs=relay_addrs)
    if payload is None:
        return False
    await ledger.send("register_node", payload)
    return True
