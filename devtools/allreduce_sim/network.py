"""Simulated time and an in-memory network for the all-reduce simulator.

`Scheduler` runs callbacks in (time, sequence) order on a simulated clock: the same inputs give
the same order. `Network` carries frames as bytes between members over per-pair links that keep
FIFO order (the real transport is one ordered TCP stream per pair; a receiver that gets an
unparsable frame resets the stream, losing what is in flight on it) with a per-link latency and a
seeded jitter; a frame is never delivered before one sent earlier on the same link. A killed
member (at a time, or right after sending its N-th RESULT frame: a reducer dying mid-broadcast)
stops; its peers see its links close after the frames already in flight; a frozen (SIGSTOP-like)
member handles nothing until it wakes, then everything queued for it, in order. A member in an outage
(its home link down) runs on, but what it sends and what is sent to it meanwhile arrives only after the
link is back, in order (TCP holds it); with `outage_breaks` such a write breaks the connection instead
(lost with what is in flight on it; the writer learns at once, the other end once the link is back).
"""
from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from ml.allreduce.wire import Kind


class Scheduler:
    def __init__(self):
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, when: float, callback: Callable[[], None], seq: int | None = None) -> int:
        """Run `callback` at simulated time `when` (never in the past); returns its sequence number."""
        if seq is None:
            self._seq += 1
            seq = self._seq
        heapq.heappush(self._queue, (max(when, self.now), seq, callback))
        return seq

    def run(self, until: float) -> bool:
        """Run events up to time `until`; False if events were left at that time."""
        while self._queue:
            when, _, callback = self._queue[0]
            if when > until:
                return False
            heapq.heappop(self._queue)
            self.now = when
            callback()
        return True


class Network:
    """Links between members. `deliver(receiver, sender, data)` and `closed(receiver, sender)` are
    the receiving members' entry points; a member is addressed by its id."""

    def __init__(self, scheduler: Scheduler, rng: random.Random, members: list[str], max_jitter_s: float):
        self.scheduler = scheduler
        self.rng = rng
        self.members: dict[str, object] = {}
        self.latency = {(a, b): rng.uniform(0.0005, 0.02) for a in members for b in members if a != b}
        self.max_jitter_s = max_jitter_s
        self._last_delivery: dict[tuple[str, str], float] = {}
        self.killed: set[str] = set()
        self.killed_at: dict[str, float] = {}
        self.frozen_until: dict[str, float] = {}
        self.frames_sent = 0
        self.crash_after: dict[str, int] = {}  # member -> dies right after sending this many RESULT frames
        self.on_crash: Callable[[str], None] = lambda member: None
        self._sent_by: dict[str, int] = {}
        self._epoch: dict[tuple[str, str], int] = {}  # bumped when the receiver resets the stream
        self._backlog: dict[str, list[tuple[str, int, bytes]]] = {}  # frozen member -> deliveries waiting
        self.outages: dict[str, tuple[float, float]] = {}   # member -> (from, until): its links carry nothing
        self.outage_breaks = False   # True: a write over a link that is down breaks the connection, else waits

    def attach(self, member_id: str, member) -> None:
        self.members[member_id] = member

    def _link_back(self, sender: str, receiver: str) -> float | None:
        """When the link between the two is back, if one of their home links is down now (else None)."""
        ends = [end for start, end in (self.outages.get(m, (0.0, 0.0)) for m in (sender, receiver))
                if start <= self.scheduler.now < end]
        return max(ends) if ends else None

    def _link_time(self, sender: str, receiver: str) -> float:
        key = (sender, receiver)
        when = self.scheduler.now + self.latency[key] + self.rng.uniform(0.0, self.max_jitter_s)
        back = self._link_back(sender, receiver)
        if back is not None:   # a home link down: TCP holds the frame until it is back
            when = max(when, back + self.latency[key])
        when = max(when, self._last_delivery.get(key, 0.0) + 1e-6)  # per-link FIFO
        self._last_delivery[key] = when
        return when

    def send(self, sender: str, receiver: str, data: bytes) -> None:
        if sender in self.killed:
            return
        if receiver in self.killed:  # the writer's stream fails: the sender learns it shortly
            self.scheduler.at(self.scheduler.now + self.latency[(sender, receiver)],
                              lambda: self._run(sender, lambda m: m.link_broken(receiver)))
            return
        back = self._link_back(sender, receiver) if self.outage_breaks else None
        if back is not None:
            self._break(sender, receiver, back)
            return
        self.frames_sent += 1
        epoch = self._epoch.get((sender, receiver), 0)
        self.scheduler.at(self._link_time(sender, receiver),
                          lambda: self._run(receiver, lambda m: self._deliver(m, sender, receiver, epoch, data),
                                            delivery=(sender, epoch, data)))
        if data[1] != Kind.RESULT:
            return
        self._sent_by[sender] = self._sent_by.get(sender, 0) + 1
        if self._sent_by[sender] == self.crash_after.get(sender):
            self.on_crash(sender)
            self.kill(sender)

    def _deliver(self, member, sender: str, receiver: str, epoch: int, data: bytes) -> None:
        if epoch == self._epoch.get((sender, receiver), 0):  # else its stream was reset meanwhile
            member.deliver(sender, data)

    def _break(self, sender: str, receiver: str, back: float) -> None:
        """A write over a link that is down fails: the connection is gone both ways, with what is in flight
        on it; the writer learns it at once, the other end when the link is back at `back` (its peer's reset)."""
        for key in ((sender, receiver), (receiver, sender)):
            self._epoch[key] = self._epoch.get(key, 0) + 1
        self.scheduler.at(self.scheduler.now + self.latency[(sender, receiver)],
                          lambda: self._run(sender, lambda m: m.link_broken(receiver)))
        self.scheduler.at(back + self.latency[(sender, receiver)],
                          lambda: self._run(receiver, lambda m: m.link_broken(sender)))

    def reset(self, receiver: str, sender: str) -> None:
        """The receiver resets the stream from `sender` (it sent an unparsable frame): what is still
        in flight on it is lost, and the sender's next write fails, so it learns of it shortly."""
        self._epoch[(sender, receiver)] = self._epoch.get((sender, receiver), 0) + 1
        self.scheduler.at(self.scheduler.now + self.latency[(receiver, sender)],
                          lambda: self._run(sender, lambda m: m.link_broken(receiver)))

    def kill(self, member_id: str) -> None:
        """SIGKILL: the member stops; each peer's link from it closes after what is in flight."""
        self.killed.add(member_id)
        self.killed_at.setdefault(member_id, self.scheduler.now)
        for other in self.members:
            if other != member_id and other not in self.killed:
                self.scheduler.at(self._link_time(member_id, other),
                                  lambda other=other: self._run(other, lambda m: m.link_broken(member_id)))

    def freeze(self, member_id: str, seconds: float) -> None:
        """SIGSTOP for `seconds`: the member's events wait until it wakes, in their order."""
        self.frozen_until[member_id] = max(self.frozen_until.get(member_id, 0.0), self.scheduler.now + seconds)

    def is_frozen(self, member_id: str) -> bool:
        return self.frozen_until.get(member_id, 0.0) > self.scheduler.now

    def _run(self, member_id: str, action: Callable[[object], None], seq: int | None = None,
             delivery: tuple[str, int, bytes] | None = None) -> None:
        if member_id in self.killed:
            return
        wake = self.frozen_until.get(member_id, 0.0)
        if wake > self.scheduler.now and delivery is not None:
            # what reaches a frozen member waits in its socket buffers; when it wakes, its readers
            # take all of it before the member decides anything (docs/adr/0141)
            backlog = self._backlog.setdefault(member_id, [])
            if not backlog:
                self.scheduler._seq += 1
                self.scheduler.at(wake, lambda: self._run(member_id, lambda m: self._drain(m, member_id)),
                                  seq=-(1 << 40) + self.scheduler._seq)
            backlog.append(delivery)
            return
        if wake > self.scheduler.now:  # keeps its place among the member's deferred events
            self.scheduler._seq += 1
            self.scheduler.at(wake, lambda: self._run(member_id, action), seq=-(1 << 40) + self.scheduler._seq)
            return
        action(self.members[member_id])

    def _drain(self, member, member_id: str) -> None:
        backlog = self._backlog.pop(member_id, [])
        member.deliver_many([(sender, data) for sender, epoch, data in backlog
                             if epoch == self._epoch.get((sender, member_id), 0)])

    def timer(self, member_id: str, when: float, action: Callable[[object], None]) -> None:
        self.scheduler.at(when, lambda: self._run(member_id, action))
