"""What one attempt of a round shares between its algorithms (butterfly, ring, all-gather), and
their helpers.

An attempt either fills `out` with the round's result or raises `PeerFailure` / `PlanMismatch`;
the group (group.py) turns those into a VIEW and a new attempt. Heavy tensor work goes through
`offload` (a thread pool; torch releases the GIL), never on the event loop.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ml.codecs.base import Codec

from .inbox import Inbox, PeerFailure
from .links import PeerLinks
from .plan import Plan
from .receipts import Receipt, WireSigner
from .wire import Frame, Kind, members_from_mask


class PlanMismatch(Exception):
    """A member planned this attempt over a different member set (its view diverged from ours)."""

    def __init__(self, peer: str, members: list[str]):
        super().__init__(f"{peer} planned over {len(members)} members")
        self.peer = peer
        self.members = members


@dataclass
class AttemptContext:
    me: str
    universe: list[str]            # the group's peers, sorted (member masks index into it)
    plan: Plan
    round_id: int
    attempt: int
    flat: torch.Tensor             # this peer's contribution, 1-D float32
    out: torch.Tensor              # the result is written here
    codec: Codec
    links: PeerLinks
    inbox: Inbox
    offload: Callable[..., Awaitable[Any]]
    started: float                 # loop time the attempt began
    stall_s: float                 # stall timeout for this attempt
    grace_s: float                 # extra wait for a member's first frame
    first_meta: dict[str, Any]     # meta sent with each first chunk (plan digest, shapes, members)
    agreed_rates: dict[str, float] = field(default_factory=dict)  # upload rates measured this attempt
    encoded: bytes | memoryview = b""  # all-gather: this peer's encoded contribution (flat is its decoding)
    piece_bytes: int = 0               # all-gather: frame size the encodings are cut into
    received: dict[str, Receipt] = field(default_factory=dict)  # sender -> what this peer got from it
    signer: WireSigner | None = None   # signs what this peer sends, checks what it receives (ADR 0209)

    def frame(self, kind: Kind, slot: int, chunk: int, payload: bytes | memoryview | tuple[Any, ...],
              meta: dict[str, Any] | None = None) -> Frame:
        return Frame(kind, self.round_id, self.attempt, slot, chunk, meta or {}, payload)

    async def take(self, kind: Kind, slot: int, chunk: int, sender: str, first: bool,
                   stall_factor: float = 1.0) -> Frame:
        since = self.started + (self.grace_s if first else 0.0)
        key = (self.round_id, self.attempt, kind, slot, chunk, sender)
        return await self.inbox.take(key, since, self.stall_s * stall_factor)

    def check_first_meta(self, sender: str, meta: dict[str, Any]) -> None:
        """Validate the meta of a member's first chunk: same tensor shapes, same plan."""
        if meta.get("shape") != self.first_meta["shape"]:
            raise PeerFailure(sender, "wrong-shape contribution (tensor layout differs)", bad_data=True)
        if meta.get("plan") != self.first_meta["plan"]:
            try:
                theirs = members_from_mask(meta.get("m"), self.universe)
            except ValueError:
                raise PeerFailure(sender, "malformed first-chunk meta", bad_data=True) from None
            if theirs == list(self.plan.members):
                raise PeerFailure(sender, "plan differs over the same members (codec, chunk size or rates)",
                                  bad_data=True)
            raise PlanMismatch(sender, theirs)


async def run_all(coros: Sequence[Awaitable[None]]) -> None:
    """Run coroutines concurrently; on the first failure cancel the rest and re-raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            error = task.exception()
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
