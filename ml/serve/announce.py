"""Serving announcements in the ledger node record (ADR 0174), and discovery from them.

A server publishes `hardware.serving`: a list of {model, start, end, tokens_per_s, profile, price,
height} (consensus/tx.py SERVED_RANGE) next to the rest of its record, and refreshes `height` every
REFRESH_BLOCKS blocks: the ledger leaves ranges older than `serve_announce_ttl` out (ADR 0177). A
client reads the records that announce a model (`dkb_listNodes` with `model`), learns the servers'
addresses from the same records, and still ranks them by its own measurement (`client.measure`):
the announced throughput only helps a joining server decide which blocks are thin
(`balance.choose_blocks`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ml.serve.client import ServerInfo
from ml.serve.server import BlockServer

MAX_TOKENS_PER_S = 10**9
# a server re-announces its range this many blocks after the height it last announced (ADR 0177), well
# within the ledger's serve_announce_ttl (default 600), after which discovery and referee draws drop it
REFRESH_BLOCKS = 100


def served_range(model: str, start: int, end: int, tokens_per_s: float, profile: str, price: int,
                 height: int | None = None) -> dict[str, Any]:
    """One `hardware.serving` entry (the ledger bounds each field); `height`: the chain height now."""
    if not 0 <= start < end:
        raise ValueError("a served range needs start < end")
    entry = {"model": model, "start": start, "end": end,
             "tokens_per_s": max(0, min(MAX_TOKENS_PER_S, int(tokens_per_s))), "profile": profile, "price": price}
    return entry if height is None else {**entry, "height": height}


def needs_refresh(announced_height: int | None, height: int) -> bool:
    """Whether a range announced at `announced_height` should be announced again at `height`."""
    return announced_height is None or height - announced_height >= REFRESH_BLOCKS


def own_throughput(server: BlockServer, tokens: int = 8, repeats: int = 3) -> float:
    """Tokens per second the server's blocks compute a stateless forward of `tokens` positions (best of
    `repeats`; blocking, torch)."""
    hidden = torch.zeros(1, tokens, server.config.width)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        server.forward(hidden)
        best = min(best, time.perf_counter() - began)
    return tokens / best


@dataclass(frozen=True)
class Announced:
    server: ServerInfo
    addrs: tuple[str, ...]
    tokens_per_s: int
    profile: str
    price: int


def announced_servers(nodes: list[Any], model: str, layers: int, exclude: str = "") -> list[Announced]:
    """The ranges of `model` announced in `nodes` (dkb_listNodes records), within 0..layers, skipping
    `exclude` (this node) and anything malformed."""
    out = []
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict) or not isinstance(node.get("peer_id"), str) or node["peer_id"] == exclude:
            continue
        hardware = node.get("hardware")
        if not isinstance(hardware, dict):
            hardware = {}
        addrs = tuple(a for a in node.get("listen_addrs") or [] if isinstance(a, str)) + tuple(
            a for a in node.get("relay_addrs") or [] if isinstance(a, str))
        for entry in hardware.get("serving") or []:
            if not isinstance(entry, dict) or entry.get("model") != model:
                continue
            start, end = entry.get("start"), entry.get("end")
            if type(start) is not int or type(end) is not int or not 0 <= start < end <= layers:
                continue
            profile = str(entry.get("profile", ""))
            out.append(Announced(ServerInfo(node["peer_id"], start, end, profile), addrs,
                                 int(entry.get("tokens_per_s") or 0), profile, int(entry.get("price") or 0)))
    return out


def coverage(announced: list[Announced]) -> list[tuple[int, int, float]]:
    """The (start, end, throughput) list `balance.choose_blocks` reads."""
    return [(a.server.start, a.server.end, float(a.tokens_per_s)) for a in announced]
