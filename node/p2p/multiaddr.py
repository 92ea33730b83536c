"""Multiaddrs: parse text and binary forms, format them, pull out TCP endpoints and peer IDs.

Covers the protocols the node uses: ip4, ip6, tcp, udp, dns, dns4, dns6, dnsaddr, p2p,
p2p-circuit, quic-v1, ws, wss. Binary form follows the multiaddr spec (varint protocol code,
then a fixed-size value or a varint-length-prefixed one), as carried in identify's listenAddrs.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from node.identity import InvalidPeerId, b58decode, b58encode, public_key_from_peer_id_bytes

from .errors import DecodeError
from .varint import VarintError, decode_uvarint_complete, encode_uvarint


class MultiaddrError(DecodeError):
    """Text or bytes are not a multiaddr we understand."""


# name -> (code, value size: 0 none, >0 fixed bytes, -1 varint-length-prefixed)
_PROTOCOLS: dict[str, tuple[int, int]] = {
    "ip4": (4, 4),
    "tcp": (6, 2),
    "udp": (273, 2),
    "dns": (53, -1),
    "dns4": (54, -1),
    "dns6": (55, -1),
    "dnsaddr": (56, -1),
    "ip6": (41, 16),
    "p2p-circuit": (290, 0),
    "p2p": (421, -1),
    "quic-v1": (0x01CD, 0),
    "ws": (477, 0),
    "wss": (478, 0),
}
_BY_CODE = {code: (name, size) for name, (code, size) in _PROTOCOLS.items()}
MAX_MULTIADDR_BYTES = 1024


def _value_to_bytes(name: str, value: str) -> bytes:
    try:
        if name == "ip4":
            return ipaddress.IPv4Address(value).packed
        if name == "ip6":
            return ipaddress.IPv6Address(value).packed
        if name in ("tcp", "udp"):
            port = int(value, 10)
            if not 0 <= port <= 65535:
                raise ValueError("port out of range")
            return port.to_bytes(2, "big")
        if name == "p2p":
            raw = b58decode(value)
            public_key_from_peer_id_bytes(raw)
            return raw
        if not value or "/" in value:
            raise ValueError("empty or slash in value")
        return value.encode("utf-8")
    except (ValueError, InvalidPeerId) as exc:
        raise MultiaddrError(f"bad /{name} value {value!r}: {exc}") from exc


def _value_to_text(name: str, raw: bytes) -> str:
    try:
        if name == "ip4":
            return str(ipaddress.IPv4Address(raw))
        if name == "ip6":
            return str(ipaddress.IPv6Address(raw))
        if name in ("tcp", "udp"):
            return str(int.from_bytes(raw, "big"))
        if name == "p2p":
            public_key_from_peer_id_bytes(raw)
            return b58encode(raw)
        text = raw.decode("utf-8")
        if not text or "/" in text:
            raise ValueError("empty or slash in value")
        return text
    except (ValueError, InvalidPeerId) as exc:
        raise MultiaddrError(f"bad /{name} value: {exc}") from exc


@dataclass(frozen=True)
class Multiaddr:
    """An immutable multiaddr: a tuple of (protocol name, text value or "")."""

    parts: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str | Multiaddr) -> Multiaddr:
        if isinstance(text, Multiaddr):
            return text
        if not isinstance(text, str) or not text.startswith("/"):
            raise MultiaddrError(f"multiaddr must start with '/': {text!r}")
        tokens = text.split("/")[1:]
        if tokens and tokens[-1] == "":
            tokens.pop()
        parts = []
        i = 0
        while i < len(tokens):
            name = tokens[i]
            if name not in _PROTOCOLS:
                raise MultiaddrError(f"unknown multiaddr protocol {name!r} in {text!r}")
            size = _PROTOCOLS[name][1]
            if size == 0:
                parts.append((name, ""))
                i += 1
                continue
            if i + 1 >= len(tokens):
                raise MultiaddrError(f"/{name} needs a value in {text!r}")
            value = tokens[i + 1]
            raw = _value_to_bytes(name, value)
            parts.append((name, _value_to_text(name, raw)))
            i += 2
        if not parts:
            raise MultiaddrError("empty multiaddr")
        return cls(tuple(parts))

    @classmethod
    def from_bytes(cls, data: bytes) -> Multiaddr:
        if len(data) > MAX_MULTIADDR_BYTES:
            raise MultiaddrError("multiaddr too long")
        parts = []
        pos = 0
        try:
            while pos < len(data):
                code, pos = decode_uvarint_complete(data, pos)
                if code not in _BY_CODE:
                    raise MultiaddrError(f"unknown multiaddr protocol code {code}")
                name, size = _BY_CODE[code]
                if size == -1:
                    size, pos = decode_uvarint_complete(data, pos)
                if pos + size > len(data):
                    raise MultiaddrError(f"/{name} value runs past the end")
                parts.append((name, _value_to_text(name, data[pos:pos + size]) if size else ""))
                pos += size
        except VarintError as exc:
            raise MultiaddrError(f"bad varint in multiaddr: {exc}") from exc
        if not parts:
            raise MultiaddrError("empty multiaddr")
        return cls(tuple(parts))

    def to_bytes(self) -> bytes:
        out = bytearray()
        for name, value in self.parts:
            code, size = _PROTOCOLS[name]
            out += encode_uvarint(code)
            if size:
                raw = _value_to_bytes(name, value)
                if size == -1:
                    out += encode_uvarint(len(raw))
                out += raw
        return bytes(out)

    def __str__(self) -> str:
        return "".join(f"/{n}/{v}" if v else f"/{n}" for n, v in self.parts)

    def value_of(self, name: str) -> str | None:
        """The value of the last component called ``name``, or None."""
        for n, v in reversed(self.parts):
            if n == name:
                return v
        return None

    @property
    def peer_id(self) -> str | None:
        """The peer ID in a trailing /p2p/ component (the target, for relayed addresses)."""
        if self.parts and self.parts[-1][0] == "p2p":
            return self.parts[-1][1]
        return None

    def without_peer_id(self) -> Multiaddr:
        if self.peer_id is None:
            return self
        return Multiaddr(self.parts[:-1])

    def with_peer_id(self, peer_id: str) -> Multiaddr:
        p2p = ("p2p", _value_to_text("p2p", _value_to_bytes("p2p", peer_id)))
        return Multiaddr(self.without_peer_id().parts + (p2p,))

    def encapsulate(self, other: str | Multiaddr) -> Multiaddr:
        return Multiaddr(self.parts + Multiaddr.parse(other).parts)

    @property
    def is_relayed(self) -> bool:
        return any(n == "p2p-circuit" for n, _ in self.parts)

    def tcp_endpoint(self) -> tuple[str, int]:
        """(host, port) for a direct /ip4|ip6|dns*/.../tcp/... address (trailing /p2p allowed)."""
        parts = self.without_peer_id().parts
        if len(parts) != 2 or parts[1][0] != "tcp" or parts[0][0] not in ("ip4", "ip6", "dns", "dns4", "dns6"):
            raise MultiaddrError(f"not a direct TCP multiaddr: {self}")
        return parts[0][1], int(parts[1][1])

    @classmethod
    def from_tcp(cls, host: str, port: int) -> Multiaddr:
        family = "ip6" if ":" in host else "ip4"
        return cls.parse(f"/{family}/{host}/tcp/{port}")

    @property
    def is_quic(self) -> bool:
        """A direct ``/ip4|ip6/<ip>/udp/<port>/quic-v1`` address (trailing /p2p allowed)."""
        parts = self.without_peer_id().parts
        return (len(parts) == 3 and parts[0][0] in ("ip4", "ip6") and parts[1][0] == "udp"
                and parts[2][0] == "quic-v1")

    def quic_endpoint(self) -> tuple[str, int]:
        """(ip, port) of a direct QUIC address."""
        if not self.is_quic:
            raise MultiaddrError(f"not a direct QUIC multiaddr: {self}")
        parts = self.without_peer_id().parts
        return parts[0][1], int(parts[1][1])

    def direct_endpoint(self) -> tuple[str, int]:
        """(host, port) of a direct TCP or QUIC address."""
        return self.quic_endpoint() if self.is_quic else self.tcp_endpoint()

    @classmethod
    def from_quic(cls, host: str, port: int) -> Multiaddr:
        family = "ip6" if ":" in host else "ip4"
        return cls.parse(f"/{family}/{host}/udp/{port}/quic-v1")
