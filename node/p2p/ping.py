"""``/ipfs/ping/1.0.0``: the dialer sends 32 random bytes, the listener echoes them back.

``check_pong`` is the sans-I/O check; ``ping_once`` and ``serve_ping`` run it over any stream
with ``write``/``readexactly``.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Protocol

from .errors import ProtocolError

PROTOCOL_ID = "/ipfs/ping/1.0.0"
PING_LENGTH = 32
MAX_PINGS_PER_STREAM = 10_000


class PingStream(Protocol):
    """The stream calls ping needs (HostStream and YamuxStream have them)."""

    async def write(self, data: bytes) -> None: ...

    async def readexactly(self, n: int) -> bytes: ...

    async def close(self) -> None: ...


class PingError(ProtocolError):
    """The echoed bytes differ from what was sent, or the stream ended early."""


def check_pong(sent: bytes, received: bytes) -> None:
    if len(received) != PING_LENGTH or received != sent:
        raise PingError("ping reply does not match the payload sent")


async def ping_once(stream: PingStream) -> float:
    """One round trip on an open ping stream; returns the RTT in seconds."""
    payload = os.urandom(PING_LENGTH)
    start = time.perf_counter()
    await stream.write(payload)
    try:
        reply = await stream.readexactly(PING_LENGTH)
    except asyncio.IncompleteReadError as exc:
        raise PingError("stream ended before the ping reply") from exc
    rtt = time.perf_counter() - start
    check_pong(payload, reply)
    return rtt


async def serve_ping(stream: PingStream) -> None:
    """Echo 32-byte payloads until the dialer closes the stream (bounded per stream)."""
    for _ in range(MAX_PINGS_PER_STREAM):
        try:
            payload = await stream.readexactly(PING_LENGTH)
        except asyncio.IncompleteReadError:
            break
        await stream.write(payload)
    await stream.close()
