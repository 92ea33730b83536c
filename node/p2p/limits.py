"""Resource limits of a Host: connections, handshake and negotiation time, identify size."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostLimits:
    max_connections: int = 1024          # all open connections (inbound + outbound + bulk)
    max_connections_per_peer: int = 8    # shared + bulk connections to one peer
    max_pending_inbound: int = 64        # inbound TCP connections still upgrading
    max_streams_per_connection: int = 10_240  # yamux streams open at once on one connection
    connect_timeout: float = 3.0         # the TCP connect alone (a dropped SYN fails fast: next address)
    handshake_timeout: float = 10.0      # TCP connect + multistream + noise + muxer selection
    negotiate_timeout: float = 10.0      # multistream selection on one stream
    identify_timeout: float = 10.0
    # yamux receive windows auto-tune within this many bytes beyond the initial 256 KiB per stream,
    # all connections together, split evenly among the streams moving data (node/p2p/yamux.py)
    receive_window_budget: int = 256 * 1024 * 1024
