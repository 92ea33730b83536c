"""AllReduceGroup: rounds of fault-tolerant all-reduce (mean) among an agreed set of peers.

A round runs attempts. Attempt 0 includes every group peer. An attempt either completes (every
reducer's result arrived) and the round commits, or fails for this peer (a member stalled past its
adaptive deadline, sent bad data, or planned differently; or another member sent a VIEW saying the
attempt failed for it). On failure a peer broadcasts a VIEW (the members it still considers alive
and why it dropped the others) and waits for the VIEWs of those members; the next attempt runs
over the intersection of all views received, minus members whose view did not arrive. All
survivors see the same views, so they converge on one member set; a later attempt that still
disagrees is caught by the plan digest and shrinks the set again. A peer that committed a round
answers any VIEW or later-attempt frame of that round with the committed result (COMMITTED), and
a peer that has not committed adopts it, so peers that saw a reducer die mid-broadcast still end
with the same result as those that got everything. See docs/adr/0033.

Those decisions are made by the sans-I/O `RoundCore` (round_core.py, docs/adr/0115); this module
is its asyncio driver: it runs each attempt's data flow, sends the VIEWs and waits for them and
for pushed results, and reports what happened to the core. devtools/allreduce_sim runs the same
core under a simulated network and clock (docs/adr/0116).

`allgather_mean` runs the same rounds over contributions their owners encoded (top-k, sign with
error feedback): every member gets every encoding and averages their decodings (docs/adr/0091).
"""
from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ml.codecs import get_codec
from ml.codecs.base import Codec, CodecError, all_finite

from .allgather import run_allgather
from .attempt import AttemptContext, PlanMismatch
from .butterfly import run_butterfly
from .deadlines import DeadlinePolicy, StallEstimator
from .inbox import Inbox, PeerFailure
from .links import PeerLinks
from .plan import Plan, make_plan
from .receipts import Receipt
from .ring import RING_CODECS, run_ring
from .round_core import (
    AllReduceError,
    AwaitViews,
    CommitRound,
    Committed,
    CommittedRounds,
    ExcludedFromRound,
    FailRound,
    RoundCore,
    SendView,
    StartAttempt,
    next_rates,
)
from .transport import Stream, Transport
from .wire import (
    DEFAULT_MAX_PAYLOAD,
    Frame,
    FrameError,
    Kind,
    members_from_mask,
    members_mask,
    read_frame,
)

PROTOCOL = "/dekube/allreduce/1"
DEFAULT_DEADLINES = DeadlinePolicy()  # frozen, so one shared default is safe
log = logging.getLogger(__name__)
__all__ = ["PROTOCOL", "AllReduceError", "AllReduceGroup", "AllReduceResult", "ExcludedFromRound"]


@dataclass(frozen=True)
class AllReduceResult:
    tensors: list[torch.Tensor]          # the mean, one float32 tensor per input, same shapes
    participants: tuple[str, ...]        # whose contributions the mean is over (sorted)
    round_id: int
    attempts: int                        # 1 when no member failed
    excluded: dict[str, str] = field(default_factory=dict)  # peer -> why it was left out
    bytes_sent: int = 0                  # by this peer during the round
    received: tuple[Receipt, ...] = ()   # what this peer got from each sender in the committed attempt

    def includes(self, peer: str) -> bool:
        return peer in self.participants


@dataclass(frozen=True)
class _Contribution:
    """What this peer brings to a round and how its attempts combine it."""
    flat: torch.Tensor                                   # local values, 1-D float32
    shapes: list[tuple]
    algorithm: Callable[[AttemptContext], Awaitable[None]]
    codec: Codec
    codec_tag: str                                       # goes into the plan digest
    fault: str | None = None                             # why this peer cannot contribute
    encoded: bytes | memoryview = b""                    # all-gather: the encoding of `flat`
    piece_bytes: int = 0


class AllReduceGroup:
    """Averages lists of float32 tensors with the same peers, round after round.

    transport: see transport.py. my_id: this peer's id (one of `peers`). peers: the agreed
    membership (change it between rounds with `set_peers`). mode: "butterfly" (any codec) or
    "ring" (fp32/fp16/bf16). codec: an ml.codecs name for contributions and results.
    non_reducers: members that only send and receive (NAT'd or slow). chunk_numel: pipelining
    unit. deadlines: stall detection. min_participants: below this a round raises AllReduceError.
    upload_rates: a starting rate table (bytes/s), replaced by measurements. workers: threads for
    encode/decode/reduce. One group per protocol id and transport; rounds run one at a time.
    """

    def __init__(self, transport: Transport, my_id: str, peers: list[str], *, mode: str = "butterfly",
                 codec: str = "fp32", non_reducers: set[str] | frozenset = frozenset(),
                 chunk_numel: int = 1 << 18, deadlines: DeadlinePolicy = DEFAULT_DEADLINES,
                 min_participants: int = 2, max_frame_bytes: int = DEFAULT_MAX_PAYLOAD,
                 protocol: str = PROTOCOL, workers: int = 2, upload_rates: dict[str, float] | None = None):
        if mode not in ("butterfly", "ring"):
            raise ValueError(f"mode must be 'butterfly' or 'ring', not {mode!r}")
        if mode == "ring" and codec not in RING_CODECS:
            raise ValueError(f"ring re-encodes partial sums at every hop: use one of {RING_CODECS} "
                             f"or the butterfly for {codec!r}")
        if mode == "ring" and non_reducers:
            raise ValueError("ring mode has no non-reducers: every member reduces a shard")
        self._codec = get_codec(codec)
        if self._codec.max_encoded_size(chunk_numel) > max_frame_bytes:
            raise ValueError("chunk_numel encodes to more than max_frame_bytes")
        self.my_id = my_id
        self.mode = mode
        self.codec_name = codec
        self.non_reducers = frozenset(non_reducers)
        self.chunk_numel = chunk_numel
        self.min_participants = min_participants
        # called with (seconds, result) after each round that committed (e.g. a metrics histogram)
        self.round_observer: Callable[[float, AllReduceResult], None] | None = None
        self._transport = transport
        self._protocol = protocol
        self._max_frame = max_frame_bytes
        self._estimator = StallEstimator(deadlines)
        self._policy = deadlines
        self._inbox = Inbox(self._estimator)
        self._links = PeerLinks(transport, protocol, self._on_link_broken)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="allreduce")
        self._peers: list[str] = []
        self.set_peers(peers)
        self._rates: dict[str, float] = dict(upload_rates or {})  # replaced by measurements each round
        self._current_round = -1
        self._round_active = False
        self._committed = CommittedRounds(my_id)
        self._core: RoundCore | None = None  # the current (or last) round's protocol state
        self._attempt_ctx: AttemptContext | None = None  # the attempt whose data flow runs now
        self._misplanned: asyncio.Future | None = None  # done (with the error) on a first chunk of another plan
        self._background: set[asyncio.Task] = set()
        self._started = False
        self._receipts: tuple[Receipt, ...] = ()  # the last attempt that succeeded here: its receipts
        self._receipts_attempt = -1

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._transport.set_handler(self._protocol, self._on_stream)
        self._started = True

    async def close(self, linger_s: float = 30.0) -> None:
        """Stop, after at most `linger_s` seconds spent delivering frames still queued (results
        this peer reduced may still be on their way to slower members)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + linger_s
        await self._links.flush(linger_s)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._links.close(grace_s=max(1.0, deadline - loop.time()))
        self._pool.shutdown(wait=False, cancel_futures=True)

    def set_peers(self, peers: list[str]) -> None:
        """Change the membership (joins and leaves) between rounds; includes this peer.

        A changed membership resets the agreed upload rates (a joiner has none), so the next
        round splits shards evenly and measures again.
        """
        peers = sorted(set(peers))
        if self.my_id not in peers:
            raise ValueError("the group's peers must include this peer")
        if self._peers and peers != self._peers:
            self._rates = {}
        self._peers = peers

    @property
    def peers(self) -> list[str]:
        return list(self._peers)

    @property
    def upload_rates(self) -> dict[str, float]:
        """The agreed upload rates (bytes/s) the next round's shard sizes are proportional to."""
        return dict(self._rates)

    # -- the round -------------------------------------------------------------------------

    async def allreduce(self, tensors: list[torch.Tensor], round_id: int) -> AllReduceResult:
        """The mean of every peer's `tensors` (same shapes everywhere) for round `round_id`.

        Round ids must increase from call to call and agree among the peers. The tensors are read
        during the call (a single float32 tensor is not copied): do not modify them until it returns.
        """
        self._check_round(round_id)
        shapes = [tuple(t.shape) for t in tensors]
        flat = await self._offload(_flatten, tensors)
        finite = await self._offload(all_finite, flat)
        algorithm = run_ring if self.mode == "ring" else run_butterfly
        return await self._round(_Contribution(
            flat, shapes, algorithm, self._codec, self.codec_name,
            fault=None if finite else "non-finite values (NaN/Inf) in local contribution"), round_id)

    async def allgather_mean(self, encoded: bytes | None, codec: Codec, shapes: list[tuple[int, ...]],
                             round_id: int) -> AllReduceResult:
        """The mean of every peer's contribution, each sent as its owner encoded it (docs/adr/0091).

        `encoded`: this peer's contribution, `codec.encode` of the flattened float32 values of
        tensors with `shapes` (the caller keeps any error feedback), or None when it has none this
        round (e.g. its values were not finite): the others then exclude it and this call raises
        ExcludedFromRound. Every member decodes every contribution, its own included, and sums
        them in sorted member order: all survivors hold the same bits. The group's mode and codec
        do not apply; round ids are shared with `allreduce`. Same faults, attempts and agreement
        as `allreduce`; `bytes_sent` is about (members - 1) encodings.
        """
        self._check_round(round_id)
        shapes = [tuple(s) for s in shapes]
        numel = sum(math.prod(s) for s in shapes)
        flat, fault = await self._offload(_decode_own, codec, encoded, numel)
        piece = min(4 * self.chunk_numel, self._max_frame)
        # "allgather2": members confirm every contribution before finishing (docs/adr/0141); the plan
        # digest differs from members without the confirmation, which are caught on the first chunk
        return await self._round(_Contribution(
            flat, shapes, run_allgather, codec, f"allgather2:{codec!r}:{piece}", fault=fault,
            encoded=encoded or b"", piece_bytes=piece), round_id)

    def _check_round(self, round_id: int) -> None:
        if not self._started:
            raise RuntimeError("call start() first")
        if round_id <= self._current_round:
            raise ValueError(f"round {round_id} is not after round {self._current_round}")

    async def _round(self, contribution: _Contribution, round_id: int) -> AllReduceResult:
        started = time.monotonic()
        result = await self._run_round(contribution, round_id)
        if self.round_observer is not None:
            self.round_observer(time.monotonic() - started, result)
        return result

    async def _run_round(self, contribution: _Contribution, round_id: int) -> AllReduceResult:
        self._current_round = round_id
        self._round_active = True
        self._inbox.forget_before(round_id)
        bytes_before = self._links.bytes_sent
        shape_digest = hashlib.blake2b(json.dumps(contribution.shapes).encode(), digest_size=8).hexdigest()
        self._receipts, self._receipts_attempt = (), -1
        core = self._core = RoundCore(self.my_id, self._peers, round_id, shape_digest,
                                      min_participants=self.min_participants, fault=contribution.fault)
        try:
            committed = await self._drive(core, contribution)
        except AllReduceError:
            self._rates = next_rates(self._rates, self._peers, None)
            raise
        finally:
            self._round_active = False
        self._rates = next_rates(self._rates, self._peers, committed)
        return AllReduceResult(_unflatten(committed.result, contribution.shapes), committed.participants,
                               round_id, committed.attempt + 1, dict(committed.excluded),
                               self._links.bytes_sent - bytes_before,
                               self._receipts if committed.attempt == self._receipts_attempt else ())

    async def _drive(self, core: RoundCore, contribution: _Contribution) -> Committed:
        """Carry out the core's actions until it commits the round or fails it."""
        actions = collections.deque(core.start())
        ctx: AttemptContext | None = None
        while True:
            action = actions.popleft()
            if isinstance(action, CommitRound):
                self._remember(core.round_id, action.committed)
                return action.committed
            if isinstance(action, FailRound):
                raise action.error
            if isinstance(action, StartAttempt):
                if action.attempt > 0:
                    log.info("round %d attempt %d over %s, excluded %s", core.round_id, action.attempt,
                             list(action.members), core.excluded)
                ctx = self._context(contribution, list(action.members), core.shape, core.round_id, action.attempt)
                self._inbox.forget_before(core.round_id, action.attempt)
                actions.extend(await self._run_attempt(core, ctx, contribution))
            elif isinstance(action, SendView):
                # each on its own: a member that stopped reading (SIGSTOP) fills its send queue,
                # and waiting on it must not keep the VIEW from the others (docs/adr/0093)
                self._spawn(self._links.send(action.to, self._view_frame(core, action)))
            elif isinstance(action, AwaitViews):
                actions.extend(await self._collect_views(core, ctx, action))

    def _context(self, contribution: _Contribution, members, shape_digest, round_id, attempt) -> AttemptContext:
        flat = contribution.flat
        plan = self._plan(members, flat.numel(), contribution)
        stall_s = self._estimator.stall_timeout()  # later attempts: members leave the VIEW wait up to this apart
        meta = {"plan": plan.digest(), "shape": shape_digest, "m": members_mask(members, self._peers)}
        return AttemptContext(
            me=self.my_id, universe=self._peers, plan=plan, round_id=round_id, attempt=attempt,
            flat=flat, out=torch.empty_like(flat), codec=contribution.codec, links=self._links,
            inbox=self._inbox, offload=self._offload, started=asyncio.get_running_loop().time(),
            stall_s=stall_s,
            grace_s=self._policy.first_frame_grace_s if attempt == 0 else stall_s, first_meta=meta,
            encoded=contribution.encoded, piece_bytes=contribution.piece_bytes)

    def _plan(self, members: list[str], numel: int, contribution: _Contribution) -> Plan:
        if contribution.algorithm is run_allgather:  # no shards: the layout is the members and codec
            return make_plan(members, set(), {}, numel, self.chunk_numel, contribution.codec_tag)
        non_reducers = set() if self.mode == "ring" else set(self.non_reducers)
        return make_plan(members, non_reducers, self._rates, numel, self.chunk_numel, contribution.codec_tag)

    async def _run_attempt(self, core: RoundCore, ctx: AttemptContext, contribution: _Contribution) -> list:
        """Run the attempt's data flow; the core's actions for how it ended."""
        if contribution.fault is not None:
            return self._attempt_failed(core, ctx, {self.my_id: contribution.fault}, None)
        task = asyncio.ensure_future(contribution.algorithm(ctx))
        heartbeat = asyncio.ensure_future(self._heartbeat(ctx))
        view = self._inbox.signal(ctx.round_id, ctx.attempt, Kind.VIEW)
        pushed = self._inbox.signal(ctx.round_id, None, Kind.COMMITTED)
        self._attempt_ctx = ctx
        self._misplanned = asyncio.get_running_loop().create_future()
        self._check_first_chunks(ctx)
        try:
            # A member's recorded fault (closed connection, junk) fails the attempt when we wait
            # on that member (Inbox.take), not before: a member that finished the round and left
            # may still have delivered everything we need from it.
            await asyncio.wait({task, view, pushed, self._misplanned}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._attempt_ctx = None
            heartbeat.cancel()
            if not task.done():
                task.cancel()
            await asyncio.wait({task})  # its outcome is read below; our own cancellation still propagates
            if task.cancelled() or task.exception() is not None:
                self._links.abandon(ctx.round_id, ctx.attempt)  # a committed attempt's frames still go out
        error = task.exception() if not task.cancelled() else None
        # a VIEW of this attempt or a COMMITTED of this round that is already here is read before
        # committing: its sender gave up this attempt (docs/adr/0141)
        if (not task.cancelled() and error is None and not self._inbox.pending(ctx.round_id, ctx.attempt, Kind.VIEW)
                and not self._inbox.pending(ctx.round_id, None, Kind.COMMITTED)):
            self._receipts = tuple(ctx.received[m] for m in sorted(ctx.received))
            self._receipts_attempt = ctx.attempt
            return core.attempt_succeeded(ctx.out, ctx.agreed_rates)
        if task.cancelled() and self._misplanned.done():
            error = self._misplanned.result()
        if isinstance(error, PeerFailure) and error.bad_data:
            core.distrust(error.peer)
        if pushed.done():
            adopted = await self._adopt(core, ctx)
            if adopted is not None:
                return adopted
        if isinstance(error, PeerFailure):
            return self._attempt_failed(core, ctx, {error.peer: error.reason}, None)
        if isinstance(error, PlanMismatch):
            return self._attempt_failed(core, ctx, {}, error.members)
        if error is not None:  # a local failure (e.g. our codec): leave the round, tell the others
            log.error("round %d: local failure in attempt %d: %r", ctx.round_id, ctx.attempt, error)
            return self._attempt_failed(core, ctx, {self.my_id: f"local failure: {type(error).__name__}: {error}"},
                                        None)
        return self._attempt_failed(core, ctx, {}, None)

    def _check_first_chunks(self, ctx: AttemptContext, sender: str | None = None) -> None:
        """End the running attempt when a member's first chunk of it shows another plan.

        The data flow checks a first chunk when it takes it, but a member that planned over other
        members sends its chunks under slots this peer may never read (its shard numbers differ),
        while the PINGs keep both sides alive: without this check such an attempt waited forever
        (found by devtools/allreduce_sim, docs/adr/0116)."""
        if self._misplanned.done():
            return
        for key in self._inbox.pending(ctx.round_id, ctx.attempt, Kind.PART):
            if key[4] != 0 or (sender is not None and key[-1] != sender):
                continue
            frame = self._inbox.peek(key)
            if frame is None or "plan" not in frame.meta:
                continue
            try:
                ctx.check_first_meta(key[-1], frame.meta)
            except (PeerFailure, PlanMismatch) as exc:
                self._misplanned.set_result(exc)
                return

    def _attempt_failed(self, core: RoundCore, ctx: AttemptContext, suspects: dict[str, str],
                        their_members: list[str] | None) -> list:
        wrong_shapes = self._wrong_shapes_waiting(ctx)
        for peer in wrong_shapes:
            core.distrust(peer)
        suspects = {**wrong_shapes, **suspects}
        log.info("%s: round %d attempt %d failed for me, suspects %s", self.my_id, ctx.round_id, ctx.attempt, suspects)
        return core.attempt_failed(suspects, their_members)

    async def _heartbeat(self, ctx: AttemptContext) -> None:
        """PING every member a few times per stall timeout: a member may have no data for us for a
        while (a reducer waiting on a slow contributor), and silence must mean a stall."""
        ping = Frame(Kind.PING, ctx.round_id, ctx.attempt, 0, 0)
        interval = max(0.05, self._policy.floor_s / 4)
        others = [m for m in ctx.plan.members if m != self.my_id]
        while True:
            for member in others:
                self._links.send_nowait(member, ping)
            await asyncio.sleep(interval)

    def _wrong_shapes_waiting(self, ctx: AttemptContext) -> dict[str, str]:
        """Members whose first chunk of this failed attempt, not yet checked, has other shapes.

        An attempt can be cut short (by another member's VIEW) before this peer checked every
        first chunk; accusing wrong-shape members anyway keeps them from outvoting honest ones.
        """
        wrong = {}
        for key in self._inbox.pending(ctx.round_id, ctx.attempt, Kind.PART):
            # first chunks carry the meta: of every shard (butterfly), of ring step 0 only
            if key[4] == 0 and (self.mode == "butterfly" or key[3] == 0):
                frame = self._inbox.pop(key)
                if frame.meta.get("shape") != ctx.first_meta["shape"]:
                    wrong[key[-1]] = "wrong-shape contribution (tensor layout differs)"
        return wrong

    def _remember(self, round_id: int, committed: Committed) -> None:
        self._committed.remember(round_id, committed)
        # members that gave up on this round before we committed get the result now
        for key in self._inbox.pending(round_id, None, Kind.VIEW) + self._inbox.pending(round_id, None, Kind.PART):
            if CommittedRounds.asks_for_result(committed, key[2] == Kind.VIEW, key[2] == Kind.PART, key[1]):
                self._push_committed(round_id, key[-1])

    # -- the VIEW exchange after a failed attempt (how views become one member set: round_core) --

    def _view_frame(self, core: RoundCore, view: SendView) -> Frame:
        index = {p: i for i, p in enumerate(self._peers)}
        meta = {"alive": members_mask(list(view.alive), self._peers), "shape": core.shape,
                "why": {str(index[p]): r[:200] for p, r in view.why.items()}}
        return Frame(Kind.VIEW, core.round_id, view.attempt, 0, 0, meta)

    async def _collect_views(self, core: RoundCore, ctx: AttemptContext, wait: AwaitViews) -> list:
        """Report each member's VIEW (or its absence) to the core, or adopt a commit pushed to us
        meanwhile; the core's actions."""
        actions: list = []
        waits = {asyncio.ensure_future(self._take_view(ctx, m)): m for m in wait.members}
        pushed = self._inbox.signal(ctx.round_id, None, Kind.COMMITTED)
        try:
            while waits:
                done, _ = await asyncio.wait({*waits, pushed}, return_when=asyncio.FIRST_COMPLETED)
                if pushed.done():
                    adopted = await self._adopt(core, ctx)
                    if adopted is not None:
                        return adopted
                    pushed = self._inbox.signal(ctx.round_id, None, Kind.COMMITTED)
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

    async def _take_view(self, ctx: AttemptContext, member: str) -> tuple[set[str], dict[str, str], str]:
        loop = asyncio.get_running_loop()
        frame = await self._inbox.take((ctx.round_id, ctx.attempt, Kind.VIEW, 0, 0, member),
                                       loop.time(), self._estimator.stall_timeout())
        try:
            alive = set(members_from_mask(frame.meta.get("alive"), self._peers))
        except FrameError as exc:
            raise PeerFailure(member, f"malformed view: {exc}") from None
        why = frame.meta.get("why") if isinstance(frame.meta.get("why"), dict) else {}
        reasons = {self._peers[int(i)]: str(r)[:200] for i, r in why.items()
                   if isinstance(i, str) and i.isdigit() and int(i) < len(self._peers)}
        return alive, reasons, str(frame.meta.get("shape"))

    # -- committed results: push to stragglers, adopt when pushed ---------------------------

    def _push_committed(self, round_id: int, peer: str) -> None:
        committed = self._committed.claim_push(round_id, peer)
        if committed is not None:
            self._spawn(self._send_committed(round_id, committed, peer))

    def _spawn(self, coro) -> None:
        """Run a send in the background (cancelled by close())."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_committed(self, round_id: int, committed: Committed, peer: str) -> None:
        flat = committed.result
        starts = range(0, flat.numel(), self.chunk_numel)
        index = {p: i for i, p in enumerate(self._peers)}
        meta = {"attempt": committed.attempt, "m": members_mask(list(committed.participants), self._peers),
                "why": {str(index[p]): r for p, r in committed.excluded.items() if p in index},
                "numel": flat.numel(), "chunks": len(starts),
                "rates": {str(index[p]): r for p, r in committed.rates.items() if p in index}}
        for c, start in enumerate(starts):
            payload = await self._offload(_raw_bytes, flat[start:start + self.chunk_numel])
            await self._links.send(peer, Frame(Kind.COMMITTED, round_id, 0, 0, c, meta if c == 0 else {},
                                               payload))

    async def _adopt(self, core: RoundCore, ctx: AttemptContext) -> list | None:
        """Take a result another member committed for this round (the core's actions), or None if
        none is usable; the core refuses members caught sending bad data (docs/adr/0092)."""
        for key in self._inbox.pending(ctx.round_id, None, Kind.COMMITTED):
            sender = key[-1]
            if key[4] != 0 or not core.may_adopt(sender):
                continue
            first = self._inbox.pop(key)
            try:
                committed = await self._receive_committed(ctx, sender, first)
            except (PeerFailure, FrameError, ValueError, KeyError) as exc:
                log.warning("round %d: unusable committed result from %s: %s", ctx.round_id, sender, exc)
                core.distrust(sender)
                continue
            return core.adopted(sender, committed)
        for key in self._inbox.pending(ctx.round_id, None, Kind.COMMITTED):  # all from refused senders
            self._inbox.pop(key)
        self._inbox.clear_signal(ctx.round_id, None, Kind.COMMITTED)
        return None

    async def _receive_committed(self, ctx: AttemptContext, sender: str, first: Frame) -> Committed:
        meta = first.meta
        numel = ctx.flat.numel()
        chunks = math.ceil(numel / self.chunk_numel)
        if meta.get("numel") != numel or meta.get("chunks") != chunks or not isinstance(meta.get("attempt"), int):
            raise ValueError("committed result of another layout")
        participants = tuple(members_from_mask(meta.get("m"), self._peers))
        why = meta.get("why") if isinstance(meta.get("why"), dict) else {}
        excluded = {self._peers[int(i)]: str(r) for i, r in why.items() if i.isdigit() and int(i) < len(self._peers)}
        rates_meta = meta.get("rates") if isinstance(meta.get("rates"), dict) else {}
        rates = {self._peers[int(i)]: float(r) for i, r in rates_meta.items()
                 if i.isdigit() and int(i) < len(self._peers) and isinstance(r, (int, float)) and r > 0}
        out = torch.empty_like(ctx.flat)
        loop = asyncio.get_running_loop()
        for c in range(chunks):
            frame = first if c == 0 else await self._inbox.take(
                (ctx.round_id, 0, Kind.COMMITTED, 0, c, sender), loop.time(), self._estimator.stall_timeout())
            start = c * self.chunk_numel
            stop = min(start + self.chunk_numel, numel)
            out[start:stop] = await self._offload(_from_raw, frame.payload, stop - start, sender)
        return Committed(meta["attempt"], participants, excluded, out, rates)

    # -- incoming streams ------------------------------------------------------------------

    async def _on_stream(self, stream: Stream, remote: str) -> None:
        if remote not in self._peers:
            stream.reset()
            return
        while True:
            try:
                frame = await read_frame(stream, self._max_frame)
            except asyncio.IncompleteReadError as exc:
                if exc.partial or self._round_active:
                    self._inbox.record_fault(remote, self._fault_round(), "connection closed")
                return
            except (FrameError, ConnectionError) as exc:
                self._inbox.record_fault(remote, self._fault_round(), f"bad frame: {exc}",
                                         bad_data=isinstance(exc, FrameError))
                stream.reset()
                return
            self._on_frame(remote, frame)

    def _on_frame(self, sender: str, frame: Frame) -> None:
        core = self._core
        if (frame.kind == Kind.COMMITTED and core is not None and frame.round_id == core.round_id
                and sender in core.distrusted):
            return  # refused (see _adopt); dropped here so it cannot keep waking the round
        committed = self._committed.get(frame.round_id)
        if committed is not None:
            self._inbox.note_alive(sender, frame.round_id)  # still finishing a round we are past
            if CommittedRounds.asks_for_result(committed, frame.kind == Kind.VIEW, frame.kind == Kind.PART,
                                               frame.attempt):
                self._push_committed(frame.round_id, sender)
            if frame.kind != Kind.COMMITTED:
                return
        self._inbox.put(sender, frame)
        ctx = self._attempt_ctx
        if (ctx is not None and frame.kind == Kind.PART and frame.chunk == 0
                and (frame.round_id, frame.attempt) == (ctx.round_id, ctx.attempt)):
            self._check_first_chunks(ctx, sender)

    def _fault_round(self) -> int:
        """The round a fault seen now counts against: the running one, else the next."""
        return self._current_round if self._round_active else self._current_round + 1

    def _on_link_broken(self, peer: str, reason: str) -> None:
        if self._round_active:
            self._inbox.record_fault(peer, self._current_round, reason)

    async def _offload(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One 1-D float32 tensor of all values; a lone contiguous float32 CPU tensor is used as is
    (a view: the round only reads it, and a 100 MB copy costs more CPU than the fp32 reduction)."""
    if not tensors:
        raise ValueError("nothing to all-reduce")
    if len(tensors) == 1:
        only = tensors[0].detach()
        if only.dtype == torch.float32 and only.device.type == "cpu" and only.is_contiguous():
            return only.view(-1)
    return torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, shapes: list[tuple]) -> list[torch.Tensor]:
    sizes = [math.prod(s) for s in shapes]
    return [piece.view(shape) for piece, shape in zip(flat.split(sizes), shapes)]


def _decode_own(codec: Codec, encoded: bytes | None, numel: int) -> tuple[torch.Tensor, str | None]:
    """This peer's all-gather contribution as the others will decode it, or why there is none."""
    if encoded is None:
        return torch.zeros(numel), "no valid local contribution this round"
    if len(encoded) > codec.max_encoded_size(numel):
        return torch.zeros(numel), f"local contribution of {len(encoded)} bytes is oversized"
    try:
        return codec.decode(encoded, numel), None
    except (CodecError, ValueError) as exc:
        return torch.zeros(numel), f"local contribution does not decode: {exc}"


def _raw_bytes(values: torch.Tensor) -> bytes:
    return values.contiguous().numpy().tobytes()


def _from_raw(payload: bytes, numel: int, sender: str) -> torch.Tensor:
    if len(payload) != numel * 4:
        raise PeerFailure(sender, f"committed chunk of {len(payload)} bytes, expected {numel * 4}")
    values = torch.frombuffer(bytearray(payload), dtype=torch.float32)
    if not all_finite(values):
        raise PeerFailure(sender, "non-finite values in committed result")
    return values
