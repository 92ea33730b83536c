"""The all-reduce `Transport` over the node's p2p Host, with tensor traffic on bulk connections.

The one `Transport` the product runs the all-reduce on (ComputeRole, the local worker, the netlab
and the benchmark's `--transport host` all use it). `ml.allreduce` wants `open_stream(peer,
protocol)` and handlers called as `handler(stream, remote)`; the Host calls handlers with the
stream alone (its `remote_peer` is the peer id the noise handshake authenticated).

Outgoing all-reduce streams go over one dedicated bulk connection per peer (noise + yamux, opened
on first use, re-opened when it dies or is being retired: a relayed one the peer punched around,
docs/adr/0233), so consensus and control messages on the shared connection
never queue behind gradients. A direct bulk connection's socket keeps at most 64 KiB unsent in the
kernel (TCP_NOTSENT_LOWAT, as `TcpTransport`'s do), so the uplink's turn-taking orders what goes
out (docs/adr/0097); a relayed one has no socket of its own. Peer addresses come from the Host's
peer book (the role fills it from the ledger). Every bulk connection opened is shown to `relay_meter`,
which counts what the relayed ones carry per relay for the task being trained (docs/adr/0223).
"""
from __future__ import annotations

import asyncio
import contextlib

from ml.allreduce.transport import PeerUnreachable, StreamHandler, TransportError, is_going_away, set_unsent_lowat
from ml.compute.relay_meter import RelayMeter
from node.p2p.connection import Connection, HostStream
from node.p2p.errors import ProtocolError
from node.p2p.host import Host


class HostTransport:
    """`ml.allreduce.Transport` implemented with a `node.p2p.host.Host`."""

    def __init__(self, host: Host):
        self.host = host
        self.my_id = host.peer_id
        self._bulk_connections: dict[str, Connection] = {}
        self._dial_locks: dict[str, asyncio.Lock] = {}
        self._protocols: set[str] = set()
        self.relay_meter = RelayMeter()

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        async def on_stream(stream: HostStream) -> None:
            await handler(stream, stream.remote_peer)

        self._protocols.add(protocol)
        self.host.set_handler(protocol, on_stream)

    async def open_stream(self, peer_id: str, protocol: str) -> HostStream:
        try:
            conn = await self._bulk_connection(peer_id)
        except TransportError:
            raise
        except (OSError, ProtocolError, asyncio.IncompleteReadError) as exc:  # no connection: a failed dial
            raise PeerUnreachable(f"cannot open {protocol} to {peer_id}: {exc!r}") from exc
        try:
            return await conn.open_stream(protocol)
        except TransportError:
            raise
        except (OSError, ProtocolError, asyncio.IncompleteReadError) as exc:  # TimeoutError is an OSError
            self._bulk_connections.pop(peer_id, None)
            raise TransportError(f"cannot open {protocol} to {peer_id}: {exc!r}") from exc

    async def _bulk_connection(self, peer_id: str) -> Connection:
        lock = self._dial_locks.setdefault(peer_id, asyncio.Lock())
        async with lock:  # concurrent first sends to one peer share one bulk connection
            conn = self._bulk_connections.get(peer_id)
            if conn is None or conn.closed or is_going_away(conn):   # retired: it closes once its streams finish
                conn = await self.host.open_bulk_connection(peer_id)
                _limit_unsent(conn)
                self.relay_meter.opened(conn)
                self._bulk_connections[peer_id] = conn
            return conn

    async def close(self) -> None:
        """Stop serving the protocols registered here and close the bulk connections."""
        for protocol in self._protocols:
            self.host.remove_handler(protocol)
        self._protocols.clear()
        connections, self._bulk_connections = list(self._bulk_connections.values()), {}
        for conn in connections:
            with contextlib.suppress(Exception):  # closing a connection that already died
                await conn.close()


def _limit_unsent(conn: Connection) -> None:
    """TCP_NOTSENT_LOWAT on a direct connection's socket (a relayed one has no socket of its own)."""
    transport = getattr(conn.secure.tcp, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        set_unsent_lowat(sock)
