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
is its asyncio driver: it carries out the core's actions with its pieces (attempt_runner.py runs an
attempt's data flow, view_exchange.py sends the VIEWs and waits for them, committed_exchange.py
pushes and adopts committed results; peer_io.py is what they share) and routes incoming frames.
devtools/allreduce_sim runs the same core under a simulated network and clock (docs/adr/0116).

`allgather_mean` runs the same rounds over contributions their owners encoded (top-k, sign with
error feedback): every member gets every encoding and averages their decodings (docs/adr/0091).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ml.codecs import get_codec
from ml.codecs.base import Codec, CodecError, all_finite

from .allgather import run_allgather
from .attempt import AttemptContext
from .attempt_runner import AttemptRunner, Contribution
from .butterfly import run_butterfly
from .committed_exchange import CommittedExchange, result_wait_s
from .deadlines import DeadlinePolicy, StallEstimator
from .inbox import Inbox
from .links import PeerLinks
from .peer_io import PeerIO
from .plan import Plan, make_plan
from .receipts import Receipt, WireSigner
from .ring import RING_CODECS, run_ring
from .round_core import (
    Action,
    AllReduceError,
    AwaitResult,
    AwaitViews,
    CommitRound,
    Committed,
    ExcludedFromRound,
    FailRound,
    RoundCore,
    SendView,
    StartAttempt,
    next_rates,
)
from .transport import Stream, Transport
from .view_exchange import ViewExchange
from .wire import DEFAULT_MAX_PAYLOAD, Frame, FrameError, Kind, members_mask, read_frame

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
                 codec: str = "fp32", non_reducers: set[str] | frozenset[str] = frozenset(),
                 chunk_numel: int = 1 << 18, deadlines: DeadlinePolicy = DEFAULT_DEADLINES,
                 min_participants: int = 2, max_frame_bytes: int = DEFAULT_MAX_PAYLOAD,
                 protocol: str = PROTOCOL, workers: int = 2, upload_rates: dict[str, float] | None = None,
                 signer: WireSigner | None = None):
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
        if signer is not None and signer.me != my_id:
            raise ValueError("the wire signer signs for another member")
        self.my_id = my_id
        self.mode = mode
        self._signer = signer
        self.codec_name = codec
        self.non_reducers = frozenset(non_reducers)
        self.chunk_numel = chunk_numel
        self.min_participants = min_participants
        # called with (seconds, result) after each round that committed (e.g. a metrics histogram)
        self.round_observer: Callable[[float, AllReduceResult], None] | None = None
        self._transport = transport
        self._protocol = protocol
        self._max_frame = max_frame_bytes
        self._policy = deadlines
        estimator = StallEstimator(deadlines)
        self._links = PeerLinks(transport, protocol, self._on_link_broken)
        self._io = PeerIO(my_id, self._links, Inbox(estimator), estimator,
                          ThreadPoolExecutor(max_workers=workers, thread_name_prefix="allreduce"), chunk_numel)
        self._committed = CommittedExchange(self._io)
        self._views = ViewExchange(self._io, self._committed.adopt)
        self._runner = AttemptRunner(self._io, deadlines, mode, self._committed.adopt)
        self._accepted: set[str] = set()   # peers whose streams are taken before they are members (joiners)
        self._incoming: collections.Counter[str] = collections.Counter()  # streams being read, by sender
        self.set_peers(peers)
        self._rates: dict[str, float] = dict(upload_rates or {})  # replaced by measurements each round
        self._current_round = -1
        self._round_active = False
        self._core: RoundCore | None = None  # the current (or last) round's protocol state
        self._started = False

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
        await self._io.cancel_background()
        await self._links.close(grace_s=max(1.0, deadline - loop.time()))
        self._io.pool.shutdown(wait=False, cancel_futures=True)

    def set_peers(self, peers: list[str]) -> None:
        """Change the membership (joins and leaves) between rounds; includes this peer.

        A changed membership resets the agreed upload rates (a joiner has none), so the next
        round splits shards evenly and measures again.
        """
        peers = sorted(set(peers))
        if self.my_id not in peers:
            raise ValueError("the group's peers must include this peer")
        if self._io.peers and peers != self._io.peers:
            self._rates = {}
        self._io.peers = peers

    def accept(self, peers: list[str]) -> None:
        """Take streams from ``peers`` before they become members: a worker joining at a round that this
        peer has not reached yet may already send its frames for it (docs/adr/0226)."""
        self._accepted.update(peers)

    @property
    def peers(self) -> list[str]:
        return list(self._io.peers)

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
        flat = await self._io.offload(_flatten, tensors)
        finite = await self._io.offload(all_finite, flat)
        algorithm = run_ring if self.mode == "ring" else run_butterfly
        return await self._round(Contribution(
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
        flat, fault = await self._io.offload(_decode_own, codec, encoded, numel)
        piece = min(4 * self.chunk_numel, self._max_frame)
        # "allgather2": members confirm every contribution before finishing (docs/adr/0141); the plan
        # digest differs from members without the confirmation, which are caught on the first chunk
        return await self._round(Contribution(
            flat, shapes, run_allgather, codec, f"allgather2:{codec!r}:{piece}", fault=fault,
            encoded=encoded or b"", piece_bytes=piece), round_id)

    def _check_round(self, round_id: int) -> None:
        if not self._started:
            raise RuntimeError("call start() first")
        if round_id <= self._current_round:
            raise ValueError(f"round {round_id} is not after round {self._current_round}")

    async def _round(self, contribution: Contribution, round_id: int) -> AllReduceResult:
        started = time.monotonic()
        result = await self._run_round(contribution, round_id)
        if self.round_observer is not None:
            self.round_observer(time.monotonic() - started, result)
        return result

    async def _run_round(self, contribution: Contribution, round_id: int) -> AllReduceResult:
        self._current_round = round_id
        self._round_active = True
        self._io.inbox.forget_before(round_id)
        bytes_before = self._links.bytes_sent
        shape_digest = hashlib.blake2b(json.dumps(contribution.shapes).encode(), digest_size=8).hexdigest()
        self._runner.forget_receipts()
        core = self._core = RoundCore(self.my_id, self._io.peers, round_id, shape_digest,
                                      min_participants=self.min_participants, fault=contribution.fault)
        try:
            committed = await self._drive(core, contribution)
        except AllReduceError:
            self._rates = next_rates(self._rates, self._io.peers, None)
            raise
        finally:
            self._round_active = False
        self._rates = next_rates(self._rates, self._io.peers, committed)
        return AllReduceResult(_unflatten(committed.result, contribution.shapes), committed.participants,
                               round_id, committed.attempt + 1, dict(committed.excluded),
                               self._links.bytes_sent - bytes_before,
                               self._runner.receipts if committed.attempt == self._runner.receipts_attempt else ())

    async def _drive(self, core: RoundCore, contribution: Contribution) -> Committed:
        """Carry out the core's actions until it commits the round or fails it."""
        actions: collections.deque[Action] = collections.deque(core.start())
        ctx: AttemptContext | None = None
        while True:
            action = actions.popleft()
            if isinstance(action, CommitRound):
                self._committed.remember(core.round_id, action.committed)
                return action.committed
            if isinstance(action, FailRound):
                raise action.error
            if isinstance(action, StartAttempt):
                if action.attempt > 0:
                    log.info("round %d attempt %d over %s, excluded %s", core.round_id, action.attempt,
                             list(action.members), core.excluded)
                ctx = self._context(contribution, list(action.members), core.shape, core.round_id, action.attempt)
                self._io.inbox.forget_before(core.round_id, action.attempt)
                actions.extend(await self._runner.run(core, ctx, contribution))
            elif isinstance(action, SendView):
                self._views.send(core, action)
            elif isinstance(action, AwaitViews):
                assert ctx is not None, "the core awaits views only after an attempt"
                actions.extend(await self._views.collect(core, ctx, action))
            elif isinstance(action, AwaitResult):
                assert ctx is not None, "the core leaves this member out only after an attempt"
                wait_s = result_wait_s(self._policy.first_frame_grace_s, self._io.estimator.stall_timeout())
                actions.extend(await self._committed.await_result(core, ctx, action, self._views.send, wait_s))

    def _context(self, contribution: Contribution, members: list[str], shape_digest: str, round_id: int,
                 attempt: int) -> AttemptContext:
        flat, peers = contribution.flat, self._io.peers
        plan = self._plan(members, flat.numel(), contribution)
        stall_s = self._io.estimator.stall_timeout()  # later attempts: members leave the VIEW wait up to this apart
        meta = {"plan": plan.digest(), "shape": shape_digest, "m": members_mask(members, peers)}
        return AttemptContext(
            me=self.my_id, universe=peers, plan=plan, round_id=round_id, attempt=attempt,
            flat=flat, out=torch.empty_like(flat), codec=contribution.codec, links=self._links,
            inbox=self._io.inbox, offload=self._io.offload, started=asyncio.get_running_loop().time(),
            stall_s=stall_s,
            grace_s=self._policy.first_frame_grace_s if attempt == 0 else stall_s, first_meta=meta,
            encoded=contribution.encoded, piece_bytes=contribution.piece_bytes, signer=self._signer)

    def _plan(self, members: list[str], numel: int, contribution: Contribution) -> Plan:
        if contribution.algorithm is run_allgather:  # no shards: the layout is the members and codec
            return make_plan(members, set(), {}, numel, self.chunk_numel, contribution.codec_tag)
        non_reducers = set() if self.mode == "ring" else set(self.non_reducers)
        return make_plan(members, non_reducers, self._rates, numel, self.chunk_numel, contribution.codec_tag)

    # -- incoming streams ------------------------------------------------------------------

    async def _on_stream(self, stream: Stream, remote: str) -> None:
        if remote not in self._io.peers and remote not in self._accepted:
            stream.reset()
            return
        self._links.reachable(remote)   # it reached us: our link to it may dial it again (links.py)
        self._incoming[remote] += 1
        try:
            await self._read_stream(stream, remote)
        finally:
            self._incoming[remote] -= 1
            if not self._incoming[remote]:
                del self._incoming[remote]

    async def _read_stream(self, stream: Stream, remote: str) -> None:
        while True:
            try:
                frame = await read_frame(stream, self._max_frame)
            except asyncio.IncompleteReadError as exc:
                # a stream ended between frames while the peer has opened its next one is a link
                # moved off a connection going away (links.py); closing our side tells the peer that
                # every frame on it was read (docs/adr/0233)
                moved = not exc.partial and self._incoming[remote] > 1
                if exc.partial or (self._round_active and not moved):
                    self._io.inbox.record_fault(remote, self._fault_round(), "connection closed")
                if not exc.partial:
                    with contextlib.suppress(ConnectionError, OSError):
                        await stream.close()
                return
            except (FrameError, ConnectionError) as exc:
                self._io.inbox.record_fault(remote, self._fault_round(), f"bad frame: {exc}",
                                            bad_data=isinstance(exc, FrameError))
                stream.reset()
                return
            self._on_frame(remote, frame)

    def _on_frame(self, sender: str, frame: Frame) -> None:
        core = self._core
        if (frame.kind == Kind.COMMITTED and core is not None and frame.round_id == core.round_id
                and sender in core.distrusted):
            return  # refused (see CommittedExchange.adopt); dropped here so it cannot keep waking the round
        if self._committed.answer(sender, frame):
            return
        self._io.inbox.put(sender, frame)
        self._runner.on_frame(sender, frame)

    def _fault_round(self) -> int:
        """The round a fault seen now counts against: the running one, else the next."""
        return self._current_round if self._round_active else self._current_round + 1

    def _on_link_broken(self, peer: str, reason: str) -> None:
        if self._round_active:
            self._io.inbox.record_fault(peer, self._current_round, reason)


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


def _unflatten(flat: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    sizes = [math.prod(s) for s in shapes]
    return [piece.view(shape) for piece, shape in zip(torch.split(flat, sizes), shapes)]


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
