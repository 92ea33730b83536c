"""The VIEW exchange after a failed attempt: this peer's view goes to every member, and each
member's view (or its absence) is reported to the round core, which makes the views one member set
(round_core.py). A result another member committed meanwhile is adopted instead (docs/adr/0033).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .attempt import AttemptContext
from .inbox import PeerFailure
from .peer_io import PeerIO
from .round_core import Action, AwaitViews, RoundCore, SendView, View
from .wire import Frame, FrameError, Kind, members_from_mask, members_mask

Adopt = Callable[[RoundCore, AttemptContext], Awaitable[list[Action] | None]]


class ViewExchange:
    def __init__(self, io: PeerIO, adopt: Adopt):
        self._io = io
        self._adopt = adopt

    def send(self, core: RoundCore, view: SendView) -> None:
        # each on its own: a member that stopped reading (SIGSTOP) fills its send queue,
        # and waiting on it must not keep the VIEW from the others (docs/adr/0093)
        self._io.spawn(self._io.links.send(view.to, self._frame(core, view)))

    def _frame(self, core: RoundCore, view: SendView) -> Frame:
        peers = self._io.peers
        index = {p: i for i, p in enumerate(peers)}
        meta = {"alive": members_mask(list(view.alive), peers), "shape": core.shape,
                "why": {str(index[p]): r[:200] for p, r in view.why.items()}}
        return Frame(Kind.VIEW, core.round_id, view.attempt, 0, 0, meta)

    async def collect(self, core: RoundCore, ctx: AttemptContext, wait: AwaitViews) -> list[Action]:
        """Report each member's VIEW (or its absence) to the core, or adopt a commit pushed to us
        meanwhile; the core's actions."""
        inbox = self._io.inbox
        actions: list[Action] = []
        waits = {asyncio.ensure_future(self._take(ctx, m)): m for m in wait.members}
        pushed = inbox.signal(ctx.round_id, None, Kind.COMMITTED)
        try:
            while waits:
                done, _ = await asyncio.wait({*waits, pushed}, return_when=asyncio.FIRST_COMPLETED)
                if pushed.done():
                    adopted = await self._adopt(core, ctx)
                    if adopted is not None:
                        return adopted
                    pushed = inbox.signal(ctx.round_id, None, Kind.COMMITTED)
                for task in done:
                    if task not in waits:
                        continue
                    member = waits.pop(task)
                    try:
                        actions += core.view_received(member, wait.attempt, task.result())
                    except PeerFailure as exc:
                        actions += core.view_missing(member, wait.attempt, exc.reason)
        finally:
            for task in waits:
                task.cancel()
        return actions

    async def _take(self, ctx: AttemptContext, member: str) -> View:
        io, peers = self._io, self._io.peers
        loop = asyncio.get_running_loop()
        frame = await io.inbox.take((ctx.round_id, ctx.attempt, Kind.VIEW, 0, 0, member),
                                    loop.time(), io.estimator.stall_timeout())
        try:
            alive = set(members_from_mask(frame.meta.get("alive"), peers))
        except FrameError as exc:
            raise PeerFailure(member, f"malformed view: {exc}") from None
        why = frame.meta.get("why")
        why = why if isinstance(why, dict) else {}
        reasons = {peers[int(i)]: str(r)[:200] for i, r in why.items()
                   if isinstance(i, str) and i.isdigit() and int(i) < len(peers)}
        return alive, reasons, str(frame.meta.get("shape"))
