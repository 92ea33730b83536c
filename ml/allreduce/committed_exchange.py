"""Committed results: pushed to members that are still on a round this peer committed, and
adopted when another member pushes one (docs/adr/0033, 0092), also by a live member the others left
out of the round, which asks for it (docs/adr/0242).

A committed result goes as raw float32 chunks of `chunk_numel` values, the first with the
attempt, participants, exclusions and agreed rates; a receiver checks the layout and that every
value is finite before the round core may adopt it.
"""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import torch

from ml.codecs.base import all_finite

from .attempt import AttemptContext
from .inbox import PeerFailure
from .peer_io import PeerIO
from .round_core import Action, AwaitResult, Committed, CommittedRounds, RoundCore, SendView
from .wire import Frame, FrameError, Kind, members_from_mask, members_mask

log = logging.getLogger(__name__)
FIRST_ASK_S = 0.25   # a member that cannot go on asks again after this, then twice as long each time,
LAST_ASK_S = 2.0     # up to this


def result_wait_s(first_frame_grace_s: float, stall_s: float) -> float:
    """How long a member that cannot go on asks for the others' result: as long as they may take to
    finish their next attempt without it (docs/adr/0242)."""
    return first_frame_grace_s + 3 * stall_s


class CommittedExchange:
    def __init__(self, io: PeerIO):
        self._io = io
        self.rounds = CommittedRounds(io.me)

    def remember(self, round_id: int, committed: Committed) -> None:
        self.rounds.remember(round_id, committed)
        # members that gave up on this round before we committed get the result now
        inbox = self._io.inbox
        for key in inbox.pending(round_id, None, Kind.VIEW) + inbox.pending(round_id, None, Kind.PART):
            if CommittedRounds.asks_for_result(committed, key[2] == Kind.VIEW, key[2] == Kind.PART, key[1]):
                self.push(round_id, key[-1])

    def answer(self, sender: str, frame: Frame) -> bool:
        """A frame of a round this peer committed: note its sender alive and push it the result if it
        asks for it. True when that settles the frame (anything but a COMMITTED of that round)."""
        committed = self.rounds.get(frame.round_id)
        if committed is None:
            return False
        self._io.inbox.note_alive(sender, frame.round_id)  # still finishing a round we are past
        if CommittedRounds.asks_for_result(committed, frame.kind == Kind.VIEW, frame.kind == Kind.PART,
                                           frame.attempt):
            self.push(frame.round_id, sender)
        return frame.kind != Kind.COMMITTED

    def push(self, round_id: int, peer: str) -> None:
        committed = self.rounds.claim_push(round_id, peer)
        if committed is not None:
            self._io.spawn(self._send(round_id, committed, peer))

    async def _send(self, round_id: int, committed: Committed, peer: str) -> None:
        io = self._io
        flat = committed.result
        starts = range(0, flat.numel(), io.chunk_numel)
        index = {p: i for i, p in enumerate(io.peers)}
        meta = {"attempt": committed.attempt, "m": members_mask(list(committed.participants), io.peers),
                "why": {str(index[p]): r for p, r in committed.excluded.items() if p in index},
                "numel": flat.numel(), "chunks": len(starts),
                "rates": {str(index[p]): r for p, r in committed.rates.items() if p in index}}
        for c, start in enumerate(starts):
            payload = await io.offload(_raw_bytes, flat[start:start + io.chunk_numel])
            await io.links.send(peer, Frame(Kind.COMMITTED, round_id, 0, 0, c, meta if c == 0 else {}, payload))

    async def adopt(self, core: RoundCore, ctx: AttemptContext) -> list[Action] | None:
        """Take a result another member committed for this round (the core's actions), or None if
        none is usable; the core refuses members caught sending bad data (docs/adr/0092)."""
        inbox = self._io.inbox
        for key in inbox.pending(ctx.round_id, None, Kind.COMMITTED):
            sender = key[-1]
            if key[4] != 0 or not core.may_adopt(sender):
                continue
            first = inbox.pop(key)
            if first is None:
                continue
            try:
                committed = await self._receive(ctx, sender, first)
            except (PeerFailure, FrameError, ValueError, KeyError) as exc:
                log.warning("round %d: unusable committed result from %s: %s", ctx.round_id, sender, exc)
                core.distrust(sender)
                continue
            return core.adopted(sender, committed)
        for key in inbox.pending(ctx.round_id, None, Kind.COMMITTED):  # all from refused senders
            inbox.pop(key)
        inbox.clear_signal(ctx.round_id, None, Kind.COMMITTED)
        return None

    async def await_result(self, core: RoundCore, ctx: AttemptContext, wait: AwaitResult,
                           send_view: Callable[[RoundCore, SendView], None], wait_s: float) -> list[Action]:
        """This live member cannot go on with the round (left out, or alone: a link failed for a moment,
        docs/adr/0242): ask the others for the result they commit without it, with its VIEW sent again as
        one of an attempt no round runs (any VIEW of a round a member committed gets it pushed: `answer`,
        `remember`), until a result is adopted (as in `adopt`) or `wait_s` passed: then the core gives up
        (the round fails)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        log.info("round %d cannot go on here (%s); asking %s for their result", ctx.round_id, core.shut_out,
                 list(wait.members))
        ask_s = FIRST_ASK_S
        while True:
            for member in wait.members:
                send_view(core, SendView(member, wait.attempt, wait.alive, wait.why))
            pushed = self._io.inbox.signal(ctx.round_id, None, Kind.COMMITTED)
            left = deadline - loop.time()
            if left > 0:
                await asyncio.wait({pushed}, timeout=min(ask_s, left))
            if pushed.done():
                for member in wait.members:   # a link that failed before may carry the push now
                    self._io.inbox.forgive_link_fault(member, ctx.round_id)
                adopted = await self.adopt(core, ctx)
                if adopted is not None:
                    return adopted
            if loop.time() >= deadline:
                log.warning("round %d: no result from %s within %.1f s", ctx.round_id, list(wait.members), wait_s)
                return core.gave_up()
            ask_s = min(2 * ask_s, LAST_ASK_S)

    async def _receive(self, ctx: AttemptContext, sender: str, first: Frame) -> Committed:
        io, peers = self._io, self._io.peers
        meta = first.meta
        numel = ctx.flat.numel()
        chunks = math.ceil(numel / io.chunk_numel)
        if meta.get("numel") != numel or meta.get("chunks") != chunks or not isinstance(meta.get("attempt"), int):
            raise ValueError("committed result of another layout")
        participants = tuple(members_from_mask(meta.get("m"), peers))
        why = meta.get("why")
        why = why if isinstance(why, dict) else {}
        excluded = {peers[int(i)]: str(r) for i, r in why.items() if i.isdigit() and int(i) < len(peers)}
        rates_meta = meta.get("rates")
        rates_meta = rates_meta if isinstance(rates_meta, dict) else {}
        rates = {peers[int(i)]: float(r) for i, r in rates_meta.items()
                 if i.isdigit() and int(i) < len(peers) and isinstance(r, (int, float)) and r > 0}
        out = torch.empty_like(ctx.flat)
        loop = asyncio.get_running_loop()
        for c in range(chunks):
            frame = first if c == 0 else await io.inbox.take(
                (ctx.round_id, 0, Kind.COMMITTED, 0, c, sender), loop.time(), io.estimator.stall_timeout())
            start = c * io.chunk_numel
            stop = min(start + io.chunk_numel, numel)
            out[start:stop] = await io.offload(_from_raw, frame.payload, stop - start, sender)
        return Committed(meta["attempt"], participants, excluded, out, rates)


def _raw_bytes(values: torch.Tensor) -> bytes:
    return values.contiguous().numpy().tobytes()


def _from_raw(payload: bytes, numel: int, sender: str) -> torch.Tensor:
    if len(payload) != numel * 4:
        raise PeerFailure(sender, f"committed chunk of {len(payload)} bytes, expected {numel * 4}")
    values = torch.frombuffer(bytearray(payload), dtype=torch.float32)
    if not all_finite(values):
        raise PeerFailure(sender, "non-finite values in committed result")
    return values
