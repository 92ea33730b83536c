"""One simulated all-reduce member: the real `RoundCore` and `CommittedRounds` (ml/allreduce/
round_core.py), the real wire format, plan digest and stall estimator, driven by a sans-I/O
all-gather data flow over the simulated network.

The data flow mirrors ml/allreduce/allgather.py and the waits of inbox.py: every member sends its
contribution in chunks to every other member (first chunk with the plan/shape meta), PINGs them
while the attempt runs, and averages all contributions in sorted member order. A wait on a member
fails when it has a recorded fault for the round (closed link, unparsable frame) or when nothing of
this round or an earlier one came from it for the stall timeout (`inbox.silence_deadline`). A VIEW
of the current attempt, or a COMMITTED push, ends the attempt, as in group.py. A live member that
cannot go on (left out, or left alone) asks the others for their result as committed_exchange.py's
`await_result` does (its VIEW again, at growing intervals, until a result is adopted or the wait ends:
docs/adr/0242).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ml.allreduce.committed_exchange import FIRST_ASK_S, LAST_ASK_S, result_wait_s
from ml.allreduce.deadlines import DeadlinePolicy, StallEstimator
from ml.allreduce.inbox import GAP_KINDS, silence_deadline
from ml.allreduce.round_core import (
    AllReduceError,
    AwaitResult,
    AwaitViews,
    CommitRound,
    Committed,
    CommittedRounds,
    FailRound,
    RoundCore,
    SendView,
    StartAttempt,
)
from ml.allreduce.wire import (
    HEADER_SIZE,
    Frame,
    FrameError,
    Kind,
    encode_frame,
    members_from_mask,
    members_mask,
    parse_header,
    parse_meta,
)

from .flows import FLOWS, SHAPE, Failure

DEFAULT_POLICY = DeadlinePolicy()
GARBAGE_MODES = ("nan", "short", "shape", "frame")


@dataclass(frozen=True)
class RoundRecord:
    """How a member ended one round."""
    member: str
    round_id: int
    finished_at: float
    committed: Committed | None
    error: AllReduceError | None


class _Cut(Exception):
    """Another member's VIEW or COMMITTED ended the attempt."""


def result_digest(result: np.ndarray) -> str:
    return hashlib.blake2b(result.tobytes(), digest_size=6).hexdigest()


class SimMember:
    def __init__(self, me: str, peers: list[str], net, *, rounds: int, numel: int, chunk: int,
                 contribution: Callable[[str, int], np.ndarray], trace: Callable[[str], None],
                 on_round: Callable[[RoundRecord], None], rng, core_factory=RoundCore,
                 policy: DeadlinePolicy = DEFAULT_POLICY, garbage: tuple[str, int] | None = None,
                 flow: str = "butterfly"):
        self.me = me
        self.peers = sorted(peers)
        self.net = net
        self.rounds = rounds
        self.numel = numel
        self.chunk = chunk
        self.contribution = contribution
        self.trace = trace
        self.on_round = on_round
        self.rng = rng
        self.core_factory = core_factory
        self.policy = policy
        self.garbage = garbage  # (mode, from round): corrupt every PART sent from that round on
        self.estimator = StallEstimator(policy)
        self.committed = CommittedRounds(me)
        self.core: RoundCore | None = None
        self.current_round = -1
        self.round_active = False
        self.phase = "idle"
        self._frames: dict[tuple, Frame] = {}
        self._received_at: dict[tuple, float] = {}
        self._last_alive: dict[str, dict[int, float]] = {}
        self._last_seen: dict[str, tuple[float, int, int]] = {}
        self._faults: dict[str, tuple[int, str, bool]] = {}
        self._min_round = 0
        self._ticks: set[float] = set()
        # the running attempt / VIEW exchange
        self.flat = np.zeros(numel, np.float32)
        self.flow_class = FLOWS[flow]
        self._flow = None
        self._stall_s = 0.0
        self._next_ping = 0.0
        self._awaiting: set[str] = set()
        self._view_since = 0.0
        # left out of the round: asking for the others' result (AwaitResult)
        self._asking: AwaitResult | None = None
        self._next_ask = self._ask_s = self._ask_until = 0.0

    @property
    def now(self) -> float:
        return self.net.scheduler.now

    # -- network entry points --------------------------------------------------------------

    def deliver(self, sender: str, data: bytes) -> None:
        self.deliver_many([(sender, data)])

    def deliver_many(self, frames: list[tuple[str, bytes]]) -> None:
        """Frames read in one go (a member woken from SIGSTOP reads what its socket buffers hold)."""
        reset: set[str] = set()
        for sender, data in frames:
            if sender in reset:  # the rest of a stream this member reset is lost
                continue
            try:
                frame = _parse(data)
            except FrameError as exc:
                self._record_fault(sender, self._fault_round(), f"bad frame: {exc}", bad_data=True)
                self.net.reset(self.me, sender)
                reset.add(sender)
                continue
            self._on_frame(sender, frame)
        self._advance()

    def link_broken(self, peer: str) -> None:
        """The link to `peer` closed or failed (group.py: `_on_stream` / `_on_link_broken`)."""
        if self.round_active:
            self._record_fault(peer, self.current_round, "connection closed")
            self._advance()

    def tick(self, when: float) -> None:
        self._ticks.discard(when)
        self._advance()

    # -- rounds ----------------------------------------------------------------------------

    def start_round(self, round_id: int) -> None:
        self.current_round = round_id
        self.round_active = True
        self._forget_before(round_id, 0)
        self.flat = self.contribution(self.me, round_id)
        self.core = self.core_factory(self.me, self.peers, round_id, SHAPE)
        self.trace(f"{self.me} r{round_id} start")
        self._apply(self.core.start())
        self._advance()

    def _finish(self, committed: Committed | None, error: AllReduceError | None) -> None:
        round_id = self.current_round
        self.round_active = False
        self.phase = "idle"
        if committed is not None:
            self.trace(f"{self.me} r{round_id} commit a{committed.attempt} over {','.join(committed.participants)} "
                       f"result {result_digest(committed.result)}")
        else:
            self.trace(f"{self.me} r{round_id} fail {type(error).__name__}: {error}")
        self.on_round(RoundRecord(self.me, round_id, self.now, committed, error))
        if round_id + 1 < self.rounds:
            when = self.now + self.rng.uniform(0.02, 0.3)  # local compute before the next round
            self.net.timer(self.me, when, lambda m: m.start_round(round_id + 1))

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, StartAttempt):
                self._begin_attempt(action)
            elif isinstance(action, SendView):
                index = {p: i for i, p in enumerate(self.peers)}
                meta = {"alive": members_mask(list(action.alive), self.peers), "shape": SHAPE,
                        "why": {str(index[p]): r[:200] for p, r in action.why.items()}}
                self.send(action.to, Frame(Kind.VIEW, self.current_round, action.attempt, 0, 0, meta))
            elif isinstance(action, AwaitResult):
                self.phase = "result"
                self._asking = action
                self._ask_s = FIRST_ASK_S
                self._next_ask = self.now
                self._ask_until = self.now + result_wait_s(self.policy.first_frame_grace_s,
                                                           self.estimator.stall_timeout())
                self.trace(f"{self.me} r{self.current_round} cannot go on ({self.core.shut_out}); asks "
                           f"{','.join(action.members)}")
            elif isinstance(action, AwaitViews):
                self.phase = "views"
                self._awaiting = set(action.members)
                self._view_since = self.now
                self._stall_s = self.estimator.stall_timeout()
            elif isinstance(action, CommitRound):
                self.committed.remember(self.current_round, action.committed)
                for key in [k for k in self._frames if k[0] == self.current_round and k[2] in (Kind.VIEW, Kind.PART)]:
                    if CommittedRounds.asks_for_result(action.committed, key[2] == Kind.VIEW,
                                                       key[2] == Kind.PART, key[1]):
                        self._push(self.current_round, key[-1])
                self._finish(action.committed, None)
            elif isinstance(action, FailRound):
                self._finish(None, action.error)

    def _begin_attempt(self, action: StartAttempt) -> None:
        self.phase = "attempt"
        self._forget_before(self.current_round, action.attempt)
        stall_s = self.estimator.stall_timeout()
        grace_s = self.policy.first_frame_grace_s if action.attempt == 0 else stall_s
        self._flow = self.flow_class(self, list(action.members), action.attempt, stall_s, grace_s)
        self._stall_s = stall_s
        self.trace(f"{self.me} r{self.current_round} a{action.attempt} over {','.join(action.members)}")
        self._flow.start()
        self._next_ping = self.now

    # -- the event loop of one member: decide whatever can be decided now ------------------

    def _advance(self) -> None:
        while self.core is not None and not self.core.done:
            if self.phase == "attempt":
                actions = self._step_attempt()
            elif self.phase == "views":
                actions = self._step_views()
            elif self.phase == "result":
                actions = self._step_result()
            else:
                actions = []
            if not actions:
                break
            self._apply(actions)
        self._schedule_tick()

    def _step_attempt(self) -> list:
        flow = self._flow
        r, a = self.current_round, flow.attempt
        if self.now >= self._next_ping:
            for member in flow.others:
                self.send(member, Frame(Kind.PING, r, a, 0, 0))
            self._next_ping = self.now + max(0.05, self.policy.floor_s / 4)
        error = None
        # group.py waits on the data flow, a VIEW of this attempt and a COMMITTED push together: one
        # already here when the attempt starts (a member woken from SIGSTOP) ends it at once
        cut = self._pending(r, a, Kind.VIEW) or self._pending(r, None, Kind.COMMITTED)
        try:
            if cut:
                raise _Cut()
            for key in self._pending(r, a, Kind.PART):  # a first chunk of another plan ends the
                frame = self._frames[key]                # attempt (group.py: _check_first_chunks)
                if key[4] == 0 and "plan" in frame.meta:
                    flow.check_first_meta(key[-1], frame.meta)
            result = flow.progress()
            # a VIEW of this attempt or a COMMITTED of this round already here is read before
            # committing (docs/adr/0141): its sender gave up this attempt
            if result is not None and not (self._pending(r, a, Kind.VIEW) or self._pending(r, None, Kind.COMMITTED)):
                return self.core.attempt_succeeded(result)
            if result is not None:
                raise _Cut()
            for sender, deadline in flow.waits():
                self._check_wait(sender, deadline)
        except Failure as exc:
            error = exc
        except _Cut:
            pass
        cut = cut or self._pending(r, a, Kind.VIEW) or self._pending(r, None, Kind.COMMITTED)
        if error is None and not cut:
            return []
        if error is not None and error.bad_data:
            self.core.distrust(error.peer)
        if self._pending(r, None, Kind.COMMITTED):
            adopted = self._adopt()
            if adopted is not None:
                return adopted
        suspects, their = {}, None
        if error is not None and error.their_members is not None:
            their = error.their_members
        elif error is not None:
            suspects = {error.peer: error.reason}
        wrong = {}
        for key in self._pending(r, a, Kind.PART):
            if key[4] == 0:
                frame = self._frames.pop(key)
                if frame.meta.get("shape") != SHAPE:
                    wrong[key[-1]] = "wrong-shape contribution (tensor layout differs)"
        for peer in wrong:
            self.core.distrust(peer)
        suspects = {**wrong, **suspects}
        mismatch = f", {error.peer} planned over other members: {','.join(their)}" if their is not None else ""
        self.trace(f"{self.me} r{r} a{a} failed, suspects {sorted(suspects.items())}{mismatch}")
        return self.core.attempt_failed(suspects, their)

    def _check_wait(self, sender: str, deadline: float) -> None:
        fault = self._faults.get(sender)
        if fault is not None and fault[0] >= self.current_round:
            raise Failure(sender, fault[1], fault[2])
        if self.now >= deadline:
            raise Failure(sender, f"stalled: nothing received for {self._stall_s:.1f}s")

    def _step_views(self) -> list:
        r, a = self.current_round, self.core.attempt
        if self._pending(r, None, Kind.COMMITTED):
            adopted = self._adopt()
            if adopted is not None:
                return adopted
        actions = []
        for member in sorted(self._awaiting):
            frame = self._frames.pop((r, a, Kind.VIEW, 0, 0, member), None)
            if frame is not None:
                self._awaiting.discard(member)
                try:
                    alive = set(members_from_mask(frame.meta.get("alive"), self.peers))
                except FrameError as exc:
                    actions += self.core.view_missing(member, a, f"malformed view: {exc}")
                    continue
                why = frame.meta.get("why") if isinstance(frame.meta.get("why"), dict) else {}
                reasons = {self.peers[int(i)]: str(v)[:200] for i, v in why.items()
                           if isinstance(i, str) and i.isdigit() and int(i) < len(self.peers)}
                actions += self.core.view_received(member, a, (alive, reasons, str(frame.meta.get("shape"))))
                continue
            try:
                self._check_wait(member, self._view_deadline(member))
            except Failure as exc:
                self._awaiting.discard(member)
                actions += self.core.view_missing(member, a, exc.reason)
        return actions

    def _step_result(self) -> list:
        if self._pending(self.current_round, None, Kind.COMMITTED):
            adopted = self._adopt()
            if adopted is not None:
                return adopted
        if self.now >= self._ask_until:
            return self.core.gave_up()
        if self.now >= self._next_ask:
            ask = self._asking
            for member in ask.members:
                self._apply([SendView(member, ask.attempt, ask.alive, ask.why)])
            self._next_ask = self.now + self._ask_s
            self._ask_s = min(2 * self._ask_s, LAST_ASK_S)
        return []

    def _view_deadline(self, member: str) -> float:
        return silence_deadline(self._view_since, self._last_alive.get(member, {}), self.current_round, self._stall_s)

    def _adopt(self) -> list | None:
        r = self.current_round
        for key in self._pending(r, None, Kind.COMMITTED):
            sender = key[-1]
            if not self.core.may_adopt(sender):
                continue
            frame = self._frames.pop(key)
            try:
                committed = self._parse_committed(frame)
            except (ValueError, FrameError) as exc:
                self.trace(f"{self.me} r{r} unusable committed result from {sender}: {exc}")
                self.core.distrust(sender)
                continue
            self.trace(f"{self.me} r{r} adopts from {sender}")
            return self.core.adopted(sender, committed)
        for key in self._pending(r, None, Kind.COMMITTED):
            del self._frames[key]
        return None

    def _parse_committed(self, frame: Frame) -> Committed:
        meta = frame.meta
        if meta.get("numel") != self.numel or not isinstance(meta.get("attempt"), int):
            raise ValueError("committed result of another layout")
        if len(frame.payload) != self.numel * 4:
            raise ValueError(f"committed result of {len(frame.payload)} bytes")
        values = np.frombuffer(frame.payload, dtype=np.float32).copy()
        if not np.isfinite(values).all():
            raise ValueError("non-finite values in committed result")
        participants = tuple(members_from_mask(meta.get("m"), self.peers))
        why = meta.get("why") if isinstance(meta.get("why"), dict) else {}
        excluded = {self.peers[int(i)]: str(v) for i, v in why.items() if i.isdigit() and int(i) < len(self.peers)}
        return Committed(meta["attempt"], participants, excluded, values)

    # -- timers ----------------------------------------------------------------------------

    def _schedule_tick(self) -> None:
        if self.core is None or self.core.done:
            return
        times = []
        if self.phase == "attempt":
            times.append(self._next_ping)
            times += [deadline for _, deadline in self._flow.waits()]
        elif self.phase == "views":
            times += [self._view_deadline(m) for m in self._awaiting]
        elif self.phase == "result":
            times += [self._next_ask, self._ask_until]
        if not times:
            return
        when = max(min(times), self.now)
        if when not in self._ticks:
            self._ticks.add(when)
            self.net.timer(self.me, when, lambda m: m.tick(when))

    # -- the inbox (mirrors ml/allreduce/inbox.py) ----------------------------------------

    def _on_frame(self, sender: str, frame: Frame) -> None:
        core = self.core
        if (frame.kind == Kind.COMMITTED and core is not None and frame.round_id == core.round_id
                and sender in core.distrusted):
            return
        committed = self.committed.get(frame.round_id)
        if committed is not None:
            self._note_alive(sender, frame.round_id)
            if CommittedRounds.asks_for_result(committed, frame.kind == Kind.VIEW, frame.kind == Kind.PART,
                                               frame.attempt):
                self._push(frame.round_id, sender)
            if frame.kind != Kind.COMMITTED:
                return
        self._put(sender, frame)

    def _put(self, sender: str, frame: Frame) -> None:
        self._note_alive(sender, frame.round_id)
        if frame.round_id < self._min_round or frame.kind == Kind.PING:
            return
        if frame.kind in GAP_KINDS:
            previous = self._last_seen.get(sender)
            if previous is not None and previous[1:] == (frame.round_id, frame.attempt):
                self.estimator.observe_gap(self.now - previous[0])
            self._last_seen[sender] = (self.now, frame.round_id, frame.attempt)
        self._frames[(frame.round_id, frame.attempt, frame.kind, frame.slot, frame.chunk, sender)] = frame

    def pop_frame(self, key: tuple) -> Frame | None:
        return self._frames.pop(key, None)

    def last_alive(self, sender: str) -> dict[int, float]:
        return self._last_alive.get(sender, {})

    def _note_alive(self, sender: str, round_id: int) -> None:
        self._last_alive.setdefault(sender, {})[round_id] = self.now

    def _record_fault(self, sender: str, round_id: int, reason: str, bad_data: bool = False) -> None:
        if sender not in self._faults or self._faults[sender][0] < round_id:
            self._faults[sender] = (round_id, reason, bad_data)

    def _fault_round(self) -> int:
        return self.current_round if self.round_active else self.current_round + 1

    def _pending(self, round_id: int, attempt: int | None, kind: Kind) -> list[tuple]:
        return sorted(k for k in self._frames
                      if k[0] == round_id and k[2] == kind and (attempt is None or k[1] == attempt))

    def _forget_before(self, round_id: int, attempt: int) -> None:
        self._min_round = max(self._min_round, round_id)
        for key in [k for k in self._frames if (k[0], k[1]) < (round_id, attempt)]:
            del self._frames[key]

    # -- sending ---------------------------------------------------------------------------

    def _push(self, round_id: int, peer: str) -> None:
        committed = self.committed.claim_push(round_id, peer)
        if committed is None:
            return
        meta = {"attempt": committed.attempt, "m": members_mask(list(committed.participants), self.peers),
                "why": {str(self.peers.index(p)): r for p, r in committed.excluded.items() if p in self.peers},
                "numel": self.numel}
        self.trace(f"{self.me} r{round_id} pushes its result to {peer}")
        self.send(peer, Frame(Kind.COMMITTED, round_id, 0, 0, 0, meta, committed.result.tobytes()))

    def send(self, to: str, frame: Frame) -> None:
        corrupt_frame = False
        if self.garbage is not None and frame.kind == Kind.PART and frame.round_id >= self.garbage[1]:
            frame, corrupt_frame = _corrupt(frame, self.garbage[0])
        data = b"".join(bytes(b) for b in encode_frame(frame))
        if corrupt_frame:
            data = bytes([99]) + data[1:]  # an unknown frame version: the receiver's parser rejects it
        self.net.send(self.me, to, data)


def _corrupt(frame: Frame, mode: str) -> tuple[Frame, bool]:
    """A garbage sender's version of a PART frame (and whether to break its header)."""
    if mode == "nan":
        payload = np.full(len(frame.payload) // 4, np.nan, np.float32).tobytes()
        return Frame(frame.kind, frame.round_id, frame.attempt, frame.slot, frame.chunk, frame.meta, payload), False
    if mode == "short":
        return Frame(frame.kind, frame.round_id, frame.attempt, frame.slot, frame.chunk, frame.meta,
                     frame.payload[:-4]), False
    if mode == "shape":
        meta = {**frame.meta, "shape": "other-shape"} if frame.meta else frame.meta
        return Frame(frame.kind, frame.round_id, frame.attempt, frame.slot, frame.chunk, meta, frame.payload), False
    if mode == "frame":
        return frame, True
    raise ValueError(f"unknown garbage mode {mode!r}")


def _parse(data: bytes) -> Frame:
    header = parse_header(data[:HEADER_SIZE])
    body = data[HEADER_SIZE:]
    if len(body) != header.meta_len + header.payload_len:
        raise FrameError("frame length does not match its header")
    meta = parse_meta(body[:header.meta_len])
    payload = body[header.meta_len:]
    return Frame(header.kind, header.round_id, header.attempt, header.slot, header.chunk, meta, payload)
