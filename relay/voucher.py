"""The circuit v2 reservation voucher: a libp2p signed envelope around a ReservationVoucher record.

Envelope (libp2p RFC 0002): ``PublicKey public_key = 1; bytes payload_type = 2; bytes payload = 3;
bytes signature = 5``, the signature covering ``varint-prefixed(domain) | varint-prefixed(type) |
varint-prefixed(payload)`` with domain ``libp2p-relay-rsvp`` and payload type the bytes ``03 02``
(multicodec ``/libp2p/relay-rsvp``, written big-endian as go-libp2p's RecordCodec, not as a varint).
The record is ``bytes relay = 1; bytes peer = 2; uint64 expiration = 3`` (unix seconds).
``open_voucher`` checks everything: structure, signer == relay, peer, signature and expiry.
"""
from __future__ import annotations

from dataclasses import dataclass

from node.identity import (
    Identity,
    InvalidPeerId,
    b58decode,
    peer_id_from_public_key,
    public_key_from_protobuf,
    verify,
)
from node.p2p.protobuf import WIRE_LEN, WIRE_VARINT, ProtobufError, decode_fields, field_bytes, field_varint
from node.p2p.varint import encode_uvarint

from .messages import RelayMessageError, decode_peer_id_bytes

DOMAIN = b"libp2p-relay-rsvp"
PAYLOAD_TYPE = b"\x03\x02"  # the multicodec 0x0302 as two raw bytes, as go-libp2p and py-libp2p send it
MAX_VOUCHER_BYTES = 1024


class VoucherError(RelayMessageError):
    """A voucher is malformed, signed by someone else, for another peer, or expired."""


@dataclass(frozen=True)
class Voucher:
    relay: str
    peer: str
    expiration: int


def _signed_bytes(payload: bytes) -> bytes:
    return b"".join(encode_uvarint(len(part)) + part for part in (DOMAIN, PAYLOAD_TYPE, payload))


def encode_record(voucher: Voucher) -> bytes:
    return (field_bytes(1, b58decode(voucher.relay)) + field_bytes(2, b58decode(voucher.peer))
            + field_varint(3, voucher.expiration))


def seal_voucher(relay_identity: Identity, peer: str, expiration: int) -> bytes:
    """The signed envelope a relay hands a peer with its reservation."""
    payload = encode_record(Voucher(relay_identity.peer_id, peer, expiration))
    signature = relay_identity.sign(_signed_bytes(payload))
    return (field_bytes(1, relay_identity.public_key_protobuf) + field_bytes(2, PAYLOAD_TYPE)
            + field_bytes(3, payload) + field_bytes(5, signature))


def _single(fields, number: int, wire_type: int, what: str):
    values = [(wt, v) for num, wt, v in fields if num == number]
    if not values:
        raise VoucherError(f"voucher without {what}")
    wire, value = values[-1]
    if wire != wire_type:
        raise VoucherError(f"voucher {what} has the wrong wire type")
    return value


def decode_voucher(envelope: bytes) -> tuple[Voucher, str, bool]:
    """Parse an envelope: (the record, the signer's peer ID, whether the signature is valid)."""
    if len(envelope) > MAX_VOUCHER_BYTES:
        raise VoucherError(f"voucher of {len(envelope)} bytes")
    try:
        outer = decode_fields(envelope)
        public_key = public_key_from_protobuf(_single(outer, 1, WIRE_LEN, "public key"))
        if _single(outer, 2, WIRE_LEN, "payload type") != PAYLOAD_TYPE:
            raise VoucherError("envelope payload type is not /libp2p/relay-rsvp")
        payload = _single(outer, 3, WIRE_LEN, "payload")
        signature = _single(outer, 5, WIRE_LEN, "signature")
        inner = decode_fields(payload)
        record = Voucher(decode_peer_id_bytes(_single(inner, 1, WIRE_LEN, "relay")),
                         decode_peer_id_bytes(_single(inner, 2, WIRE_LEN, "peer")),
                         _single(inner, 3, WIRE_VARINT, "expiration"))
    except VoucherError:
        raise
    except (ProtobufError, InvalidPeerId, RelayMessageError) as exc:  # RelayMessageError: a bad peer id
        raise VoucherError(f"malformed voucher: {exc}") from exc
    return record, peer_id_from_public_key(public_key), verify(public_key, _signed_bytes(payload), signature)


def open_voucher(envelope: bytes, relay: str, peer: str, now: float) -> Voucher:
    """Check a voucher fully; raise VoucherError unless ``relay`` signed it for ``peer`` and it is current."""
    record, signer, valid = decode_voucher(envelope)
    if not valid:
        raise VoucherError("voucher signature does not verify")
    if signer != relay or record.relay != relay:
        raise VoucherError("voucher is not signed by this relay")
    if record.peer != peer:
        raise VoucherError("voucher is for another peer")
    if record.expiration <= now:
        raise VoucherError("voucher expired")
    return record
