"""``/ipfs/id/1.0.0`` identify: encode and decode the Identify message, serve and request it.

The responder writes one varint-length-prefixed protobuf ``Identify`` (publicKey=1,
listenAddrs=2 as binary multiaddrs, protocols=3, observedAddr=4, protocolVersion=5,
agentVersion=6, signedPeerRecord=8) and closes the stream. Decoding also accepts the older
unprefixed form. Malformed messages raise ``IdentifyError``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from node.identity import InvalidPeerId, peer_id_from_public_key, public_key_from_protobuf

from .errors import ProtocolError
from .multiaddr import Multiaddr, MultiaddrError
from .protobuf import ProtobufError, bytes_fields, decode_fields, field_bytes, field_strings, single_bytes_field
from .varint import VarintError, decode_uvarint, encode_uvarint

PROTOCOL_ID = "/ipfs/id/1.0.0"
PROTOCOL_VERSION = "ipfs/0.1.0"
AGENT_VERSION = "dekube/0.1.0"
MAX_IDENTIFY_BYTES = 64 * 1024


class IdentifyError(ProtocolError):
    """An identify message is malformed or too large."""


@dataclass
class IdentifyInfo:
    public_key: bytes  # protobuf-encoded libp2p PublicKey
    listen_addrs: list[Multiaddr] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    observed_addr: Multiaddr | None = None
    protocol_version: str = PROTOCOL_VERSION
    agent_version: str = AGENT_VERSION

    @property
    def peer_id(self) -> str:
        try:
            return peer_id_from_public_key(public_key_from_protobuf(self.public_key))
        except InvalidPeerId as exc:
            raise IdentifyError(f"identify carries an unsupported public key: {exc}") from exc


def encode_identify(info: IdentifyInfo) -> bytes:
    """The length-prefixed wire form."""
    body = (field_bytes(5, info.protocol_version.encode())
            + field_bytes(6, info.agent_version.encode())
            + field_bytes(1, info.public_key)
            + b"".join(field_bytes(2, a.to_bytes()) for a in info.listen_addrs)
            + (field_bytes(4, info.observed_addr.to_bytes()) if info.observed_addr else b"")
            + field_strings(3, info.protocols))
    return encode_uvarint(len(body)) + body


def _strip_length_prefix(data: bytes) -> bytes:
    try:
        header = decode_uvarint(data)
    except VarintError:
        return data
    if header is not None and header[0] > 0 and header[1] + header[0] == len(data):
        return data[header[1]:]
    return data


def _text(value: bytes | None, name: str) -> str:
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IdentifyError(f"identify {name} is not UTF-8") from exc


def decode_identify(data: bytes) -> IdentifyInfo:
    """Parse an identify response (length-prefixed or not)."""
    if len(data) > MAX_IDENTIFY_BYTES:
        raise IdentifyError("identify message too large")
    try:
        fields = decode_fields(_strip_length_prefix(data))
        public_key = single_bytes_field(fields, 1)
        if public_key is None:
            raise IdentifyError("identify message lacks publicKey")
        addrs = []
        for raw in bytes_fields(fields, 2):
            try:
                addrs.append(Multiaddr.from_bytes(raw))
            except MultiaddrError:
                continue  # addresses of transports we do not speak are skipped, not fatal
        observed_raw = single_bytes_field(fields, 4)
        try:
            observed = Multiaddr.from_bytes(observed_raw) if observed_raw else None
        except MultiaddrError:
            observed = None
        info = IdentifyInfo(
            public_key=public_key,
            listen_addrs=addrs,
            protocols=[_text(p, "protocol") for p in bytes_fields(fields, 3)],
            observed_addr=observed,
            protocol_version=_text(single_bytes_field(fields, 5), "protocolVersion"),
            agent_version=_text(single_bytes_field(fields, 6), "agentVersion"),
        )
    except ProtobufError as exc:
        raise IdentifyError(f"malformed identify message: {exc}") from exc
    return info
