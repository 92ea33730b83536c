"""This node's ledger record (``register_node``), published by one writer for all roles.

``register_node`` replaces the whole record, so roles never send it themselves: each contributes
the fields it owns (``contribute(owner, roles=..., relay_addrs=..., hardware=...)``; ``hardware`` maps
are merged key by key, so a serving service adds ``serving`` to the compute role's) and the
publisher merges every contribution with the record on chain into one payload (``merge_record``,
pure): roles are the union of the chain's and every contributor's, a field nobody contributes
keeps its value on chain (or a default). ``run`` publishes after a change settles (``DEBOUNCE_S``)
and reads the record back every ``RECHECK_S``, restoring it when another writer (an operator's
wallet) replaced it; ``sync`` publishes now and says whether a transaction was sent.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from node.p2p.multiaddr import Multiaddr

from .errors import LedgerUnavailable

log = logging.getLogger(__name__)

LEDGER_ROLES = frozenset({"validator", "compute", "relay", "verifier"})  # consensus.tx.ROLES (a test checks)
MAX_CPU_CORES = 1024  # consensus.tx.MAX_CPU_CORES: the ledger refuses more (a test checks)
MAX_ADDRS = 8          # register_node takes at most 8 listen and 8 relay addresses
MAX_ADDR_CHARS = 256
DEBOUNCE_S = 0.2
RECHECK_S = 10.0
RETRY_S = 5.0
FIELDS = ("roles", "listen_addrs", "relay_addrs", "hardware")


def dialable(addrs: list[str]) -> list[str]:
    """Addresses worth publishing: no wildcard hosts, within the ledger's size limits."""
    out = []
    for text in addrs:
        addr = Multiaddr.parse(text)
        if not addr.is_relayed and addr.direct_endpoint()[0] in ("0.0.0.0", "::"):
            continue
        if len(text) <= MAX_ADDR_CHARS:
            out.append(text)
    return out[:MAX_ADDRS]


def default_hardware() -> dict:
    return {"cpu_cores": min(os.cpu_count() or 1, MAX_CPU_CORES), "ram_mb": 0, "gpu": "", "gpu_mem_mb": 0,
            "bandwidth_mbps": 0}


def merge_record(current: dict | None, contributions: dict[str, dict]) -> dict | None:
    """The register_node payload merging ``contributions`` (owner -> fields) into ``current``, or
    None when ``current`` already says it all."""
    current = current or {}
    roles = set(current.get("roles", []))
    wanted: dict[str, Any] = {}
    hardware: dict[str, Any] | None = None
    for fields in contributions.values():
        roles |= set(fields.get("roles", ()))
        for key in ("listen_addrs", "relay_addrs"):
            if fields.get(key) is not None:
                wanted[key] = fields[key]
        if fields.get("hardware") is not None:   # contributors own keys of it (compute: the machine, serve: serving)
            hardware = {**(hardware or {}), **fields["hardware"]}
    if hardware is not None:
        wanted["hardware"] = {**default_hardware(), **hardware}
    payload = {
        "roles": sorted(roles & LEDGER_ROLES),
        "listen_addrs": (dialable(wanted["listen_addrs"]) if "listen_addrs" in wanted
                         else list(current.get("listen_addrs", []))),
        "relay_addrs": (dialable(wanted["relay_addrs"]) if "relay_addrs" in wanted
                        else list(current.get("relay_addrs", []))),
        "hardware": dict(wanted.get("hardware") or current.get("hardware") or default_hardware()),
    }
    if current and all(current.get(key) == payload[key] for key in FIELDS):
        return None
    return payload


class RecordPublisher:
    """Merges the roles' contributions into this node's one ledger record."""

    def __init__(self, peer_id: str, read: Callable[[str], Awaitable[dict | None]],
                 send: Callable[[str, dict], Awaitable[dict]]) -> None:
        self.peer_id = peer_id
        self._read = read
        self._send = send
        self.contributions: dict[str, dict] = {}
        self.published: dict | None = None     # the record as last seen on chain (after our tx)
        self.last_error: str | None = None
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()

    def contribute(self, owner: str, **fields: Any) -> None:
        """Set ``owner``'s fields (roles, listen_addrs, relay_addrs, hardware); published soon."""
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"not node record fields: {', '.join(sorted(unknown))}")
        merged = {**self.contributions.get(owner, {}), **fields}
        if merged != self.contributions.get(owner):
            self.contributions[owner] = merged
            self._changed.set()

    async def sync(self) -> bool:
        """Bring the record on chain up to date now; True if a register_node was sent.
        Raises LedgerUnavailable (also for a record that is not an object) or TxFailed."""
        async with self._lock:
            current = await self._read(self.peer_id)
            if current is not None and not isinstance(current, dict):
                raise LedgerUnavailable(f"dkb_getNode answered a record that is not an object: {current!r:.80}")
            payload = merge_record(current, self.contributions)
            if payload is None:
                self.published = current
                return False
            await self._send("register_node", payload)
            self.published = {**(current or {}), **payload}
            log.info("node record published", extra={"roles": ",".join(payload["roles"])})
            return True

    async def run(self) -> None:
        """Publish each settled change, and read back every RECHECK_S, until cancelled."""
        while True:
            try:
                await asyncio.wait_for(self._changed.wait(), RECHECK_S)
                await asyncio.sleep(DEBOUNCE_S)
            except TimeoutError:
                pass
            self._changed.clear()
            if not self.contributions:
                continue
            try:
                await self.sync()
                self.last_error = None
            except Exception as exc:  # a ledger that is down or answers junk must not stop the node
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("publishing the node record failed (retrying): %s", self.last_error)
                await asyncio.sleep(RETRY_S)
                self._changed.set()
