"""Keeping one port mapping alive: get it (retrying every ``retry_s`` while no router answers),
renew it at half its lifetime (getting a new one when renewal fails), tell ``on_change`` whenever
the mapped address appears, changes or goes, and delete it when the task ends (node stop). Each
outcome is one log line: what was mapped, or why not."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from .errors import PortMapError
from .mapper import Mapping, PortMapper

RETRY_S = 300.0         # a home router that did not answer is asked again this often
MIN_RENEW_S = 1.0       # never renew more often, whatever lifetime a router grants
log = logging.getLogger(__name__)


class MappingKeeper:
    def __init__(self, mapper: PortMapper, on_change: Callable[[Mapping | None], None] = lambda m: None, *,
                 retry_s: float = RETRY_S) -> None:
        self.mapper, self.on_change, self.retry_s = mapper, on_change, retry_s
        self.mapping: Mapping | None = None
        self.last_error: str | None = None

    def _set(self, mapping: Mapping | None) -> None:
        changed = (mapping.multiaddr if mapping else None) != (self.mapping.multiaddr if self.mapping else None)
        self.mapping = mapping
        if changed:
            self.on_change(mapping)

    async def run(self) -> None:
        port = self.mapper.internal_port
        try:
            while True:
                held = self.mapping
                if held is None:
                    try:
                        held = await self.mapper.map()
                    except PortMapError as exc:
                        self.last_error = str(exc)
                        log.info("port mapping: no mapping for TCP %d from gateway %s (%s); asking again in %g s",
                                 port, self.mapper.gateway, exc, self.retry_s)
                        await asyncio.sleep(self.retry_s)
                        continue
                    log.info("port mapping: TCP %d mapped to %s by %s on gateway %s for %d s", port,
                             held.multiaddr, held.protocol, held.gateway, held.lifetime)
                    self.last_error = None
                    self._set(held)
                await asyncio.sleep(max(held.lifetime / 2, MIN_RENEW_S))
                try:
                    self._set(await self.mapper.renew(held))
                except PortMapError as exc:
                    self.last_error = f"renewing: {exc}"
                    log.info("port mapping: renewing %s failed (%s); mapping anew", held.multiaddr, exc)
                    self._set(None)
        finally:
            if self.mapping is not None:
                mapping = self.mapping
                self._set(None)
                with contextlib.suppress(PortMapError, OSError):
                    await self.mapper.delete(mapping)
                    log.info("port mapping: deleted %s", mapping.multiaddr)
