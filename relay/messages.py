"""Circuit relay v2 wire messages (HopMessage, StopMessage, Peer, Reservation, Limit, Status), sans-I/O.

Field numbers and enum values follow the libp2p circuit-v2 spec. Messages travel as
varint-length-prefixed protobufs of at most ``MAX_MESSAGE_BYTES``. Decoding is strict: wrong wire
types, unknown enum values, a missing ``type``, a malformed peer ID, or too many or too long
addresses raise ``RelayMessageError`` (a ``ProtocolError``); unknown field numbers are ignored as
protobuf requires, and addresses of transports we cannot parse are left out. ``MessageReader``
reassembles one framed message from arbitrary chunks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from node.identity import InvalidPeerId, b58decode, b58encode, public_key_from_peer_id_bytes
from node.p2p.errors import ProtocolError
from node.p2p.multiaddr import Multiaddr
from node.p2p.protobuf import (
    WIRE_LEN,
    WIRE_VARINT,
    ProtobufError,
    bytes_fields,
    decode_fields,
    field_bytes,
    field_varint,
)
from node.p2p.varint import VarintError, decode_uvarint, encode_uvarint

HOP_PROTOCOL = "/libp2p/circuit/relay/0.2.0/hop"
STOP_PROTOCOL = "/libp2p/circuit/relay/0.2.0/stop"
MAX_MESSAGE_BYTES = 4096  # go-libp2p's maxMessageSize for hop/stop messages
MAX_ADDRS = 32
MAX_ADDR_BYTES = 512
# dekube extension (ignored by other implementations as an unknown field): the relay's 16-byte
# circuit session ID, sent to both endpoints so they can co-sign usage receipts for it.
SESSION_FIELD = 4242
SESSION_BYTES = 16


class RelayMessageError(ProtocolError):
    """A hop or stop message is malformed, oversized or not what the protocol expects here."""


class HopType(IntEnum):
    RESERVE = 0
    CONNECT = 1
    STATUS = 2


class StopType(IntEnum):
    CONNECT = 0
    STATUS = 1


class Status(IntEnum):
    UNUSED = 0
    OK = 100
    RESERVATION_REFUSED = 200
    RESOURCE_LIMIT_EXCEEDED = 201
    PERMISSION_DENIED = 202
    CONNECTION_FAILED = 203
    NO_RESERVATION = 204
    MALFORMED_MESSAGE = 400
    UNEXPECTED_MESSAGE = 401


@dataclass(frozen=True)
class Peer:
    peer_id: str
    addrs: tuple[Multiaddr, ...] = ()


@dataclass(frozen=True)
class Reservation:
    expire: int  # unix seconds (UTC)
    addrs: tuple[Multiaddr, ...] = ()
    voucher: bytes | None = None  # a signed envelope (relay/voucher.py)


@dataclass(frozen=True)
class Limit:
    duration: int | None = None  # seconds
    data: int | None = None      # bytes per direction


@dataclass(frozen=True)
class HopMessage:
    type: HopType
    peer: Peer | None = None
    reservation: Reservation | None = None
    limit: Limit | None = None
    status: Status | None = None
    session: bytes | None = None


@dataclass(frozen=True)
class StopMessage:
    type: StopType
    peer: Peer | None = None
    limit: Limit | None = None
    status: Status | None = None
    session: bytes | None = None


# ---------------------------------------------------------------- encoding

def _encode_addrs(number: int, addrs) -> bytes:
    return b"".join(field_bytes(number, Multiaddr.parse(a).to_bytes()) for a in addrs)


def encode_peer(peer: Peer) -> bytes:
    return field_bytes(1, b58decode(peer.peer_id)) + _encode_addrs(2, peer.addrs)


def encode_reservation(rsvp: Reservation) -> bytes:
    out = field_varint(1, rsvp.expire) + _encode_addrs(2, rsvp.addrs)
    if rsvp.voucher is not None:
        out += field_bytes(3, rsvp.voucher)
    return out


def encode_limit(limit: Limit) -> bytes:
    out = b""
    if limit.duration is not None:
        out += field_varint(1, limit.duration)
    if limit.data is not None:
        out += field_varint(2, limit.data)
    return out


def _encode_session(session: bytes | None) -> bytes:
    return b"" if session is None else field_bytes(SESSION_FIELD, session)


def encode_hop(msg: HopMessage) -> bytes:
    """The protobuf body of a HopMessage (no length prefix)."""
    out = field_varint(1, int(msg.type))
    if msg.peer is not None:
        out += field_bytes(2, encode_peer(msg.peer))
    if msg.reservation is not None:
        out += field_bytes(3, encode_reservation(msg.reservation))
    if msg.limit is not None:
        out += field_bytes(4, encode_limit(msg.limit))
    if msg.status is not None:
        out += field_varint(5, int(msg.status))
    return out + _encode_session(msg.session)


def encode_stop(msg: StopMessage) -> bytes:
    """The protobuf body of a StopMessage (no length prefix)."""
    out = field_varint(1, int(msg.type))
    if msg.peer is not None:
        out += field_bytes(2, encode_peer(msg.peer))
    if msg.limit is not None:
        out += field_bytes(3, encode_limit(msg.limit))
    if msg.status is not None:
        out += field_varint(4, int(msg.status))
    return out + _encode_session(msg.session)


def frame(body: bytes) -> bytes:
    """Length-prefix a message body for the wire."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise ValueError(f"relay message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return encode_uvarint(len(body)) + body


# ---------------------------------------------------------------- decoding

def _fields(data: bytes, what: str):
    try:
        return decode_fields(data)
    except ProtobufError as exc:
        raise RelayMessageError(f"malformed {what}: {exc}") from exc


def _singular(fields, number: int, wire_type: int, what: str):
    value = None
    for num, wt, val in fields:
        if num == number:
            if wt != wire_type:
                raise RelayMessageError(f"{what}: field {number} has wire type {wt}, expected {wire_type}")
            value = val
    return value


def _repeated_bytes(fields, number: int, what: str) -> list[bytes]:
    try:
        return bytes_fields(fields, number)
    except ProtobufError as exc:
        raise RelayMessageError(f"{what}: {exc}") from exc


def _decode_addrs(raws: list[bytes], what: str) -> tuple[Multiaddr, ...]:
    if len(raws) > MAX_ADDRS:
        raise RelayMessageError(f"{what}: {len(raws)} addresses (at most {MAX_ADDRS})")
    out = []
    for raw in raws:
        if len(raw) > MAX_ADDR_BYTES:
            raise RelayMessageError(f"{what}: address of {len(raw)} bytes")
        try:
            out.append(Multiaddr.from_bytes(raw))
        except (ProtocolError, ValueError):
            continue  # a transport we do not speak (quic, webrtc...): useless to us, harmless
    return tuple(out)


def decode_peer_id_bytes(raw: bytes) -> str:
    """A binary (identity multihash, ed25519) peer ID as its ``12D3KooW...`` text form."""
    try:
        public_key_from_peer_id_bytes(raw)
    except InvalidPeerId as exc:
        raise RelayMessageError(f"bad peer id: {exc}") from exc
    return b58encode(raw)


def decode_peer(data: bytes) -> Peer:
    fields = _fields(data, "Peer")
    raw_id = _singular(fields, 1, WIRE_LEN, "Peer.id")
    if raw_id is None:
        raise RelayMessageError("Peer without an id")
    return Peer(decode_peer_id_bytes(raw_id), _decode_addrs(_repeated_bytes(fields, 2, "Peer.addrs"), "Peer.addrs"))


def decode_reservation(data: bytes) -> Reservation:
    fields = _fields(data, "Reservation")
    expire = _singular(fields, 1, WIRE_VARINT, "Reservation.expire")
    if expire is None:
        raise RelayMessageError("Reservation without an expiry")
    addrs = _decode_addrs(_repeated_bytes(fields, 2, "Reservation.addrs"), "Reservation.addrs")
    return Reservation(expire, addrs, _singular(fields, 3, WIRE_LEN, "Reservation.voucher"))


def decode_limit(data: bytes) -> Limit:
    fields = _fields(data, "Limit")
    duration = _singular(fields, 1, WIRE_VARINT, "Limit.duration")
    if duration is not None and duration >= 1 << 32:
        raise RelayMessageError("Limit.duration exceeds uint32")
    return Limit(limit_duration_seconds(duration), _singular(fields, 2, WIRE_VARINT, "Limit.data"))


# The spec's Limit.duration is in seconds; js-libp2p (3.x) puts its millisecond setting on the wire
# unconverted (its 2-minute default arrives as 120000, 33 h read as seconds). No relay grants a
# circuit longer than a day, so a whole number of thousands above a day is read as milliseconds:
# the shorter reading is the safe one (the client moves bulk off the circuit sooner). ADR 0204.
_MS_SUSPECT_ABOVE_S = 24 * 3600


def limit_duration_seconds(raw: int | None) -> int | None:
    """``Limit.duration`` from the wire in seconds, reading js-libp2p's milliseconds (see above)."""
    if raw is not None and raw > _MS_SUSPECT_ABOVE_S and raw % 1000 == 0:
        return raw // 1000
    return raw


def _enum(enum_type, value, what: str):
    if value is None:
        return None
    try:
        return enum_type(value)
    except ValueError:
        raise RelayMessageError(f"{what}: unknown value {value}") from None


def _optional(decoder, fields, number: int, what: str):
    raw = _singular(fields, number, WIRE_LEN, what)
    return None if raw is None else decoder(raw)


def _decode_session(fields, what: str) -> bytes | None:
    session = _singular(fields, SESSION_FIELD, WIRE_LEN, what)
    if session is not None and len(session) != SESSION_BYTES:
        raise RelayMessageError(f"{what}: session of {len(session)} bytes")
    return session


def decode_hop(data: bytes) -> HopMessage:
    fields = _fields(data, "HopMessage")
    msg_type = _enum(HopType, _singular(fields, 1, WIRE_VARINT, "HopMessage.type"), "HopMessage.type")
    if msg_type is None:
        raise RelayMessageError("HopMessage without a type")
    return HopMessage(
        msg_type,
        peer=_optional(decode_peer, fields, 2, "HopMessage.peer"),
        reservation=_optional(decode_reservation, fields, 3, "HopMessage.reservation"),
        limit=_optional(decode_limit, fields, 4, "HopMessage.limit"),
        status=_enum(Status, _singular(fields, 5, WIRE_VARINT, "HopMessage.status"), "HopMessage.status"),
        session=_decode_session(fields, "HopMessage.session"),
    )


def decode_stop(data: bytes) -> StopMessage:
    fields = _fields(data, "StopMessage")
    msg_type = _enum(StopType, _singular(fields, 1, WIRE_VARINT, "StopMessage.type"), "StopMessage.type")
    if msg_type is None:
        raise RelayMessageError("StopMessage without a type")
    return StopMessage(
        msg_type,
        peer=_optional(decode_peer, fields, 2, "StopMessage.peer"),
        limit=_optional(decode_limit, fields, 3, "StopMessage.limit"),
        status=_enum(Status, _singular(fields, 4, WIRE_VARINT, "StopMessage.status"), "StopMessage.status"),
        session=_decode_session(fields, "StopMessage.session"),
    )


@dataclass
class MessageReader:
    """Reassembles one length-prefixed message from chunks; keeps bytes that follow it."""

    max_bytes: int = MAX_MESSAGE_BYTES
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> bytes | None:
        """Add received bytes; return the message body once complete, else None."""
        self._buffer += data
        try:
            head = decode_uvarint(self._buffer)
        except VarintError as exc:
            raise RelayMessageError(f"bad length prefix: {exc}") from exc
        if head is None:
            return None
        length, start = head
        if length > self.max_bytes:
            raise RelayMessageError(f"relay message of {length} bytes exceeds {self.max_bytes}")
        if len(self._buffer) < start + length:
            return None
        body = bytes(self._buffer[start:start + length])
        del self._buffer[:start + length]
        return body

    def take_rest(self) -> bytes:
        """Bytes received after the message (the start of the relayed data)."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        return rest
