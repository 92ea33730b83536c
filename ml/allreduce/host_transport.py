"""`Transport` over the node's libp2p-compatible Host, on dedicated bulk connections.

All-reduce traffic is bulk: each peer gets one dedicated connection (`Host.open_bulk_connection`,
noise-encrypted, peer id authenticated) opened on first use and reopened if it closes, so tensor
streams never queue behind control traffic on the shared connection. Incoming streams arrive
through `Host.set_handler`; the Host tells us the authenticated remote peer id. A direct bulk
connection keeps little unsent data in the kernel (TCP_NOTSENT_LOWAT), like `TcpTransport`'s, so
the uplink's turn-taking orders what goes out (docs/adr/0097).
"""
from __future__ import annotations

import asyncio

from .transport import StreamHandler, set_unsent_lowat


class HostTransport:
    def __init__(self, host, bulk: bool = True):
        self.host = host
        self.my_id = host.peer_id
        self._bulk = bulk
        self._connections: dict[str, object] = {}
        self._dialing: dict[str, asyncio.Lock] = {}

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        async def on_stream(stream) -> None:
            await handler(stream, stream.remote_peer)

        self.host.set_handler(protocol, on_stream)

    async def open_stream(self, peer_id: str, protocol: str):
        if not self._bulk:
            return await self.host.open_stream(peer_id, protocol)
        lock = self._dialing.setdefault(peer_id, asyncio.Lock())
        async with lock:  # concurrent first sends to one peer share one bulk connection
            conn = self._connections.get(peer_id)
            if conn is None or conn.closed:
                conn = self._connections[peer_id] = await self.host.open_bulk_connection(peer_id)
                _limit_unsent(conn)
        return await conn.open_stream(protocol)

    async def close(self) -> None:
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()


def _limit_unsent(conn) -> None:
    """TCP_NOTSENT_LOWAT on a direct bulk connection's socket (a relayed one has none)."""
    transport = getattr(conn.secure.tcp, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        set_unsent_lowat(sock)
