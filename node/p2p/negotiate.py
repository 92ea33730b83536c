"""Drive a multistream negotiator over any byte stream (raw TCP, SecureConn or a yamux stream).

The stream is given as three callables (read, write, unread) so one helper serves every layer;
bytes read past the end of the negotiation are handed back with ``unread``.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from .errors import HandshakeTimeout
from .multistream import DialerNegotiator, ListenerNegotiator, MultistreamError

Read = Callable[[], Awaitable[bytes | memoryview]]
Write = Callable[[bytes], Awaitable[None]]
Unread = Callable[[bytes], None]


async def _run(negotiator: DialerNegotiator | ListenerNegotiator, read: Read, write: Write,
               unread: Unread) -> str:
    while True:
        out = negotiator.data_to_send()
        if out:
            await write(out)
        if negotiator.protocol is not None:
            unread(negotiator.unused)
            return negotiator.protocol
        data = await read()
        if not data:
            raise MultistreamError("stream ended during protocol negotiation")
        negotiator.receive_data(data)


async def select_protocol(read: Read, write: Write, unread: Unread, protocols: Sequence[str],
                          timeout: float) -> str:
    """Dialer side: propose ``protocols`` in order; return the accepted one."""
    try:
        async with asyncio.timeout(timeout):
            return await _run(DialerNegotiator(protocols), read, write, unread)
    except TimeoutError as exc:
        raise HandshakeTimeout(f"protocol negotiation took longer than {timeout} s") from exc


async def accept_protocol(read: Read, write: Write, unread: Unread, supported: Sequence[str],
                          timeout: float) -> str:
    """Listener side: accept the first proposal in ``supported``; return it."""
    try:
        async with asyncio.timeout(timeout):
            return await _run(ListenerNegotiator(supported), read, write, unread)
    except TimeoutError as exc:
        raise HandshakeTimeout(f"protocol negotiation took longer than {timeout} s") from exc
