"""Resource limits of a Host: connections, handshake and negotiation time, identify size."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostLimits:
    # inbound connections (shared + bulk, direct + relayed): at the cap a new authenticated one evicts
    # the longest-idle inbound connection of an unprotected peer (node/p2p/resources.py, ADR 0145)
    max_inbound_connections: int = 1024
    max_outbound_connections: int = 1024  # our own dials: a separate budget, never used up by inbound
    max_connections_per_peer: int = 8    # shared + bulk connections to one peer
    # inbound TCP connections still upgrading: a full pool evicts the oldest pending socket of the most
    # represented address prefix rather than refusing (node/admission.py, ADR 0186)
    max_pending_inbound: int = 64
    max_pending_inbound_per_ip: int = 8       # of those, from one source IP
    max_pending_inbound_per_prefix: int = 16  # of those, from one /24 (IPv4) or /48 (IPv6)
    pending_inbound_reserved: int = 8         # of those, kept for known addresses of protected peers
    pending_inbound_grace: float = 2.0        # a socket pending longer may be evicted by any newcomer
    inbound_handshake_timeout: float = 5.0    # an inbound socket's whole upgrade (at most handshake_timeout)
    max_streams_per_connection: int = 10_240  # yamux streams open at once on one connection
    connect_timeout: float = 3.0         # the TCP connect alone (a dropped SYN fails fast: next address)
    handshake_timeout: float = 10.0      # TCP connect + multistream + noise + muxer selection
    negotiate_timeout: float = 10.0      # multistream selection on one stream
    identify_timeout: float = 10.0
    # a bulk dial that finds only a capped (limited) relayed connection waits this long for a direct one
    # (a DCUtR hole punch started over the circuit) before failing (ADR 0143)
    bulk_direct_wait: float = 15.0
    # yamux receive windows auto-tune within this many bytes beyond the initial 256 KiB per stream,
    # all connections together, split evenly among the streams moving data (node/p2p/yamux.py)
    receive_window_budget: int = 256 * 1024 * 1024
