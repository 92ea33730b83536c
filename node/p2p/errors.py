"""Error types shared by the transport's protocol cores.

Every decoder in node/p2p raises a subclass of ``ProtocolError`` on malformed, oversized or
unexpected input, so a driver can catch one type, close the offending connection or stream, and
keep serving everyone else.
"""
from __future__ import annotations


class ProtocolError(Exception):
    """The remote side violated a wire protocol (bad framing, bad crypto, limits exceeded)."""


class DecodeError(ProtocolError):
    """Bytes could not be decoded (varint, protobuf, multiaddr)."""


class HandshakeTimeout(ProtocolError):
    """A connection upgrade or stream negotiation took longer than allowed."""
