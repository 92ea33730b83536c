"""Asyncio driver of the SDBFT core over an injected network and clock.

It owns no consensus logic: it feeds the ``TendermintCore`` one event at a time from a queue
(messages from peers, timers, synced blocks), and carries out its outputs in order: awaits the
``persist`` hook before anything after it is sent (the signer state is fsync'd before the vote
leaves), sends proposals and votes to every peer, arms timers, hands each commit to the
application's ``commit`` hook (which executes and stores the block and returns the next height's
validator set), and re-sends ``core.gossip_messages()`` when the core made no progress for a whole
``gossip_interval``, so lost messages are recovered. A node that sees messages from heights it
has not reached asks that peer for the committed blocks (``SYNC_REQUEST``); blocks arrive as
``SYNC_BLOCK`` payloads and are applied only with a valid commit certificate. The application's
``is_valid`` for received proposals and synced blocks, and certificate checks, run through
``clock.offload`` (a worker thread in production); the core only reads the cached result.

Ports (ADR 0110): ``network`` (``consensus.network.ConsensusNetwork``; default ``HostNetwork`` over
the node's ``Host``, protocol ``/dekube/consensus/1.0.0``) and ``clock`` (``consensus.clock.Clock``;
default ``LoopClock``). The deterministic simulator (``devtools.consensus_sim``) runs this class
unchanged with a simulated network and a virtual-time clock.

Payloads: the first byte is the kind (vote 0x01, proposal 0x02, sync request 0x10, sync block 0x11).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from consensus.clock import Clock, LoopClock
from consensus.committee import ValidatorSet
from consensus.messages import (
    MAX_PROPOSAL_VALUE_BYTES,
    PROPOSAL_TAG,
    VOTE_TAG,
    Evidence,
    Proposal,
    decode_message,
    decode_vote_list,
    encode_message,
    encode_vote_list,
    value_id,
)
from consensus.network import (  # noqa: F401  (frame, read_frame, PROTOCOL: re-exported for callers)
    MAX_CERTIFICATE_VOTES,
    MAX_FRAME_BYTES,
    PROTOCOL,
    ConsensusNetwork,
    FrameError,
    HostNetwork,
    frame,
    read_frame,
)
from consensus.signer import Step
from consensus.tendermint import (
    Broadcast,
    Commit,
    EvidenceFound,
    PersistSignerState,
    ScheduleTimeout,
    TendermintCore,
)

SYNC_REQUEST_TAG = 0x10
SYNC_BLOCK_TAG = 0x11
MAX_PENDING_EVENTS = 4096
_SYNC_REQUEST = struct.Struct(">BQ")
_SYNC_BLOCK_HEAD = struct.Struct(">BQII")
log = logging.getLogger(__name__)


class PersistFailed(RuntimeError):
    """The signer state could not be persisted: this validator stops taking part."""


# ---------------------------------------------------------------------------- sync payloads
def encode_sync_request(from_height: int) -> bytes:
    return _SYNC_REQUEST.pack(SYNC_REQUEST_TAG, from_height)


def decode_sync_request(payload: bytes) -> int:
    if len(payload) != _SYNC_REQUEST.size or payload[0] != SYNC_REQUEST_TAG:
        raise FrameError("malformed sync request")
    return _SYNC_REQUEST.unpack(payload)[1]


def encode_sync_block(commit: Commit) -> bytes:
    parts = [_SYNC_BLOCK_HEAD.pack(SYNC_BLOCK_TAG, commit.height, commit.round, len(commit.value)),
             commit.value, struct.pack(">H", len(commit.certificate)), encode_vote_list(commit.certificate)]
    return b"".join(parts)


def decode_sync_block(payload: bytes) -> Commit:
    try:
        tag, height, round_, value_len = _SYNC_BLOCK_HEAD.unpack_from(payload, 0)
        if tag != SYNC_BLOCK_TAG or value_len > MAX_PROPOSAL_VALUE_BYTES:
            raise FrameError("malformed sync block header")
        pos = _SYNC_BLOCK_HEAD.size
        value = payload[pos:pos + value_len]
        pos += value_len
        (count,) = struct.unpack_from(">H", payload, pos)
        pos += 2
        if count > MAX_CERTIFICATE_VOTES:
            raise FrameError("certificate too large")
        votes, pos = decode_vote_list(payload, pos, count)
    except struct.error as exc:
        raise FrameError("sync block truncated") from exc
    if pos != len(payload) or len(value) != value_len:
        raise FrameError("sync block truncated or has trailing bytes")
    return Commit(height, round_, value, tuple(votes))


# ---------------------------------------------------------------------------- the driver
CommitHook = Callable[[Commit], Awaitable[ValidatorSet]]


def _member_or_sync_request(members: Callable[[str], bool]) -> Callable[[str | None, bytes], bool]:
    """Protocol access by role: members (the committee) may send any payload; anyone else only
    sync requests (a joining node catches up; the driver rate-limits what it serves per peer)."""
    def admits(peer: str | None, payload: bytes) -> bool:
        return peer is not None and (members(peer) or payload[:1] == bytes([SYNC_REQUEST_TAG]))
    return admits


class ConsensusDriver:
    """Runs one ``TendermintCore`` over a network and a clock.

    ``host``: the node's ``Host`` (``set_handler``/``remove_handler``/``open_stream``), used only to
    build the default ``HostNetwork`` when no ``network`` is given (pass ``None`` with a
    ``network``). ``peers()``: the peer IDs to gossip with (the committee, or every validator
    candidate). ``persist(state)``: store the signer state durably. ``commit(commit)``: execute and
    store the block, return the next height's ``ValidatorSet``. ``get_block(height)``: a stored
    ``Commit`` (for peers that sync) or ``None``. ``members(peer)``: whether ``peer`` may send votes and
proposals (others may only ask for blocks; None: everyone). ``on_evidence(evidence)``: equivocation seen (for
    the mempool / next block). If ``persist`` raises, nothing after it is sent and the driver stops
    feeding the core (``failure`` is set, ``on_failure(exc)`` called): a validator that cannot make its
    votes durable must not vote, and its owner must stop the node (a live process that never votes
    again recovers nothing; a restart does once the disk has room).
    """

    def __init__(
        self,
        host,
        core: TendermintCore,
        *,
        peers: Callable[[], Iterable[str]],
        persist: Callable[[bytes], Awaitable[None]],
        commit: CommitHook,
        get_block: Callable[[int], Commit | None],
        on_evidence: Callable[[Evidence], None] | None = None,
        on_failure: Callable[[PersistFailed], None] | None = None,
        gossip_interval: float = 0.5,
        sync_delay: float = 0.5,
        sync_batch: int = 128,
        max_send_queue: int = 1024,
        open_timeout: float = 3.0,
        network: ConsensusNetwork | None = None,
        clock: Clock | None = None,
        members: Callable[[str], bool] | None = None,
        propose_grace: Callable[[int], float] | None = None,
    ) -> None:
        if network is None:
            if host is None:
                raise ValueError("ConsensusDriver needs a host or a network")
            admits = None if members is None else _member_or_sync_request(members)
            network = HostNetwork(host, max_send_queue, open_timeout, admits)
        self.network = network
        self.clock = clock if clock is not None else LoopClock()
        self.core = core
        self.peers = peers
        self.persist = persist
        self.commit = commit
        self.get_block = get_block
        self.on_evidence = on_evidence
        self.on_failure = on_failure
        self.propose_grace = propose_grace   # extra seconds for a height's round-0 proposal (a paced proposer)
        self.gossip_interval = gossip_interval
        self.sync_delay = sync_delay
        self.sync_batch = sync_batch
        self.self_id = core.signer.peer_id if core.signer is not None else None
        self.events: asyncio.Queue = asyncio.Queue()  # peer input is capped in receive
        self.shed_events = 0
        self._tasks: list[asyncio.Task] = []
        self._timers: list = []
        self._behind_since: float | None = None
        self._last_sync_request = -1e9
        self._served: dict[str, float] = {}
        self._committing = False
        self.commits = 0
        self.failure: PersistFailed | None = None

    @property
    def height(self) -> int:
        return self.core.height

    @property
    def rejected_frames(self) -> int:
        """Streams (or payloads) the network dropped as malformed."""
        return getattr(self.network, "rejected_frames", 0)

    async def start(self, height: int, validators: ValidatorSet) -> None:
        self.network.start(self.receive)
        loop = asyncio.get_running_loop()
        # the event loop first: with a one-member committee the start outputs commit height after height
        # and this call never returns, yet sync requests of joining nodes must still be served (ADR 0154)
        self._tasks = [loop.create_task(self._event_loop()), loop.create_task(self._gossip_loop())]
        await self._act(self.core.start_height(height, validators))

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.network.stop()

    # ------------------------------------------------------------------ inbound
    def receive(self, peer: str | None, payload: bytes) -> None:
        """One payload from ``peer``; raises ``MessageError`` (the network closes that stream)."""
        kind = payload[0] if payload else None
        event: tuple[str, str | None, Any]
        if kind in (VOTE_TAG, PROPOSAL_TAG):
            event = ("message", peer, decode_message(payload))
        elif kind == SYNC_REQUEST_TAG:
            event = ("sync_request", peer, decode_sync_request(payload))
        elif kind == SYNC_BLOCK_TAG:
            event = ("sync_block", peer, decode_sync_block(payload))
        else:
            raise FrameError(f"unknown payload kind {kind!r}")
        if self.events.qsize() >= MAX_PENDING_EVENTS:
            self.shed_events += 1  # overloaded: shed peer input (gossip recovers it), never timers
            return
        self.events.put_nowait(event)

    # ------------------------------------------------------------------ the event loop
    async def _event_loop(self) -> None:
        while True:
            kind, a, b = await self.events.get()
            try:
                if kind == "message":
                    self._note_height(a, b.height)
                    if isinstance(b, Proposal):
                        await self._on_proposal(a, b)
                    else:
                        await self._act(self.core.on_message(b))
                elif kind == "timeout":
                    step, height, round_ = b
                    await self._act(self.core.on_timeout(step, height, round_))
                elif kind == "sync_request":
                    self._serve_sync(a, b)
                elif kind == "sync_block":
                    await self._apply_synced(b)
            except asyncio.CancelledError:
                raise
            except PersistFailed as exc:  # never send what is not durable: stop voting
                log.critical("consensus stopped: %s", exc)
                self.failure = exc
                if self.on_failure is not None:
                    self.on_failure(exc)
                return
            except Exception:  # a bug must not stop consensus; it is logged loudly
                log.exception("consensus event %s failed", kind)

    async def _act(self, outputs) -> None:
        """Carry out the core's outputs in order. A commit's next-height outputs run right after it,
        from a work list rather than by recursion (a one-validator committee commits every height
        from inside start_height)."""
        pending = collections.deque(outputs)
        while pending:
            out = pending.popleft()
            if isinstance(out, PersistSignerState):
                try:
                    await self.persist(out.state)
                except Exception as exc:
                    raise PersistFailed(f"persisting signer state failed: {exc!r}") from exc
            elif isinstance(out, Broadcast):
                self._send_all(encode_message(out.message))
            elif isinstance(out, ScheduleTimeout):
                now = self.clock.now()
                self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
                delay = out.delay
                if out.step is Step.PROPOSE and out.round == 0 and self.propose_grace is not None:
                    delay += self.propose_grace(out.height)   # the proposer may wait that long for a transaction
                self._timers.append(self.clock.call_later(
                    delay, self._fire_timeout, (out.step, out.height, out.round)))
            elif isinstance(out, Commit):
                pending.extendleft(reversed(await self._commit(out)))
                await asyncio.sleep(0)   # let queued events (sync requests, timers) run between heights
            elif isinstance(out, EvidenceFound) and self.on_evidence is not None:
                self.on_evidence(out.evidence)

    async def _on_proposal(self, peer: str, proposal: Proposal) -> None:
        core = self.core
        if core.needs_validation(proposal):
            await self._validate_off_loop(proposal.height, proposal.value)
        before = (core.ignored_proposals, core.wrong_value_proposer, core.proposal_equivocations)
        await self._act(core.on_message(proposal))
        after = (core.ignored_proposals, core.wrong_value_proposer, core.proposal_equivocations)
        if after != before:
            log.info("proposal for height %d round %d signed by %s (from %s) rejected: %s",
                     proposal.height, proposal.round, proposal.proposer, peer,
                     "not the round's proposer" if after[0] != before[0]
                     else "its block names another proposer" if after[1] != before[1]
                     else "a second proposal for the round")

    async def _validate_off_loop(self, height: int, value: bytes) -> None:
        """Run the application's ``is_valid`` (block checks, signatures) off the event loop."""
        ok = await self.clock.offload(self.core.is_valid, height, value)
        self.core.record_validity(height, value_id(value), ok)

    def _fire_timeout(self, args) -> None:
        self.events.put_nowait(("timeout", None, args))

    async def _commit(self, commit: Commit) -> list:
        """Hand a decided block to the application; returns the core's outputs for the next height."""
        self._committing = True  # the app may take a while (execution, pacing): no gossip then
        try:
            next_validators = await self.commit(commit)
        finally:
            self._committing = False
        self.commits += 1
        self._behind_since = None
        self.network.prune(set(self.peers()))   # senders to peers that left the committee go
        return self.core.start_height(commit.height + 1, next_validators)

    # ------------------------------------------------------------------ gossip and sending
    def _send_all(self, payload: bytes) -> None:
        for peer in self.peers():
            if peer != self.self_id:
                self.network.send(peer, payload)

    async def _gossip_loop(self) -> None:
        """Re-send the core's gossip when it made no progress for a whole interval."""
        mark = None
        while self.failure is None:
            await self.clock.sleep(self.gossip_interval)
            now = (self.core.height, self.core.round, self.core.step)
            if now == mark and not self._committing:
                for message in self.core.gossip_messages():
                    self._send_all(encode_message(message))
            mark = now

    # ------------------------------------------------------------------ block sync
    def _note_height(self, peer: str | None, height: int) -> None:
        """Ask ``peer`` for blocks once we have seen it ahead of us for a while."""
        core_height = self.core.height
        if peer is None or height <= core_height:
            return
        now = self.clock.now()
        if self._behind_since is None:
            self._behind_since = now
        far_ahead = height > core_height + 1
        if (far_ahead or now - self._behind_since >= self.sync_delay) \
                and now - self._last_sync_request >= self.sync_delay:
            self._last_sync_request = now
            self.network.send(peer, encode_sync_request(core_height))

    def request_sync(self, peer: str) -> None:
        """Ask ``peer`` for the blocks from our height on (e.g. a follower polling a validator)."""
        self._last_sync_request = self.clock.now()
        self.network.send(peer, encode_sync_request(self.core.height))

    def _serve_sync(self, peer: str | None, from_height: int) -> None:
        """Send up to ``sync_batch`` blocks; at most two requests per peer per ``sync_delay``."""
        now = self.clock.now()
        if peer is None or now - self._served.get(peer, -1e9) < self.sync_delay / 2:
            return
        self._served[peer] = now
        if len(self._served) > 4096:
            self._served = {p: t for p, t in self._served.items() if now - t < self.sync_delay}
        for height in range(from_height, from_height + self.sync_batch):
            block = self.get_block(height)
            if block is None:
                break
            self.network.send(peer, encode_sync_block(block))

    async def _apply_synced(self, block: Commit) -> None:
        core = self.core
        if block.height != core.height or core.decided:
            return
        validators = core.validators
        if validators is None:   # no height started yet: nothing to apply a block to
            return
        ok = await self.clock.offload(
            validators.verify_commit, core.chain_id, block.height, value_id(block.value), block.certificate)
        if not ok or block.height != core.height or core.decided:
            return
        valid = await self.clock.offload(core.is_valid, block.height, block.value)
        if valid and block.height == core.height and not core.decided:
            await self._act([block])
