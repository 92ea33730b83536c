"""Where incoming all-reduce frames wait until the round logic takes them.

Frames are keyed by (round, attempt, kind, slot, chunk, sender), so they may arrive before the
receiver starts that round. `take` waits for one key with a stall deadline: it fails with
`PeerFailure` when nothing at all (not even a PING) of that round or an earlier one arrived from
the sender for the stall timeout, or at once when the sender has a recorded fault (malformed
frame, bad contribution) for this round. A sender still busy with an earlier round is on its way
to ours; one busy with a later round has finished ours (committed it or left it), so its new
round's frames do not keep a wait on it alive: the wait ends and the VIEW that follows gets its
committed result pushed (docs/adr/0090). Every PART or RESULT frame feeds its gap since the
sender's previous one of the same attempt to the stall estimator.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from .deadlines import StallEstimator
from .wire import Frame, Kind

Key = tuple[int, int, Kind, int, int, str]
# Only the data flow's gaps set the stall timeout: a VIEW or COMMITTED frame follows a stall that
# was waited out, and learning from that gap stretched later deadlines to 10-20 s.
GAP_KINDS = (Kind.PART, Kind.RESULT)


class PeerFailure(Exception):
    """A member failed this attempt: it stalled, sent bad data, or reported a mismatching plan.
    `bad_data`: it sent something invalid (not merely late or gone)."""

    def __init__(self, peer: str, reason: str, bad_data: bool = False):
        super().__init__(f"{peer}: {reason}")
        self.peer = peer
        self.reason = reason
        self.bad_data = bad_data


def silence_deadline(since: float, last_alive: dict[int, float], round_id: int, stall_s: float) -> float:
    """When a wait on a sender for a frame of `round_id` fails as a stall: `stall_s` after the
    later of `since` and the last frame of that round or an earlier one from the sender (a sender
    busy with a later round has finished ours, so those frames do not count)."""
    return max([since, *(t for r, t in last_alive.items() if r <= round_id)]) + stall_s


class Inbox:
    def __init__(self, estimator: StallEstimator):
        self.estimator = estimator
        self._frames: dict[Key, Frame] = {}
        self._waiters: dict[Key, asyncio.Future[Frame]] = {}
        self._signals: dict[tuple[int, int | None, Kind], asyncio.Future[Any]] = {}
        self._last_seen: dict[str, tuple[float, int, int]] = {}  # last data frame: gap estimates
        self._last_alive: dict[str, dict[int, float]] = {}  # sender -> round -> last frame of any kind
        self._faults: dict[str, tuple[int, str, bool]] = {}  # sender -> (round, reason, bad data)
        self._min_round = 0

    @staticmethod
    def key(frame: Frame, sender: str) -> Key:
        return (frame.round_id, frame.attempt, frame.kind, frame.slot, frame.chunk, sender)

    def put(self, sender: str, frame: Frame) -> None:
        now = self.note_alive(sender, frame.round_id)
        if frame.round_id < self._min_round:
            return
        if frame.kind == Kind.PING:
            return
        if frame.kind in GAP_KINDS:
            previous = self._last_seen.get(sender)
            if previous is not None and previous[1:] == (frame.round_id, frame.attempt):
                self.estimator.observe_gap(now - previous[0])
            self._last_seen[sender] = (now, frame.round_id, frame.attempt)
        key = self.key(frame, sender)
        self._frames[key] = dataclasses.replace(frame, received_at=now)
        self._resolve(self._waiters.pop(key, None))
        for signal in ((frame.round_id, frame.attempt, frame.kind), (frame.round_id, None, frame.kind)):
            self._resolve(self._signals.get(signal))

    def note_alive(self, sender: str, round_id: int) -> float:
        """Record that a frame of `round_id` arrived from `sender` now (also for frames not kept)."""
        now = asyncio.get_running_loop().time()
        self._last_alive.setdefault(sender, {})[round_id] = now
        return now

    def record_fault(self, sender: str, round_id: int, reason: str, bad_data: bool = False) -> None:
        """Mark `sender` faulty from `round_id` on; waits on it fail at once."""
        if sender not in self._faults or self._faults[sender][0] < round_id:
            self._faults[sender] = (round_id, reason, bad_data)
        for key in list(self._waiters):
            if key[-1] == sender:
                self._resolve(self._waiters.pop(key))

    def forgive_link_fault(self, sender: str, round_id: int) -> None:
        """Forget `sender`'s recorded fault for `round_id` if it was a link's, not bad data: a member
        that asks for a result after its links failed must be able to read the push (docs/adr/0242)."""
        entry = self._faults.get(sender)
        if entry is not None and entry[0] == round_id and not entry[2]:
            del self._faults[sender]

    def fault(self, sender: str, round_id: int) -> str | None:
        entry = self._faults.get(sender)
        return entry[1] if entry is not None and entry[0] >= round_id else None

    def signal(self, round_id: int, attempt: int | None, kind: Kind) -> asyncio.Future[Any]:
        """A future done once any frame of this kind (and attempt; None: any) arrived for the round."""
        key = (round_id, attempt, kind)
        fut = self._signals.get(key)
        if fut is None:
            fut = self._signals[key] = asyncio.get_running_loop().create_future()
            if any(k[0] == round_id and k[2] == kind and (attempt is None or k[1] == attempt)
                   for k in self._frames):
                fut.set_result(None)
        return fut

    def clear_signal(self, round_id: int, attempt: int | None, kind: Kind) -> None:
        """Forget a signal so the next `signal` call reflects only frames still waiting."""
        self._signals.pop((round_id, attempt, kind), None)

    def pending(self, round_id: int, attempt: int | None, kind: Kind) -> list[Key]:
        return [k for k in self._frames
                if k[0] == round_id and k[2] == kind and (attempt is None or k[1] == attempt)]

    def peek(self, key: Key) -> Frame | None:
        return self._frames.get(key)

    def pop(self, key: Key) -> Frame | None:
        return self._frames.pop(key, None)

    async def take(self, key: Key, since: float, stall_s: float) -> Frame:
        """Wait for the frame `key`; PeerFailure if its sender is faulty or silent for `stall_s`."""
        sender = key[-1]
        loop = asyncio.get_running_loop()
        while True:
            frame = self._frames.pop(key, None)
            if frame is not None:
                return frame
            reason = self.fault(sender, key[0])
            if reason is not None:
                raise PeerFailure(sender, reason, self._faults[sender][2])
            remaining = silence_deadline(since, self._last_alive.get(sender, {}), key[0], stall_s) - loop.time()
            if remaining <= 0:
                raise PeerFailure(sender, f"stalled: nothing received for {stall_s:.1f}s")
            waiter = self._waiters.get(key)
            if waiter is None or waiter.done():
                waiter = self._waiters[key] = loop.create_future()
            # asyncio.wait, not wait_for: wait_for (3.11) can swallow a cancellation that races
            # with the waiter completing, leaving a cancelled attempt running on
            await asyncio.wait({waiter}, timeout=remaining)

    def forget_before(self, round_id: int, attempt: int = 0) -> None:
        """Drop frames and signals of rounds/attempts before (round_id, attempt)."""
        self._min_round = max(self._min_round, round_id)
        for rounds in self._last_alive.values():  # one earlier round is enough to show a sender behind
            for old in [r for r in rounds if r < round_id - 1]:
                del rounds[old]
        for key in [k for k in self._frames if (k[0], k[1] if k[1] is not None else attempt) < (round_id, attempt)]:
            del self._frames[key]
        for signal in [k for k in self._signals if (k[0], k[1] if k[1] is not None else attempt) < (round_id, attempt)]:
            self._resolve(self._signals.pop(signal))
        for key in [k for k in self._waiters if (k[0], k[1]) < (round_id, attempt)]:
            self._resolve(self._waiters.pop(key))

    @staticmethod
    def _resolve(fut: asyncio.Future[Any] | None) -> None:
        if fut is not None and not fut.done():
            fut.set_result(None)
