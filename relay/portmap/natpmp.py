"""NAT-PMP wire format (RFC 6886), sans-I/O: the external-address and mapping requests a client
sends to its gateway's UDP port 5351, and strict parsing of the answers (exact sizes, version 0,
the opcode answering ours). A mapping with lifetime 0 deletes it (section 3.4)."""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from .errors import PortMapError

PORT = 5351
VERSION = 0
OP_EXTERNAL, OP_MAP_UDP, OP_MAP_TCP = 0, 1, 2
RESULTS = {0: "success", 1: "unsupported version", 2: "not authorized/refused", 3: "network failure",
           4: "out of resources", 5: "unsupported opcode"}
UNSUPPORTED_VERSION = 1


@dataclass(frozen=True)
class ExternalAddress:
    epoch: int
    address: str


@dataclass(frozen=True)
class MapResult:
    epoch: int
    internal_port: int
    external_port: int
    lifetime: int


def external_address_request() -> bytes:
    return struct.pack("!BB", VERSION, OP_EXTERNAL)


def map_request(internal_port: int, external_port: int, lifetime: int, *, tcp: bool = True) -> bytes:
    """A mapping request (lifetime 0 and external port 0: delete the mapping of ``internal_port``)."""
    for value, top in ((internal_port, 0xFFFF), (external_port, 0xFFFF), (lifetime, 0xFFFFFFFF)):
        if not 0 <= value <= top:
            raise ValueError(f"NAT-PMP field out of range: {value}")
    return struct.pack("!BBHHHI", VERSION, OP_MAP_TCP if tcp else OP_MAP_UDP, 0, internal_port, external_port,
                       lifetime)


def _header(data: bytes, opcode: int, size: int) -> int:
    """Check version/opcode/result of an answer to ``opcode``; returns the epoch."""
    if len(data) < 4:
        raise PortMapError(f"NAT-PMP answer too short ({len(data)} bytes)")
    version, op, result = struct.unpack_from("!BBH", data)
    if version != VERSION:
        raise PortMapError(f"NAT-PMP answer has version {version}")
    if op != 128 + opcode:
        raise PortMapError(f"NAT-PMP answer has opcode {op}, expected {128 + opcode}")
    if result != 0:
        raise PortMapError(f"NAT-PMP router refused: {RESULTS.get(result, f'result {result}')}")
    if len(data) != size:
        raise PortMapError(f"NAT-PMP answer is {len(data)} bytes, expected {size}")
    return struct.unpack_from("!I", data, 4)[0]


def parse_external_address(data: bytes) -> ExternalAddress:
    epoch = _header(data, OP_EXTERNAL, 12)
    address = ipaddress.IPv4Address(data[8:12])
    if address.is_unspecified:
        raise PortMapError("NAT-PMP router has no external address yet")
    return ExternalAddress(epoch, str(address))


def parse_map(data: bytes, *, tcp: bool = True) -> MapResult:
    epoch = _header(data, OP_MAP_TCP if tcp else OP_MAP_UDP, 16)
    internal, external, lifetime = struct.unpack_from("!HHI", data, 8)
    return MapResult(epoch, internal, external, lifetime)
