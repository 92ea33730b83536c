"""Serving inside the node (ADR 0177): the `[serve]` section runs a block server beside the compute role.

A node service ("serving" in cli/assembly.py's plugins) built for every node; it stays idle unless `[serve] model`
is set, and then needs the compute role (whose stake the ledger requires of paid servers and
referees). Once the node is ready it loads the blocks (`[serve] blocks`: A:B, or auto:N chosen from
the ledger's coverage), serves `/dekube/serve/1.0.0` on the node's own Host (billing at `[serve]
price` per GFLOP when > 0), measures its throughput and adds `hardware.serving` to the node record
through the node's one RecordPublisher (contribution "serve": the compute role's hardware is kept,
ADR 0177 merges hardware key by key). The serving itself (claims, referee duty, refresh, rebalancing)
is the one serving loop, ml/serve/loop.py, which `dekube-node serve` drives too (ADR 0201). Torch is
imported only when serving. `[serve] device` (auto, cpu, cuda; ADR 0179) is resolved when the service
starts: cuda on a machine without a CUDA device stops the node with that message (RoleStartError),
never mid-session; a CUDA server announces its GPU's execution profile.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


class ServingService:
    """The `[serve]` section: the node's settings, device and status around the one serving loop
    (ml/serve/loop.py)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        try:
            self.config: dict[str, Any] = node.config["serve"]
        except KeyError:   # a hand-built Config without the section: no serving
            self.config = {"model": ""}
        self.enabled = bool(self.config["model"])
        self.loop: Any = None                    # the ServingLoop, once serving
        self.device, self.profile = "", ""       # resolved at start from [serve] device
        self._error: str | None = None
        if self.enabled:
            node.status.add_section("serving", self.status)

    @property
    def server(self) -> Any:
        return None if self.loop is None else self.loop.server

    @property
    def blocks(self) -> tuple[int, int] | None:
        return None if self.loop is None else self.loop.blocks

    @property
    def announced(self) -> int | None:
        return None if self.loop is None else self.loop.announced

    @property
    def last_error(self) -> str | None:
        return self._error if self._error is not None or self.loop is None else self.loop.last_error

    def status(self) -> dict[str, Any]:
        loop = self.loop
        blocks = None if self.blocks is None else list(self.blocks)
        return {"model": self.config["model"], "device": self.device, "profile": self.profile,
                "blocks": blocks, "tokens_per_s": round(loop.tokens_per_s, 1) if loop is not None else 0.0,
                "announced_height": self.announced,
                "sessions": len(self.server.sessions) if self.server is not None else 0,
                "unclaimed_receipts": len(loop.book.unclaimed()) if loop is not None else 0,
                "last_error": self.last_error}

    async def run(self) -> None:
        if not self.enabled:
            await asyncio.Event().wait()
        if "compute" not in {role.name for role in self.node.roles}:
            self._error = "[serve] model needs the compute role"
            log.error("[serve] model is set but this node does not run the compute role: not serving")
            await asyncio.Event().wait()
        await self.start_device()
        await self.node.ready.wait()
        try:
            await self.serve()
        except (ValueError, ImportError, OSError) as exc:   # a bad [serve] model or blocks, no torch, no file
            self._error = f"cannot serve: {exc}"
            log.error("[serve] cannot serve %s: %s", self.config["model"], exc)
            await asyncio.Event().wait()

    async def start_device(self) -> None:
        """Resolve `[serve] device` (and set deterministic CUDA up); RoleStartError when it cannot be had."""
        from ml.serve.device import DeviceError, prepare_device, serving_profile
        from node.roles import RoleStartError

        try:
            self.device = await asyncio.to_thread(prepare_device, self.config["device"])
        except DeviceError as exc:
            self._error = f"[serve] {exc}"
            raise RoleStartError(f"[serve] {exc}") from None
        except ImportError as exc:   # no torch
            self._error = f"cannot serve: {exc}"
            log.error("[serve] cannot serve %s: %s", self.config["model"], exc)
            await asyncio.Event().wait()
        self.profile = await asyncio.to_thread(serving_profile, self.device)

    async def serve(self) -> None:
        from ml.serve.catalog import parse_blocks, parse_model
        from ml.serve.loop import ServeSettings, ServingLoop, node_record_publisher
        from node.ledger.errors import LedgerUnavailable

        spec = await asyncio.to_thread(parse_model, self.config["model"])
        settings = ServeSettings(max_sessions=self.config["max_sessions"], price=self.config["price"],
                                 credit_tokens=self.config["credit_tokens"], claim_every=self.config["claim_every"],
                                 rebalance_every=self.config["rebalance_every"])
        ledger = self.node.ledger
        loop = ServingLoop(self.node.host, ledger, self.node.identity, spec, settings, self.device, self.profile,
                           node_record_publisher(ledger))
        text = self.config["blocks"]
        if text.startswith("auto:"):
            try:
                known = await loop.coverage()
            except (LedgerUnavailable, OSError) as exc:
                log.warning("reading the serving coverage failed (%s); choosing without it", exc)
                known = []
            blocks = loop.choose(int(text[5:]), known)
        else:
            blocks = parse_blocks(text, spec.config.layers)
        self.loop = loop
        await loop.load(blocks)
        await loop.run()
