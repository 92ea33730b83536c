"""The all-reduce `Transport` over the node's p2p Host, with tensor traffic on bulk connections.

`ml.allreduce` wants `open_stream(peer, protocol)` and handlers called as `handler(stream, remote)`;
the Host calls handlers with the stream alone (its `remote_peer` is the authenticated peer id).
Outgoing all-reduce streams go over one dedicated bulk connection per peer (opened on first use,
re-opened when it dies), so consensus and control messages on the shared connection never queue
behind gradients. Peer addresses come from the Host's peer book (the role fills it from the ledger).
"""
from __future__ import annotations

import asyncio

from ml.allreduce.transport import StreamHandler, TransportError
from node.p2p.errors import ProtocolError
from node.p2p.host import Host


class HostTransport:
    """`ml.allreduce.Transport` implemented with a `node.p2p.host.Host`."""

    def __init__(self, host: Host, bulk: bool = True):
        self._host = host
        self._bulk = bulk
        self._bulk_connections: dict[str, object] = {}
        self._dial_locks: dict[str, asyncio.Lock] = {}
        self._protocols: set[str] = set()

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        async def on_stream(stream) -> None:
            await handler(stream, stream.remote_peer)

        self._protocols.add(protocol)
        self._host.set_handler(protocol, on_stream)

    async def open_stream(self, peer_id: str, protocol: str):
        try:
            if not self._bulk:
                return await self._host.open_stream(peer_id, protocol)
            conn = await self._bulk_connection(peer_id)
            return await conn.open_stream(protocol)
        except TransportError:
            raise
        except (OSError, ProtocolError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            self._bulk_connections.pop(peer_id, None)
            raise TransportError(f"cannot open {protocol} to {peer_id}: {exc!r}") from exc

    async def _bulk_connection(self, peer_id: str):
        lock = self._dial_locks.setdefault(peer_id, asyncio.Lock())
        async with lock:
            conn = self._bulk_connections.get(peer_id)
            if conn is None or conn.closed:
                conn = await self._host.open_bulk_connection(peer_id)
                self._bulk_connections[peer_id] = conn
            return conn

    async def close(self) -> None:
        """Stop serving the protocols registered here and close the bulk connections."""
        for protocol in self._protocols:
            self._host.remove_handler(protocol)
        self._protocols.clear()
        connections, self._bulk_connections = list(self._bulk_connections.values()), {}
        for conn in connections:
            try:
                await conn.close()
            except Exception:  # closing a connection that already died
                pass
