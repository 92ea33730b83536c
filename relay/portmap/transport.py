"""The I/O of port mapping: one UDP request/answer exchange with the gateway (retransmitted from
250 ms, doubling, RFC 6886 section 3.1), the SSDP search, and size-capped HTTP POST/GET for UPnP.
Only the gateway is heard: datagrams from any other address are dropped (the UDP socket is
connected to it; SSDP answers are filtered by source), and every answer is parsed by a caller's
function, whose PortMapError for junk keeps the exchange waiting for a good answer until the
deadline (an `Unsupported` answer ends it at once)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

import aiohttp

from .errors import PortMapError
from .igd import MAX_SSDP, MAX_XML, SSDP_ADDR, SSDP_PORT, m_search, parse_ssdp
from .pcp import MAX_ANSWER, Unsupported

T = TypeVar("T")
FIRST_RETRY_S = 0.25


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self, source: str, max_size: int = MAX_ANSWER) -> None:
        self.source, self.max_size = source, max_size
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)

    def datagram_received(self, data: bytes, addr) -> None:
        if addr[0] == self.source and len(data) <= self.max_size:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(data)


async def _collect(inbox: _Inbox, send: Callable[[], None], parse: Callable[[bytes], T], timeout: float,
                   what: str) -> T:
    deadline = time.monotonic() + timeout
    retry, next_send = FIRST_RETRY_S, time.monotonic()
    last_error: PortMapError | None = None
    while (left := deadline - time.monotonic()) > 0:
        if time.monotonic() >= next_send:
            send()
            next_send, retry = time.monotonic() + retry, retry * 2
        try:
            data = await asyncio.wait_for(inbox.queue.get(), min(left, max(next_send - time.monotonic(), 0.01)))
        except TimeoutError:
            continue
        try:
            return parse(data)
        except Unsupported:
            raise
        except PortMapError as exc:   # junk: remember it, keep listening for the real answer
            last_error = exc
    raise last_error or PortMapError(f"{what}: no answer in {timeout:g} s")


async def udp_exchange(gateway: str, port: int, request: bytes, parse: Callable[[bytes], T], timeout: float) -> T:
    """Send ``request`` to ``gateway:port`` until ``parse`` accepts an answer from it."""
    loop = asyncio.get_running_loop()
    try:
        transport, inbox = await loop.create_datagram_endpoint(lambda: _Inbox(gateway), remote_addr=(gateway, port))
    except OSError as exc:   # no route to the gateway, no address yet
        raise PortMapError(f"{gateway}:{port}: {exc}") from None
    try:
        return await _collect(inbox, lambda: transport.sendto(request), parse, timeout, f"{gateway}:{port}")
    finally:
        transport.close()


async def ssdp_search(gateway: str, timeout: float) -> str:
    """The device description URL the gateway announces for an M-SEARCH (sent to the SSDP group
    and to the gateway directly); answers from other hosts are ignored."""
    loop = asyncio.get_running_loop()
    try:
        transport, inbox = await loop.create_datagram_endpoint(lambda: _Inbox(gateway, MAX_SSDP),
                                                               local_addr=("0.0.0.0", 0))
    except OSError as exc:
        raise PortMapError(f"SSDP: {exc}") from None
    request = m_search()

    def send() -> None:
        for target in ((SSDP_ADDR, SSDP_PORT), (gateway, SSDP_PORT)):
            with contextlib.suppress(OSError):
                transport.sendto(request, target)
    try:
        return await _collect(inbox, send, lambda d: parse_ssdp(d, gateway), timeout, "SSDP")
    finally:
        transport.close()


async def http(method: str, url: str, timeout: float, headers: dict[str, str] | None = None,
               body: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of one HTTP request, no redirects, the body capped at MAX_XML bytes."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, url, headers=headers, data=body, allow_redirects=False) as resp:
                data = await resp.content.read(MAX_XML + 1)
                return resp.status, data
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
        raise PortMapError(f"UPnP {method} {url[:80]}: {type(exc).__name__}: {exc}") from None
