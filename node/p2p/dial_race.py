"""Dial ranking: when to try each of a peer's addresses, and the race among them.

Direct addresses are tried in order, each started ``DIRECT_STAGGER_S`` after the previous one or
at once when the previous one failed (happy eyeballs, RFC 8305), so a dead or unroutable address
(a NAT'd peer's private one: its SYNs vanish) costs a quarter second instead of a connect timeout.
Relayed addresses are held back (libp2p's dial ranking does the same): they start one at a time
once every direct attempt failed, or ``RELAY_DELAY_S`` after the first direct one while none of
them has reached the peer (a direct attempt that has its TCP connection only waits for its
handshake). The first attempt to succeed wins; the others are cancelled, and any that succeeded
at the same moment are handed to ``discard``.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

DIRECT_STAGGER_S = 0.25
RELAY_DELAY_S = 0.5

T = TypeVar("T")


class AllDialsFailed(Exception):
    """Every attempt failed; ``errors`` holds "<label>: <error>" in address order."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors) or "no known address")
        self.errors = errors


@dataclass(frozen=True)
class DialAttempt(Generic[T]):
    label: str                                               # the address, for error messages
    relayed: bool
    run: Callable[[Callable[[], None]], Awaitable[T]]        # gets `reached()`: call once the peer answered
    failures: tuple[type[BaseException], ...] = (OSError, TimeoutError)


class _Reached:
    def __init__(self) -> None:
        self.count = 0


async def race(attempts: list[DialAttempt[T]], discard: Callable[[T], Awaitable[None]], *,
               stagger_s: float = DIRECT_STAGGER_S, relay_delay_s: float = RELAY_DELAY_S) -> T:
    """The result of the first attempt to succeed, under the ranking above; AllDialsFailed if none."""
    direct = [a for a in attempts if not a.relayed]
    relayed = [a for a in attempts if a.relayed]
    errors: dict[int, str] = {}
    order = {id(a): i for i, a in enumerate(attempts)}
    pending: dict[asyncio.Task[T], DialAttempt[T]] = {}
    reached = _Reached()
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_direct_at = started
    winner: asyncio.Task[T] | None = None

    def launch(attempt: DialAttempt[T]) -> None:
        hit = [False]

        def on_reached() -> None:
            if not hit[0]:
                hit[0] = True
                reached.count += 1

        async def run() -> T:
            try:
                return await attempt.run(on_reached)
            finally:
                if hit[0]:
                    reached.count -= 1

        pending[asyncio.ensure_future(run())] = attempt

    try:
        while True:
            now = loop.time()
            if direct and now >= next_direct_at:
                launch(direct.pop(0))
                next_direct_at = now + stagger_s
            directs_left = bool(direct) or any(not a.relayed for a in pending.values())
            relay_busy = any(a.relayed for a in pending.values())
            relay_ok = not directs_left or (now >= started + relay_delay_s and reached.count == 0)
            if relayed and not relay_busy and relay_ok:
                launch(relayed.pop(0))
            if not pending:
                if not (direct or relayed):
                    raise AllDialsFailed([errors[i] for i in sorted(errors)])
                next_direct_at = now  # nothing running: the next address starts now
                continue
            wake = [next_direct_at] if direct else []
            if relayed and not relay_busy and directs_left:
                wake.append(started + relay_delay_s)
            timeout = max(0.0, min(wake) - loop.time()) if wake else None
            done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            unexpected = None
            for task in done:
                attempt = pending.pop(task)
                exc = task.exception()
                if exc is None:
                    if winner is None:
                        winner = task
                    else:
                        await discard(task.result())
                elif isinstance(exc, attempt.failures):
                    errors[order[id(attempt)]] = f"{attempt.label}: {type(exc).__name__}: {exc}"
                    if not attempt.relayed:
                        next_direct_at = loop.time()  # a failed address hands over at once
                else:
                    unexpected = exc
            if unexpected is not None:  # a bug, not a dial failure: surface it
                if winner is not None:
                    await discard(winner.result())
                raise unexpected
            if winner is not None:
                return winner.result()
    finally:
        await _cancel(pending, discard)


async def _cancel(pending: dict[asyncio.Task[T], DialAttempt[T]], discard: Callable[[T], Awaitable[None]]) -> None:
    """Cancel the losers; a loser that had already succeeded is discarded."""
    for task in pending:
        task.cancel()
    results = await asyncio.gather(*pending, return_exceptions=True)
    for result in results:
        if not isinstance(result, BaseException):
            await discard(result)
