"""DCUtR (``/libp2p/dcutr``) wire messages and the sans-I/O exchange that times a hole punch.

``HolePunch {type=1: CONNECT(100)|SYNC(300); ObsAddrs=2: repeated bytes}`` travels as a
varint-length-prefixed protobuf of at most ``MAX_MESSAGE_BYTES``. The initiator (the peer that
wants the direct connection; it runs the security handshake as the client) sends CONNECT with its
observed addresses and starts a clock; the responder answers CONNECT with its own; the initiator
takes the round-trip time, sends SYNC and dials RTT/2 later, while the responder dials the moment
SYNC arrives, so both SYNs cross the NATs at about the same time (TCP simultaneous open). For the
QUIC addresses offered the responder is the QUIC client and the initiator, at RTT/2, sends random
UDP packets that open its NAT to the client's Initials (the spec's QUIC variant; the driver is
``relay/quic_punch.py``).

``DcutrInitiator`` and ``DcutrResponder`` take bytes and a monotonic time and return ``Send``
(bytes to write) and ``Dial`` (addresses and when to dial them) events; they never touch a socket.
Malformed, oversized or out-of-order messages raise ``DcutrError``. The asyncio driver is
``relay/holepunch.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from node.p2p.errors import ProtocolError
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from node.p2p.protobuf import WIRE_LEN, WIRE_VARINT, ProtobufError, decode_fields, field_bytes, field_varint
from node.p2p.varint import VarintError, decode_uvarint, encode_uvarint

DCUTR_PROTOCOL = "/libp2p/dcutr"
MAX_MESSAGE_BYTES = 4096   # go-libp2p's maxMsgSize for dcutr
MAX_OBS_ADDRS = 16
DIALABLE_PROTOCOLS = ("ip4", "ip6")


class DcutrError(ProtocolError):
    """A dcutr message is malformed, oversized or not the one the exchange expects now."""


class HolePunchType(IntEnum):
    CONNECT = 100
    SYNC = 300


@dataclass(frozen=True)
class HolePunch:
    type: HolePunchType
    obs_addrs: tuple[Multiaddr, ...] = ()
    # dekube's field 3 (other implementations ignore it): "my NAT maps each flow to a random port",
    # which asks the peer for birthday probing (relay/birthday.py; ADR 0204)
    random_ports: bool = False


def encode_holepunch(msg: HolePunch) -> bytes:
    """The length-prefixed wire form."""
    body = field_varint(1, int(msg.type)) + b"".join(field_bytes(2, a.to_bytes()) for a in msg.obs_addrs)
    if msg.random_ports:
        body += field_varint(3, 1)
    if len(body) > MAX_MESSAGE_BYTES:
        raise DcutrError(f"dcutr message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return encode_uvarint(len(body)) + body


def decode_holepunch(body: bytes) -> HolePunch:
    """Parse one message body (without its length prefix). Unknown fields are ignored; addresses
    of transports we cannot parse are left out; more than MAX_OBS_ADDRS addresses is an error."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise DcutrError(f"dcutr message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        fields = decode_fields(body)
    except ProtobufError as exc:
        raise DcutrError(f"malformed dcutr message: {exc}") from exc
    msg_type = None
    random_ports = False
    addrs: list[Multiaddr] = []
    raw_count = 0
    for number, wire_type, value in fields:
        if number == 1:
            if wire_type != WIRE_VARINT or not isinstance(value, int):
                raise DcutrError("dcutr type must be a varint")
            try:
                msg_type = HolePunchType(value)
            except ValueError:
                raise DcutrError(f"unknown dcutr message type {value}") from None
        elif number == 2:
            if wire_type != WIRE_LEN or not isinstance(value, bytes):
                raise DcutrError("dcutr ObsAddrs must be bytes")
            raw_count += 1
            if raw_count > MAX_OBS_ADDRS:
                raise DcutrError(f"more than {MAX_OBS_ADDRS} observed addresses")
            try:
                addrs.append(Multiaddr.from_bytes(value))
            except MultiaddrError:
                continue
        elif number == 3 and wire_type == WIRE_VARINT:
            random_ports = value == 1
    if msg_type is None:
        raise DcutrError("dcutr message lacks a type")
    return HolePunch(msg_type, tuple(addrs), random_ports)


class FrameReader:
    """Reassembles length-prefixed dcutr messages from arbitrary chunks."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        bodies: list[bytes] = []
        while True:
            try:
                head = decode_uvarint(self._buffer)
            except VarintError as exc:
                raise DcutrError(f"bad dcutr length prefix: {exc}") from exc
            if head is None:
                return bodies
            length, start = head
            if length > MAX_MESSAGE_BYTES:
                raise DcutrError(f"dcutr message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
            if len(self._buffer) < start + length:
                return bodies
            bodies.append(bytes(self._buffer[start:start + length]))
            del self._buffer[:start + length]


def dialable(addrs) -> tuple[Multiaddr, ...]:
    """The addresses worth punching to: direct TCP or QUIC (``/udp/P/quic-v1``) over IP (no relay, no
    wildcard host)."""
    out = []
    for addr in addrs:
        addr = Multiaddr.parse(addr)
        if addr.is_relayed or not addr.parts or addr.parts[0][0] not in DIALABLE_PROTOCOLS:
            continue
        try:
            host, _port = addr.direct_endpoint()
        except (ValueError, MultiaddrError):
            continue
        if host in ("0.0.0.0", "::") or addr.without_peer_id() in out:
            continue
        out.append(addr.without_peer_id())
    return tuple(out[:MAX_OBS_ADDRS])


@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Dial:
    addrs: tuple[Multiaddr, ...]
    at: float           # monotonic time to start dialing
    rtt: float | None   # measured round trip (initiator only)
    remote_random: bool = False  # the peer's NAT maps each flow to a random port


class DcutrInitiator:
    """One initiator exchange: CONNECT ->, <- CONNECT, SYNC -> and dial after RTT/2."""

    def __init__(self, own_addrs, random_ports: bool = False) -> None:
        self.own_addrs = dialable(own_addrs)
        self.random_ports = random_ports
        self._reader = FrameReader()
        self._sent_at: float | None = None
        self.done = False

    def start(self, now: float) -> Send:
        if self._sent_at is not None:
            raise DcutrError("exchange already started")
        self._sent_at = now
        return Send(encode_holepunch(HolePunch(HolePunchType.CONNECT, self.own_addrs, self.random_ports)))

    def receive(self, data: bytes, now: float) -> list[Send | Dial]:
        if self._sent_at is None:
            raise DcutrError("data before the exchange started")
        events: list[Send | Dial] = []
        for body in self._reader.feed(data):
            if self.done:
                raise DcutrError("unexpected dcutr message after the exchange")
            msg = decode_holepunch(body)
            if msg.type != HolePunchType.CONNECT:
                raise DcutrError(f"expected CONNECT, got {msg.type.name}")
            addrs = dialable(msg.obs_addrs)
            if not addrs:
                raise DcutrError("the remote peer sent no dialable addresses")
            rtt = max(0.0, now - self._sent_at)
            self.done = True
            events.append(Send(encode_holepunch(HolePunch(HolePunchType.SYNC))))
            events.append(Dial(addrs, now + rtt / 2, rtt, msg.random_ports))
        return events


class DcutrResponder:
    """One responder exchange: <- CONNECT, CONNECT ->, <- SYNC and dial at once."""

    def __init__(self, own_addrs, random_ports: bool = False) -> None:
        self.own_addrs = dialable(own_addrs)
        self.random_ports = random_ports
        self._reader = FrameReader()
        self._remote_addrs: tuple[Multiaddr, ...] | None = None
        self._remote_random = False
        self.done = False

    def receive(self, data: bytes, now: float) -> list[Send | Dial]:
        events: list[Send | Dial] = []
        for body in self._reader.feed(data):
            if self.done:
                raise DcutrError("unexpected dcutr message after the exchange")
            msg = decode_holepunch(body)
            if self._remote_addrs is None:
                if msg.type != HolePunchType.CONNECT:
                    raise DcutrError(f"expected CONNECT, got {msg.type.name}")
                addrs = dialable(msg.obs_addrs)
                if not addrs:
                    raise DcutrError("the remote peer sent no dialable addresses")
                if not self.own_addrs:
                    raise DcutrError("we have no dialable addresses to offer")
                self._remote_addrs = addrs
                self._remote_random = msg.random_ports
                events.append(Send(encode_holepunch(HolePunch(HolePunchType.CONNECT, self.own_addrs,
                                                              self.random_ports))))
            else:
                if msg.type != HolePunchType.SYNC:
                    raise DcutrError(f"expected SYNC, got {msg.type.name}")
                self.done = True
                events.append(Dial(self._remote_addrs, now, None, self._remote_random))
        return events
