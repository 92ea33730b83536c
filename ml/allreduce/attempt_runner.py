"""One attempt of a round, as this peer runs it: the algorithm's data flow (butterfly, ring or
all-gather), PINGs to every member meanwhile, and how the attempt ended, told to the round core
(round_core.py): succeeded, failed (and whom this peer suspects), or ended by a result another
member committed. Stops early when a member's VIEW says the attempt failed for it, or when a
member's first chunk shows that it planned over other members.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from ml.codecs.base import Codec

from .attempt import AttemptContext, PlanMismatch
from .deadlines import DeadlinePolicy
from .inbox import PeerFailure
from .peer_io import PeerIO
from .receipts import Receipt
from .round_core import Action, RoundCore
from .view_exchange import Adopt
from .wire import Frame, Kind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contribution:
    """What this peer brings to a round and how its attempts combine it."""
    flat: torch.Tensor                                   # local values, 1-D float32
    shapes: list[tuple[int, ...]]
    algorithm: Callable[[AttemptContext], Awaitable[None]]
    codec: Codec
    codec_tag: str                                       # goes into the plan digest
    fault: str | None = None                             # why this peer cannot contribute
    encoded: bytes | memoryview = b""                    # all-gather: the encoding of `flat`
    piece_bytes: int = 0


class AttemptRunner:
    """Runs attempts one at a time. `ctx` is the attempt whose data flow runs now (None between);
    `receipts` are those of the last attempt that succeeded here (`receipts_attempt`)."""

    def __init__(self, io: PeerIO, policy: DeadlinePolicy, mode: str, adopt: Adopt):
        self._io = io
        self._policy = policy
        self._mode = mode
        self._adopt = adopt
        self.ctx: AttemptContext | None = None
        # done (with the error) on a first chunk of another plan
        self.misplanned: asyncio.Future[PeerFailure | PlanMismatch] | None = None
        self.receipts: tuple[Receipt, ...] = ()
        self.receipts_attempt = -1

    def forget_receipts(self) -> None:
        self.receipts, self.receipts_attempt = (), -1

    async def run(self, core: RoundCore, ctx: AttemptContext, contribution: Contribution) -> list[Action]:
        """Run the attempt's data flow; the core's actions for how it ended."""
        if contribution.fault is not None:
            return self._failed(core, ctx, {self._io.me: contribution.fault}, None)
        inbox = self._io.inbox
        task = asyncio.ensure_future(contribution.algorithm(ctx))
        heartbeat = asyncio.ensure_future(self._heartbeat(ctx))
        view = inbox.signal(ctx.round_id, ctx.attempt, Kind.VIEW)
        pushed = inbox.signal(ctx.round_id, None, Kind.COMMITTED)
        self.ctx = ctx
        misplanned = self.misplanned = asyncio.get_running_loop().create_future()
        self._check_first_chunks(ctx, misplanned)
        try:
            # A member's recorded fault (closed connection, junk) fails the attempt when we wait
            # on that member (Inbox.take), not before: a member that finished the round and left
            # may still have delivered everything we need from it.
            await asyncio.wait({task, view, pushed, misplanned}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.ctx = None
            heartbeat.cancel()
            if not task.done():
                task.cancel()
            await asyncio.wait({task})  # its outcome is read below; our own cancellation still propagates
            if task.cancelled() or task.exception() is not None:
                self._io.links.abandon(ctx.round_id, ctx.attempt)  # a committed attempt's frames still go out
        error = task.exception() if not task.cancelled() else None
        # a VIEW of this attempt or a COMMITTED of this round that is already here is read before
        # committing: its sender gave up this attempt (docs/adr/0141)
        if (not task.cancelled() and error is None and not inbox.pending(ctx.round_id, ctx.attempt, Kind.VIEW)
                and not inbox.pending(ctx.round_id, None, Kind.COMMITTED)):
            self.receipts = tuple(ctx.received[m] for m in sorted(ctx.received))
            self.receipts_attempt = ctx.attempt
            return core.attempt_succeeded(ctx.out, ctx.agreed_rates)
        if task.cancelled() and misplanned.done():
            error = misplanned.result()
        if isinstance(error, PeerFailure) and error.bad_data:
            core.distrust(error.peer)
        if pushed.done():
            adopted = await self._adopt(core, ctx)
            if adopted is not None:
                return adopted
        if isinstance(error, PeerFailure):
            return self._failed(core, ctx, {error.peer: error.reason}, None)
        if isinstance(error, PlanMismatch):
            return self._failed(core, ctx, {}, error.members)
        if error is not None:  # a local failure (e.g. our codec): leave the round, tell the others
            log.error("round %d: local failure in attempt %d: %r", ctx.round_id, ctx.attempt, error)
            return self._failed(core, ctx, {self._io.me: f"local failure: {type(error).__name__}: {error}"}, None)
        return self._failed(core, ctx, {}, None)

    def on_frame(self, sender: str, frame: Frame) -> None:
        """A frame just put in the inbox: a first chunk of the running attempt is checked at once."""
        ctx, misplanned = self.ctx, self.misplanned
        if (ctx is not None and misplanned is not None and frame.kind == Kind.PART and frame.chunk == 0
                and (frame.round_id, frame.attempt) == (ctx.round_id, ctx.attempt)):
            self._check_first_chunks(ctx, misplanned, sender)

    def _check_first_chunks(self, ctx: AttemptContext, misplanned: asyncio.Future[PeerFailure | PlanMismatch],
                            sender: str | None = None) -> None:
        """End the running attempt when a member's first chunk of it shows another plan.

        The data flow checks a first chunk when it takes it, but a member that planned over other
        members sends its chunks under slots this peer may never read (its shard numbers differ),
        while the PINGs keep both sides alive: without this check such an attempt waited forever
        (found by devtools/allreduce_sim, docs/adr/0116)."""
        if misplanned.done():
            return
        inbox = self._io.inbox
        for key in inbox.pending(ctx.round_id, ctx.attempt, Kind.PART):
            if key[4] != 0 or (sender is not None and key[-1] != sender):
                continue
            frame = inbox.peek(key)
            if frame is None or "plan" not in frame.meta:
                continue
            try:
                ctx.check_first_meta(key[-1], frame.meta)
            except (PeerFailure, PlanMismatch) as exc:
                misplanned.set_result(exc)
                return

    def _failed(self, core: RoundCore, ctx: AttemptContext, suspects: dict[str, str],
                their_members: list[str] | None) -> list[Action]:
        wrong_shapes = self._wrong_shapes_waiting(ctx)
        for peer in wrong_shapes:
            core.distrust(peer)
        suspects = {**wrong_shapes, **suspects}
        log.info("%s: round %d attempt %d failed for me, suspects %s", self._io.me, ctx.round_id, ctx.attempt,
                 suspects)
        return core.attempt_failed(suspects, their_members)

    async def _heartbeat(self, ctx: AttemptContext) -> None:
        """PING every member a few times per stall timeout: a member may have no data for us for a
        while (a reducer waiting on a slow contributor), and silence must mean a stall."""
        ping = Frame(Kind.PING, ctx.round_id, ctx.attempt, 0, 0)
        interval = max(0.05, self._policy.floor_s / 4)
        others = [m for m in ctx.plan.members if m != self._io.me]
        while True:
            for member in others:
                self._io.links.send_nowait(member, ping)
            await asyncio.sleep(interval)

    def _wrong_shapes_waiting(self, ctx: AttemptContext) -> dict[str, str]:
        """Members whose first chunk of this failed attempt, not yet checked, has other shapes.

        An attempt can be cut short (by another member's VIEW) before this peer checked every
        first chunk; accusing wrong-shape members anyway keeps them from outvoting honest ones.
        """
        wrong = {}
        inbox = self._io.inbox
        for key in inbox.pending(ctx.round_id, ctx.attempt, Kind.PART):
            # first chunks carry the meta: of every shard (butterfly), of ring step 0 only
            if key[4] == 0 and (self._mode == "butterfly" or key[3] == 0):
                frame = inbox.pop(key)
                if frame is not None and frame.meta.get("shape") != ctx.first_meta["shape"]:
                    wrong[key[-1]] = "wrong-shape contribution (tensor layout differs)"
        return wrong
