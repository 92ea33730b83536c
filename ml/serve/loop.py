"""The one serving loop (ADR 0171, 0173, 0176, 0177, 0201): a block server on a Host, its announcement,
claims, referee duty and rebalancing.

Both the node's `[serve]` section (ml/serve/service.py) and `dekube-node serve` (cli/serve.py) drive a
`ServingLoop`; they differ only in what they hand it: the Host, the ledger gateway (None: serve
without a ledger, nothing claimed or announced) and how the served range reaches the node record
(`publish`: the node's record publisher keeps the compute role's hardware; a standalone server keeps
what its record already says). `load` puts a range's blocks behind `/dekube/serve/1.0.0` and
announces it; every `claim_every` seconds `tick` expires idle sessions, claims the receipts, does the
referee duty for serving disputes, refreshes the announcement's height, and (with `rebalance_every`)
moves an idle server to thinner blocks. Torch is imported by the modules it calls, so this one is
imported only when serving.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ml.serve import protocol
from ml.serve.announce import (
    Announced,
    announced_servers,
    coverage,
    needs_refresh,
    own_throughput,
    served_range,
)
from ml.serve.balance import choose_blocks, should_move
from ml.serve.billing import ReceiptBook
from ml.serve.catalog import ModelSpec
from ml.serve.dispute import make_bundle_handler, referee_duty
from ml.serve.evidence import BUNDLE_PROTOCOL, Inbox
from ml.serve.handler import ServeHandler
from ml.serve.server import BlockServer
from node.identity import Identity
from node.ledger.errors import LedgerUnavailable, TxFailed
from node.ledger.gateway import LedgerGateway
from node.ledger.record import default_hardware
from node.p2p.host import Host

log = logging.getLogger(__name__)

CONTRIBUTOR = "serve"

# (served-range entry) -> None; raises LedgerUnavailable, TxFailed, OSError, ValueError or TypeError
Publish = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class ServeSettings:
    """What a server is told: sessions, price per GFLOP (0: free), credit, claim and rebalance periods."""

    max_sessions: int = 64
    price: int = 0
    credit_tokens: int = 1024
    claim_every: float = 30.0
    rebalance_every: float = 0.0
    lie_after: int | None = None     # TESTING ONLY: answer wrongly after this many steps (ADR 0176)


async def claim_receipts(gateway: LedgerGateway, book: ReceiptBook) -> int:
    """Claim every receipt of `book` not yet paid (a receipt already paid counts as claimed); the
    number claimed."""
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


async def ledger_servers(gateway: LedgerGateway, host: Host, spec: ModelSpec,
                         exclude: str = "") -> list[Announced]:
    """The servers of `spec`'s model the ledger announces (fresh ones), their addresses added to `host`.
    Raises LedgerUnavailable or OSError when the ledger cannot be read."""
    nodes = await gateway.call("dkb_listNodes", None, spec.model_id, 1000)
    found = announced_servers(nodes, spec.model_id, spec.config.layers, exclude)
    for item in found:
        if item.addrs:
            try:
                host.peerbook.add_addrs(item.server.peer_id, list(item.addrs))
            except ValueError:
                continue
    return found


def node_record_publisher(gateway: LedgerGateway) -> Publish:
    """Publish through the node's record publisher: contribution "serve" owns `hardware.serving`, the
    compute role's hardware is kept (ADR 0177 merges hardware key by key)."""
    async def publish(entry: dict[str, Any]) -> None:
        gateway.record.contribute(CONTRIBUTOR, roles=["compute"], hardware={"serving": [entry]})
        await gateway.record.sync()
    return publish


def standalone_publisher(gateway: LedgerGateway, host: Host, profile: str) -> Publish:
    """Publish for a server that is not a node: keep the hardware its record already has, add the
    execution profile, and the Host's listen addresses."""
    async def publish(entry: dict[str, Any]) -> None:
        current = await gateway.node_info(host.peer_id) or {}
        hardware = {**default_hardware(), **(current.get("hardware") or {}), "serving": [entry]}
        hardware["profiles"] = sorted(set(hardware.get("profiles", [])) | {profile})[:8]
        gateway.record.contribute(CONTRIBUTOR, roles=["compute"], listen_addrs=list(map(str, host.listen_addrs)),
                                  hardware=hardware)
        await gateway.record.sync()
    return publish


class ServingLoop:
    """One block server: what it serves, its receipts, its announcement and the disputes it referees."""

    def __init__(self, host: Host, gateway: LedgerGateway | None, identity: Identity, spec: ModelSpec,
                 settings: ServeSettings, device: str, profile: str, publish: Publish | None = None) -> None:
        self.host, self.gateway, self.identity, self.spec = host, gateway, identity, spec
        self.settings, self.device, self.profile = settings, device, profile
        self.publish = publish
        self.book = ReceiptBook()
        self.inbox = Inbox(gateway, host.peer_id)   # the dispute evidence clients deliver to us (ADR 0182)
        if gateway is not None:
            host.set_handler(BUNDLE_PROTOCOL, make_bundle_handler(inbox=self.inbox))
        self.server: BlockServer | None = None
        self.blocks: tuple[int, int] | None = None
        self.tokens_per_s = 0.0
        self.announced: int | None = None        # the height of the last announcement
        self.last_error: str | None = None

    async def coverage(self) -> list[tuple[int, int, float]]:
        """(start, end, tokens/s) the ledger's other servers of this model announce ([] without a
        ledger); raises LedgerUnavailable or OSError."""
        if self.gateway is None:
            return []
        return coverage(await ledger_servers(self.gateway, self.host, self.spec, self.host.peer_id))

    def choose(self, count: int, known: list[tuple[int, int, float]]) -> tuple[int, int]:
        """The `count` blocks that `known` servers cover least."""
        return choose_blocks(self.spec.config.layers, min(count, self.spec.config.layers), known)

    async def load(self, blocks: tuple[int, int]) -> None:
        """Serve `blocks` (replacing what was served), measure the throughput and announce the range."""
        model = await asyncio.to_thread(self.spec.load_part, blocks, False, self.device)
        server = BlockServer(model, max_sessions=self.settings.max_sessions, lie_after=self.settings.lie_after,
                             profile=self.profile)
        billing = None
        if self.settings.price:
            assert self.gateway is not None   # a paid server has a ledger (checked by whoever configures it)
            billing = protocol.Billing(self.identity, await self.gateway.chain_id(), self.settings.price, self.book,
                                       self.settings.credit_tokens)
        self.host.set_handler(protocol.PROTOCOL, ServeHandler(server, self.spec.model_id, billing,
                                                                       self.host))
        self.server, self.blocks = server, blocks
        self.tokens_per_s = await asyncio.to_thread(own_throughput, server)
        await self.announce()
        log.info("serving blocks", extra={"model": self.spec.model_id, "blocks": f"{blocks[0]}:{blocks[1]}",
                                          "tokens_per_s": round(self.tokens_per_s, 1)})

    async def announce(self) -> None:
        """Add this range to the node record (hardware.serving) at the chain's height; `announced` is that
        height, or stays as it was (and `last_error` says why) when the ledger refused or is unreachable."""
        if self.gateway is None or self.publish is None or self.blocks is None:
            return
        try:
            height = int(await self.gateway.call("dkb_blockNumber"))
            await self.publish(served_range(self.spec.model_id, self.blocks[0], self.blocks[1], self.tokens_per_s,
                                            self.profile, self.settings.price, height))
            self.announced, self.last_error = height, None
        except (LedgerUnavailable, TxFailed, OSError, ValueError, TypeError) as exc:
            self.last_error = f"announcing failed: {exc}"
            log.warning("announcing the served range on the ledger failed: %s", exc)

    async def run(self, on_moved: Callable[[tuple[int, int]], None] | None = None) -> NoReturn:
        """Tick every claim period until cancelled; `on_moved(blocks)` after a rebalance moved the server."""
        rebalance_every = self.settings.rebalance_every
        rebalance_at = time.monotonic() + rebalance_every
        while True:
            await asyncio.sleep(min(self.settings.claim_every, rebalance_every or self.settings.claim_every))
            if self.server is not None:
                self.server.expire()
            if self.gateway is None:
                continue
            await claim_receipts(self.gateway, self.book)
            if self.server is not None:   # serving disputes that drew us (ADR 0176)
                await referee_duty(self.gateway, self.host, self.server.model, self.inbox)
            await self.refresh()
            if (rebalance_every and time.monotonic() >= rebalance_at and self.server is not None
                    and not self.server.sessions):
                rebalance_at = time.monotonic() + rebalance_every
                if await self.rebalance() and on_moved is not None and self.blocks is not None:
                    on_moved(self.blocks)

    async def refresh(self) -> None:
        """Announce again when the last announcement is REFRESH_BLOCKS old (ADR 0177)."""
        if self.gateway is None:
            return
        try:
            height = int(await self.gateway.call("dkb_blockNumber"))
        except (LedgerUnavailable, OSError, TypeError, ValueError):
            return
        if needs_refresh(self.announced, height):
            await self.announce()

    async def rebalance(self) -> bool:
        """Move to the range that lifts the swarm's weakest block (Petals' rule, ADR 0173); whether it moved."""
        if self.blocks is None:
            return False
        try:
            others = await self.coverage()
        except (LedgerUnavailable, OSError) as exc:
            log.warning("reading the serving coverage failed: %s", exc)
            return False
        target = should_move(self.spec.config.layers, self.blocks, self.tokens_per_s, others)
        if target is None:
            return False
        await self.load(target)
        return True

    async def close(self) -> None:
        """Claim what is left (at exit)."""
        if self.gateway is not None:
            await claim_receipts(self.gateway, self.book)
