"""PCP wire format (RFC 6887), sans-I/O: the MAP request (version 2, opcode 1) a client sends to
its gateway's UDP port 5351, and strict parsing of the answer (size, version, the R bit and
opcode, our nonce, result code). A router that speaks only NAT-PMP answers a version-2 request
with a version-0 packet or result UNSUPP_VERSION: `parse_map` raises `Unsupported` then, and the
caller falls back to NAT-PMP. Lifetime 0 with the same nonce deletes the mapping (section 15)."""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .errors import PortMapError

PORT = 5351
VERSION = 2
OP_MAP = 1
PROTO_TCP = 6
HEADER, MAP_BODY = 24, 36
MAX_ANSWER = 1100            # RFC 6887 section 7: a PCP message is at most 1100 bytes
RESULTS = {0: "SUCCESS", 1: "UNSUPP_VERSION", 2: "NOT_AUTHORIZED", 3: "MALFORMED_REQUEST", 4: "UNSUPP_OPCODE",
           5: "UNSUPP_OPTION", 6: "MALFORMED_OPTION", 7: "NETWORK_FAILURE", 8: "NO_RESOURCES",
           9: "UNSUPP_PROTOCOL", 10: "USER_EX_QUOTA", 11: "CANNOT_PROVIDE_EXTERNAL", 12: "ADDRESS_MISMATCH",
           13: "EXCESSIVE_REMOTE_PEERS"}


class Unsupported(PortMapError):
    """The router does not speak PCP version 2 (fall back to NAT-PMP)."""


@dataclass(frozen=True)
class MapResult:
    lifetime: int
    epoch: int
    internal_port: int
    external_port: int
    external_address: str


def _v6(address: str) -> bytes:
    """An address as PCP carries it: IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d)."""
    ip = ipaddress.ip_address(address)
    return (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip).packed


def map_request(client_ip: str, nonce: bytes, internal_port: int, external_port: int, lifetime: int,
                external_ip: str = "0.0.0.0") -> bytes:
    """A MAP request for TCP ``internal_port`` from ``client_ip`` (the address the gateway sees)."""
    if len(nonce) != 12:
        raise ValueError("a PCP mapping nonce is 12 bytes")
    header = struct.pack("!BBHI", VERSION, OP_MAP, 0, lifetime) + _v6(client_ip)
    body = nonce + struct.pack("!B3xHH", PROTO_TCP, internal_port, external_port) + _v6(external_ip)
    return header + body


def parse_map(data: bytes, nonce: bytes) -> MapResult:
    """The answer to our MAP request with ``nonce``; raises Unsupported or PortMapError."""
    if len(data) < 4:
        raise PortMapError(f"PCP answer too short ({len(data)} bytes)")
    version, r_op, _reserved, result = struct.unpack_from("!BBBB", data)
    if version == 0:  # a NAT-PMP server answering "unsupported version"
        raise Unsupported("the router speaks NAT-PMP, not PCP")
    if version != VERSION:
        raise Unsupported(f"PCP answer has version {version}")
    if r_op != 0x80 | OP_MAP:
        raise PortMapError(f"PCP answer has R/opcode {r_op:#x}, expected {0x80 | OP_MAP:#x}")
    if result == 1:
        raise Unsupported("PCP router answered UNSUPP_VERSION")
    if len(data) < HEADER + MAP_BODY or len(data) > MAX_ANSWER or len(data) % 4:
        raise PortMapError(f"PCP answer has a bad size ({len(data)} bytes)")
    if data[HEADER:HEADER + 12] != nonce:
        raise PortMapError("PCP answer carries another mapping nonce")
    if result != 0:
        raise PortMapError(f"PCP router refused: {RESULTS.get(result, f'result {result}')}")
    lifetime, epoch = struct.unpack_from("!II", data, 4)
    proto, internal, external = struct.unpack_from("!B3xHH", data, HEADER + 12)
    if proto != PROTO_TCP:
        raise PortMapError(f"PCP answer maps protocol {proto}, not TCP")
    address = ipaddress.IPv6Address(data[HEADER + 20:HEADER + 36])
    mapped = address.ipv4_mapped
    return MapResult(lifetime, epoch, internal, external, str(mapped if mapped is not None else address))
