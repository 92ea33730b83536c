"""The data flow of one simulated attempt, sans-I/O: what a member sends when the attempt starts,
what it takes from its inbox, and whom it is waiting on until when.

`ButterflyFlow` mirrors ml/allreduce/butterfly.py in fp32 (each member sends shard k of its values
to reducer k; reducer k sums every member's chunk in sorted member order, divides, and sends the
same bytes to everyone; a member commits once it holds every reducer's result). `AllGatherFlow`
mirrors allgather.py (every member sends its whole contribution to every other, confirms with an
empty RESULT once it holds them all, and averages them all itself once every other member
confirmed: docs/adr/0141). Both validate first-chunk meta (shapes, plan digest) and payloads as the real flows
do, raising `Failure` naming the member to blame.
"""
from __future__ import annotations

import numpy as np

from ml.allreduce.inbox import silence_deadline
from ml.allreduce.plan import make_plan
from ml.allreduce.wire import Frame, FrameError, Kind, members_from_mask, members_mask

SHAPE = "sim-shape"  # every honest member's tensor-layout digest


class Failure(Exception):
    def __init__(self, peer: str, reason: str, bad_data: bool = False, their_members: list[str] | None = None):
        super().__init__(f"{peer}: {reason}")
        self.peer, self.reason, self.bad_data, self.their_members = peer, reason, bad_data, their_members


def mean_in_order(values: list[np.ndarray]) -> np.ndarray:
    """The float32 mean summed in the given order (the bits every member must agree on)."""
    acc = values[0].astype(np.float32).copy()
    for v in values[1:]:
        acc += v
    return acc / np.float32(len(values))


class _Flow:
    def __init__(self, member, members: list[str], attempt: int, stall_s: float, grace_s: float):
        self.m = member
        self.members = members
        self.others = [p for p in members if p != member.me]
        self.round_id = member.current_round
        self.attempt = attempt
        self.started = member.now
        self.stall_s = stall_s
        self.grace_s = grace_s
        self.plan = make_plan(members, set(), {}, member.numel, member.chunk, type(self).__name__)
        self.first_meta = {"plan": self.plan.digest(), "shape": SHAPE, "m": members_mask(members, member.peers)}

    def frame(self, kind: Kind, slot: int, chunk: int, payload: bytes, meta: dict | None = None) -> Frame:
        return Frame(kind, self.round_id, self.attempt, slot, chunk, meta or {}, payload)

    def take(self, kind: Kind, slot: int, chunk: int, sender: str) -> Frame | None:
        return self.m.pop_frame((self.round_id, self.attempt, kind, slot, chunk, sender))

    def deadline(self, sender: str, first: bool, factor: float = 1.0) -> float:
        since = self.started + (self.grace_s if first else 0.0)
        return silence_deadline(since, self.m.last_alive(sender), self.round_id, self.stall_s * factor)

    def check_first_meta(self, sender: str, meta: dict) -> None:
        if meta.get("shape") != SHAPE:
            raise Failure(sender, "wrong-shape contribution (tensor layout differs)", bad_data=True)
        if meta.get("plan") != self.first_meta["plan"]:
            try:
                theirs = members_from_mask(meta.get("m"), self.m.peers)
            except FrameError:
                raise Failure(sender, "malformed first-chunk meta", bad_data=True) from None
            if theirs == self.members:
                raise Failure(sender, "plan differs over the same members", bad_data=True)
            raise Failure(sender, "planned over other members", their_members=theirs)

    @staticmethod
    def values(sender: str, frame: Frame, numel: int, what: str) -> np.ndarray:
        if len(frame.payload) != numel * 4:
            raise Failure(sender, f"malformed {what}: {len(frame.payload)} bytes, expected {numel * 4}", bad_data=True)
        values = np.frombuffer(frame.payload, dtype=np.float32)
        if not np.isfinite(values).all():
            raise Failure(sender, f"non-finite values in {what}", bad_data=True)
        return values


class AllGatherFlow(_Flow):
    def start(self) -> None:
        flat = self.m.flat
        self.parts: dict[str, list[np.ndarray]] = {p: [] for p in self.others}
        self.count = len(range(0, self.m.numel, self.m.chunk))
        self.confirmed: set[str] | None = None  # who confirmed holding every contribution (once we do)
        for member in self.others:
            for c, start in enumerate(range(0, self.m.numel, self.m.chunk)):
                meta = self.first_meta if c == 0 else None
                self.m.send(member, self.frame(Kind.PART, 0, c, flat[start:start + self.m.chunk].tobytes(), meta))

    def progress(self) -> np.ndarray | None:
        for sender, got in self.parts.items():
            while len(got) < self.count:
                frame = self.take(Kind.PART, 0, len(got), sender)
                if frame is None:
                    break
                if not got:
                    self.check_first_meta(sender, frame.meta)
                got.append(self.values(sender, frame, min(self.m.chunk, self.m.numel - len(got) * self.m.chunk),
                                       "contribution"))
        if any(len(got) < self.count for got in self.parts.values()):
            return None
        if self.confirmed is None:  # every contribution is here: confirm it to everyone (docs/adr/0141)
            self.confirmed = set()
            for member in self.others:
                self.m.send(member, self.frame(Kind.RESULT, 0, 0, b""))
        for sender in self.others:
            if sender not in self.confirmed:
                frame = self.take(Kind.RESULT, 0, 0, sender)
                if frame is not None:
                    if frame.payload:
                        raise Failure(sender, f"malformed confirmation: {len(frame.payload)} bytes", bad_data=True)
                    self.confirmed.add(sender)
        if len(self.confirmed) < len(self.others):
            return None
        return mean_in_order([self.m.flat if p == self.m.me else np.concatenate(self.parts[p]) for p in self.members])

    def waits(self) -> list[tuple[str, float]]:
        waits = [(s, self.deadline(s, first=not got)) for s, got in self.parts.items() if len(got) < self.count]
        if self.confirmed is not None:
            waits += [(s, self.deadline(s, first=False)) for s in self.others if s not in self.confirmed]
        return waits


class ButterflyFlow(_Flow):
    def start(self) -> None:
        flat = self.m.flat
        self.out = np.zeros(self.m.numel, np.float32)
        self.results_due = {}   # (reducer, shard) -> next chunk expected from that reducer
        self.parts_due = {}     # sender -> next chunk of my shard expected from it
        self.my_shard = None
        self.pending: dict[int, dict[str, np.ndarray]] = {}
        for shard, reducer in enumerate(self.plan.reducers):
            chunks = self.plan.chunks(shard)
            if reducer == self.m.me:
                self.my_shard = shard
                self.parts_due = {p: 0 for p in self.others} if chunks else {}
                self.reduced = 0
            elif chunks:
                self.results_due[(reducer, shard)] = 0
                for c, (a, b) in enumerate(chunks):
                    meta = self.first_meta if c == 0 else None
                    self.m.send(reducer, self.frame(Kind.PART, shard, c, flat[a:b].tobytes(), meta))

    def progress(self) -> np.ndarray | None:
        if self.my_shard is not None:
            self._reduce()
        for (reducer, shard), c in list(self.results_due.items()):
            chunks = self.plan.chunks(shard)
            while c < len(chunks):
                frame = self.take(Kind.RESULT, shard, c, reducer)
                if frame is None:
                    break
                a, b = chunks[c]
                self.out[a:b] = self.values(reducer, frame, b - a, "result")
                c += 1
            if c == len(chunks):
                del self.results_due[(reducer, shard)]
            else:
                self.results_due[(reducer, shard)] = c
        done = not self.results_due and (self.my_shard is None or self.reduced == len(self.plan.chunks(self.my_shard)))
        return self.out if done else None

    def _reduce(self) -> None:
        chunks = self.plan.chunks(self.my_shard)
        for sender in sorted(self.parts_due):
            c = self.parts_due[sender]
            while c < len(chunks):
                frame = self.take(Kind.PART, self.my_shard, c, sender)
                if frame is None:
                    break
                if c == 0:
                    self.check_first_meta(sender, frame.meta)
                a, b = chunks[c]
                self.pending.setdefault(c, {})[sender] = self.values(sender, frame, b - a, "contribution")
                c += 1
            self.parts_due[sender] = c
        while self.reduced < len(chunks) and len(self.pending.get(self.reduced, {})) == len(self.others):
            c = self.reduced
            a, b = chunks[c]
            got = self.pending.pop(c)
            mean = mean_in_order([self.m.flat[a:b] if p == self.m.me else got[p] for p in self.members])
            self.out[a:b] = mean
            for member in self.others:
                self.m.send(member, self.frame(Kind.RESULT, self.my_shard, c, mean.tobytes()))
            self.reduced += 1

    def waits(self) -> list[tuple[str, float]]:
        waits = []
        if self.my_shard is not None:
            count = len(self.plan.chunks(self.my_shard))
            waits += [(s, self.deadline(s, first=c == 0)) for s, c in self.parts_due.items() if c < count]
        waits += [(reducer, self.deadline(reducer, first=True, factor=2.0)) for reducer, _ in self.results_due]
        return waits


FLOWS = {"butterfly": ButterflyFlow, "allgather": AllGatherFlow}
