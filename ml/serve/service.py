"""Serving inside the node (ADR 0177): the `[serve]` section runs a block server beside the compute role.

A node service (`NODE_SERVICES["serving"]`) built for every node; it stays idle unless `[serve] model`
is set, and then needs the compute role (whose stake the ledger requires of paid servers and
referees). Once the node is ready it loads the blocks (`[serve] blocks`: A:B, or auto:N chosen from
the ledger's coverage), serves `/dekube/serve/1.0.0` on the node's own Host (billing at `[serve]
price` per GFLOP when > 0), measures its throughput and adds `hardware.serving` to the node record
through the node's one RecordPublisher (contribution "serve": the compute role's hardware is kept,
ADR 0177 merges hardware key by key). Every `claim_every` seconds it claims its receipts, does its
referee duty for serving disputes (ADR 0176), refreshes the announcement's height, and (with
`rebalance_every`) moves an idle server to thinner blocks. Torch is imported only when serving.
`[serve] device` (auto, cpu, cuda; ADR 0179) is resolved when the service starts: cuda on a machine
without a CUDA device stops the node with that message (RoleStartError), never mid-session; a CUDA
server announces its GPU's execution profile.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

CONTRIBUTOR = "serve"


async def claim_receipts(gateway, book) -> int:
    """Claim every receipt of `book` not yet paid (a receipt already paid counts as claimed); the
    number claimed."""
    from node.ledger.errors import LedgerUnavailable, TxFailed

    claimed = 0
    for signed in book.unclaimed():
        try:
            await gateway.send("serve_receipt", signed.payload())
            claimed += 1
        except TxFailed as exc:
            if str(exc.code).lower() != "replayed":
                log.warning("claiming a serving receipt failed: %s", exc)
                continue
        except (LedgerUnavailable, OSError) as exc:
            log.warning("claiming serving receipts failed: %s", exc)
            return claimed
        book.mark_claimed(signed)
    return claimed


async def ledger_servers(gateway, host, spec, exclude: str = "") -> list:
    """The servers of `spec`'s model the ledger announces (fresh ones), their addresses added to `host`."""
    from ml.serve.announce import announced_servers

    nodes = await gateway.call("dkb_listNodes", None, spec.model_id, 1000)
    found = announced_servers(nodes, spec.model_id, spec.config.layers, exclude)
    for item in found:
        if item.addrs:
            try:
                host.peerbook.add_addrs(item.server.peer_id, list(item.addrs))
            except ValueError:
                continue
    return found


class ServingService:
    """The `[serve]` section's block server, announcement, claims, referee duty and rebalancing."""

    def __init__(self, node) -> None:
        self.node = node
        try:
            self.config: dict[str, Any] = node.config["serve"]
        except KeyError:   # a hand-built Config without the section: no serving
            self.config = {"model": ""}
        self.enabled = bool(self.config["model"])
        self.blocks: tuple[int, int] | None = None
        self.tokens_per_s = 0.0
        self.announced: int | None = None        # the height of the last announcement
        self.server: Any = None
        self.device, self.profile = "", ""       # resolved at start from [serve] device
        self.book: Any = None
        self.last_error: str | None = None
        if self.enabled:
            node.status.add_section("serving", self.status)

    def status(self) -> dict:
        return {"model": self.config["model"], "device": self.device, "profile": self.profile,
                "blocks": None if self.blocks is None else list(self.blocks),
                "tokens_per_s": round(self.tokens_per_s, 1), "announced_height": self.announced,
                "sessions": len(self.server.sessions) if self.server is not None else 0,
                "unclaimed_receipts": len(self.book.unclaimed()) if self.book is not None else 0,
                "last_error": self.last_error}

    async def run(self) -> None:
        if not self.enabled:
            await asyncio.Event().wait()
        if "compute" not in {role.name for role in self.node.roles}:
            self.last_error = "[serve] model needs the compute role"
            log.error("[serve] model is set but this node does not run the compute role: not serving")
            await asyncio.Event().wait()
        await self.start_device()
        await self.node.ready.wait()
        try:
            await self.serve()
        except (ValueError, ImportError, OSError) as exc:   # a bad [serve] model or blocks, no torch, no file
            self.last_error = f"cannot serve: {exc}"
            log.error("[serve] cannot serve %s: %s", self.config["model"], exc)
            await asyncio.Event().wait()

    async def start_device(self) -> None:
        """Resolve `[serve] device` (and set deterministic CUDA up); RoleStartError when it cannot be had."""
        from ml.serve.device import DeviceError, prepare_device, serving_profile
        from node.roles import RoleStartError

        try:
            self.device = await asyncio.to_thread(prepare_device, self.config["device"])
        except DeviceError as exc:
            self.last_error = f"[serve] {exc}"
            raise RoleStartError(f"[serve] {exc}") from None
        except ImportError as exc:   # no torch
            self.last_error = f"cannot serve: {exc}"
            log.error("[serve] cannot serve %s: %s", self.config["model"], exc)
            await asyncio.Event().wait()
        self.profile = await asyncio.to_thread(serving_profile, self.device)

    # ---- serving
    async def serve(self) -> None:
        from ml.serve.billing import ReceiptBook
        from ml.serve.catalog import parse_model
        from ml.serve.dispute import BUNDLE_PROTOCOL, Inbox, make_bundle_handler, referee_duty

        spec = await asyncio.to_thread(parse_model, self.config["model"])
        self.book = ReceiptBook()
        inbox = Inbox(self.node.ledger, self.node.peer_id)   # the evidence clients deliver to us (ADR 0182)
        self.node.host.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(inbox=inbox))
        blocks = await self._initial_blocks(spec)
        await self._load(spec, blocks)
        every, rebalance_every = self.config["claim_every"], self.config["rebalance_every"]
        rebalance_at = time.monotonic() + rebalance_every
        while True:
            await asyncio.sleep(min(every, rebalance_every or every))
            self.server.expire()
            await claim_receipts(self.node.ledger, self.book)
            await referee_duty(self.node.ledger, self.node.host, self.server.model, inbox)
            await self.refresh(spec)
            if rebalance_every and time.monotonic() >= rebalance_at and not self.server.sessions:
                rebalance_at = time.monotonic() + rebalance_every
                await self._rebalance(spec)

    async def _initial_blocks(self, spec) -> tuple[int, int]:
        from ml.serve.announce import coverage
        from ml.serve.balance import choose_blocks
        from ml.serve.catalog import parse_blocks
        from node.ledger.errors import LedgerUnavailable

        text = self.config["blocks"]
        if not text.startswith("auto:"):
            return parse_blocks(text, spec.config.layers)
        count = min(int(text[5:]), spec.config.layers)
        try:
            known = coverage(await ledger_servers(self.node.ledger, self.node.host, spec, self.node.peer_id))
        except (LedgerUnavailable, OSError) as exc:
            log.warning("reading the serving coverage failed (%s); choosing without it", exc)
            known = []
        return choose_blocks(spec.config.layers, count, known)

    async def _load(self, spec, blocks: tuple[int, int]) -> None:
        from ml.serve import protocol
        from ml.serve.announce import own_throughput
        from ml.serve.server import BlockServer

        model = await asyncio.to_thread(spec.load_part, blocks, False, self.device)
        server = BlockServer(model, max_sessions=self.config["max_sessions"], profile=self.profile)
        billing = None
        if self.config["price"]:
            billing = protocol.Billing(self.node.identity, await self.node.ledger.chain_id(), self.config["price"],
                                       self.book, self.config["credit_tokens"])
        self.node.host.set_handler(protocol.PROTOCOL, protocol.make_handler(server, spec.model_id, billing,
                                                                                  self.node.host))
        self.server, self.blocks = server, blocks
        self.tokens_per_s = await asyncio.to_thread(own_throughput, server)
        await self.announce(spec)
        log.info("serving blocks", extra={"model": spec.model_id, "blocks": f"{blocks[0]}:{blocks[1]}",
                                          "tokens_per_s": round(self.tokens_per_s, 1)})

    async def announce(self, spec) -> None:
        """Add this range to the node record's hardware (contribution "serve") at the chain's height."""
        from ml.serve.announce import served_range
        from node.ledger.errors import LedgerUnavailable, TxFailed

        assert self.blocks is not None
        try:
            height = int(await self.node.ledger.call("dkb_blockNumber"))
            entry = served_range(spec.model_id, self.blocks[0], self.blocks[1], self.tokens_per_s,
                                 self.profile, self.config["price"], height)
            self.node.ledger.record.contribute(CONTRIBUTOR, roles=["compute"], hardware={"serving": [entry]})
            await self.node.ledger.record.sync()
            self.announced, self.last_error = height, None
        except (LedgerUnavailable, TxFailed, OSError, ValueError, TypeError) as exc:
            self.last_error = f"announcing failed: {exc}"
            log.warning("announcing the served range failed: %s", exc)

    async def refresh(self, spec) -> None:
        """Announce again when the last announcement is REFRESH_BLOCKS old (ADR 0177)."""
        from ml.serve.announce import needs_refresh
        from node.ledger.errors import LedgerUnavailable

        try:
            height = int(await self.node.ledger.call("dkb_blockNumber"))
        except (LedgerUnavailable, OSError, TypeError, ValueError):
            return
        if needs_refresh(self.announced, height):
            await self.announce(spec)

    async def _rebalance(self, spec) -> None:
        from ml.serve.announce import coverage
        from ml.serve.balance import should_move
        from node.ledger.errors import LedgerUnavailable

        assert self.blocks is not None
        try:
            others = coverage(await ledger_servers(self.node.ledger, self.node.host, spec, self.node.peer_id))
        except (LedgerUnavailable, OSError) as exc:
            log.warning("reading the serving coverage failed: %s", exc)
            return
        target = should_move(spec.config.layers, self.blocks, self.tokens_per_s, others)
        if target is not None:
            await self._load(spec, target)
