"""Which chunk to ask which holder for: the downloader's state machine (pure; no I/O; ADR 0147).

Each holder gets ranges of the lowest missing chunks nobody is fetching, up to ``window`` chunks
in flight, in requests of at most ``request_chunks`` (so one holder can keep its link full while
another range is on the way). A holder that answers with a chunk whose hash is wrong, or with one
it was not asked for, is dropped as a liar and its chunks go back to the pool; one whose stream
fails is retried up to ``max_failures`` times, then dropped. When nothing is left to hand out, an
idle holder duplicates chunks still in flight elsewhere (end game), so a slow or dead holder does
not hold up the tail; the first valid copy wins. The driver reports what happened with
``on_chunk``/``on_missing``/``on_failure`` and asks ``requests(holder)`` what to send next.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum


class Verdict(Enum):
    ACCEPT = "accept"         # new valid chunk: write it
    DUPLICATE = "duplicate"   # valid, but another holder's copy came first
    LIAR = "liar"             # wrong hash or unsolicited: the holder is dropped


@dataclass
class HolderState:
    peer: str
    inflight: list[int] = field(default_factory=list)   # requested, in request order
    lacks: set[int] = field(default_factory=set)
    failures: int = 0
    dropped: str | None = None    # why, once dropped
    liar: bool = False
    chunks: int = 0
    bytes: int = 0


class Scheduler:
    def __init__(self, chunks: int, have: Iterable[int | bool], holders: Sequence[str], *, window: int = 8,
                 request_chunks: int = 4, max_failures: int = 3) -> None:
        if window < 1 or request_chunks < 1:
            raise ValueError("window and request_chunks must be positive")
        self.chunks = chunks
        self.have = bytearray(1 if bit else 0 for bit in have)
        if len(self.have) != chunks:
            raise ValueError("the have-bitmap does not match the chunk count")
        self.window = window
        self.request_chunks = min(request_chunks, window)
        self.max_failures = max_failures
        self.holders = {peer: HolderState(peer) for peer in dict.fromkeys(holders)}
        self._fetching: dict[int, set[str]] = {}      # chunk -> holders it is requested from
        self._cursor = 0                               # every chunk below it is held or being fetched

    # ---- queries
    @property
    def done(self) -> bool:
        return all(self.have)

    def missing(self) -> int:
        return self.chunks - sum(self.have)

    def live(self) -> list[str]:
        return [h.peer for h in self.holders.values() if h.dropped is None]

    @property
    def stuck(self) -> bool:
        """True when chunks are missing, none is in flight, and no live holder can be asked for any."""
        if self.done or self._fetching:
            return False
        live = [self.holders[p] for p in self.live()]
        return not any(i not in h.lacks for h in live for i in self._unheld())

    def _unheld(self) -> Iterable[int]:
        return (i for i in range(self.chunks) if not self.have[i])

    def liars(self) -> list[str]:
        return [h.peer for h in self.holders.values() if h.liar]

    # ---- what to send
    def requests(self, peer: str) -> list[tuple[int, int]]:
        """(start, count) ranges to request from ``peer`` now (they count as in flight)."""
        holder = self.holders[peer]
        picked = self._plan(holder)
        for index in picked:
            holder.inflight.append(index)
            self._fetching.setdefault(index, set()).add(peer)
        return _ranges(picked, self.request_chunks)

    def requests_possible(self, peer: str) -> bool:
        """Whether ``requests(peer)`` would ask for anything now."""
        return bool(self._plan(self.holders[peer]))

    def _plan(self, holder: HolderState) -> list[int]:
        if holder.dropped is not None:
            return []
        room = self.window - len(holder.inflight)
        if room < self.request_chunks and holder.inflight:
            return []      # wait until a whole request fits: fewer, larger requests
        return self._pick_new(holder, room) or (self._pick_endgame(holder, room) if not holder.inflight else [])

    def _pick_new(self, holder: HolderState, room: int) -> list[int]:
        while self._cursor < self.chunks and (self.have[self._cursor] or self._cursor in self._fetching):
            self._cursor += 1
        picked: list[int] = []
        index = self._cursor
        while index < self.chunks and len(picked) < room:
            if not self.have[index] and index not in self._fetching and index not in holder.lacks:
                picked.append(index)
            index += 1
        return picked

    def _pick_endgame(self, holder: HolderState, room: int) -> list[int]:
        return [i for i in sorted(self._fetching) if holder.peer not in self._fetching[i]
                and i not in holder.lacks and not self.have[i]][:room]

    # ---- what happened
    def on_chunk(self, peer: str, index: int, valid: bool, size: int = 0) -> Verdict:
        """``peer`` sent chunk ``index``; ``valid``: it matched its leaf hash."""
        holder = self.holders[peer]
        if index not in holder.inflight or not valid:
            self.drop(peer, "sent a chunk that does not match its hash" if index in holder.inflight
                      else f"sent chunk {index}, which was not requested from it", liar=True)
            return Verdict.LIAR
        duplicate = bool(self.have[index])
        self.have[index] = 1
        self._settle(holder, index)
        if duplicate:
            return Verdict.DUPLICATE
        holder.chunks += 1
        holder.bytes += size
        return Verdict.ACCEPT

    def on_missing(self, peer: str, index: int) -> None:
        """``peer`` answered that it lacks chunk ``index``."""
        holder = self.holders[peer]
        if index not in holder.inflight:
            self.drop(peer, f"answered for chunk {index}, which was not requested from it", liar=True)
            return
        self._settle(holder, index)
        holder.lacks.add(index)
        if all(i in holder.lacks for i in self._unheld()):
            self.drop(peer, "holds none of the missing chunks")

    def on_failure(self, peer: str, reason: str) -> bool:
        """``peer``'s stream failed: its chunks go back to the pool; True if it may be retried."""
        holder = self.holders[peer]
        self._release(holder)
        holder.failures += 1
        if holder.failures > self.max_failures:
            self.drop(peer, f"failed {holder.failures} times, last: {reason}")
        return holder.dropped is None

    def on_success(self, peer: str) -> None:
        """A request round-trip worked: the failure count starts again."""
        self.holders[peer].failures = 0

    def drop(self, peer: str, reason: str, *, liar: bool = False) -> None:
        holder = self.holders[peer]
        if holder.dropped is None:
            holder.dropped = reason
        holder.liar = holder.liar or liar
        self._release(holder)

    def _settle(self, holder: HolderState, index: int) -> None:
        holder.inflight.remove(index)
        fetching = self._fetching.get(index)
        if fetching is not None:
            fetching.discard(holder.peer)
            if not fetching:
                del self._fetching[index]
        if index < self._cursor and index not in self._fetching and not self.have[index]:
            self._cursor = index   # back in the pool unless held: _pick_new advances past it again

    def _release(self, holder: HolderState) -> None:
        for index in list(holder.inflight):
            self._settle(holder, index)


def _ranges(indices: Sequence[int], most: int) -> list[tuple[int, int]]:
    """Consecutive runs of ``indices`` as (start, count), each at most ``most`` long."""
    out: list[tuple[int, int]] = []
    for index in indices:
        if out and out[-1][0] + out[-1][1] == index and out[-1][1] < most:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((index, 1))
    return out
