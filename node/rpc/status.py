"""The /status document: the node's own fields plus named sections that components register.

``board.add_section("consensus", lambda: {"height": h, "syncing": False})`` (sync or async
provider). A failing provider shows ``{"error": ...}`` in its section instead of failing /status.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

StatusProvider = Callable[[], "dict[str, Any] | Awaitable[dict[str, Any]]"]


class StatusBoard:
    """Collects /status: ``base()`` gives the top-level fields, sections sit under their names."""

    def __init__(self, base: Callable[[], dict[str, Any]]):
        self._base = base
        self._sections: dict[str, StatusProvider] = {}

    def add_section(self, name: str, provider: StatusProvider) -> None:
        if name in self._sections or name in self._base():
            raise ValueError(f"status section {name!r} already exists")
        self._sections[name] = provider

    async def snapshot(self) -> dict[str, Any]:
        doc = dict(self._base())
        for name, provider in list(self._sections.items()):
            try:
                value = provider()
                if inspect.isawaitable(value):
                    value = await value
                doc[name] = value
            except Exception as exc:
                log.exception("status section %s failed", name)
                doc[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        return doc
