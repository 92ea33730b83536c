"""Reachability: is this node dialable? AutoNAT v1 (``/libp2p/autonat/1.0.0``) dial-back.

Wire format (libp2p autonat v1, varint-length-prefixed protobuf ``Message``): type=1 (DIAL 0,
DIAL_RESPONSE 1), dial=2 (``Dial{peer=1: PeerInfo{id=1, addrs=2}}``), dialResponse=3
(``DialResponse{status=1, statusText=2, addr=3}``), statuses OK 0, E_DIAL_ERROR 100,
E_DIAL_REFUSED 101, E_BAD_REQUEST 200, E_INTERNAL_ERROR 300.

``AutoNATServer`` (register ``serve``) dials back only addresses on the IP it sees the request
come from (so it cannot be aimed at third parties), from a separate throwaway dialer, and answers
OK with the address that worked or E_DIAL_ERROR. A request over a relayed connection is refused.
``probe`` asks one server; ``Reachability.assess`` asks several and concludes PUBLIC when a
server reached us, PRIVATE when at least ``confirmations`` servers tried and failed and none
succeeded, else UNKNOWN. Message encoding and the server's address choice are pure functions.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from enum import Enum, IntEnum

from node.identity import Identity, InvalidPeerId, b58decode
from node.p2p.errors import ProtocolError
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from node.p2p.protobuf import (
    WIRE_LEN,
    WIRE_VARINT,
    ProtobufError,
    decode_fields,
    field_bytes,
    field_varint,
)
from node.p2p.varint import VarintError, decode_uvarint, encode_uvarint

from .messages import decode_peer_id_bytes

AUTONAT_PROTOCOL = "/libp2p/autonat/1.0.0"
MAX_MESSAGE_BYTES = 4096
MAX_DIAL_ADDRS = 8        # addresses the server tries per request
DIAL_TIMEOUT = 3.0        # per dial-back attempt
REQUEST_TIMEOUT = 15.0
log = logging.getLogger(__name__)


class AutoNATError(ProtocolError):
    """An autonat message is malformed, oversized or unexpected."""


class MessageType(IntEnum):
    DIAL = 0
    DIAL_RESPONSE = 1


class ResponseStatus(IntEnum):
    OK = 0
    E_DIAL_ERROR = 100
    E_DIAL_REFUSED = 101
    E_BAD_REQUEST = 200
    E_INTERNAL_ERROR = 300


class Reachability(Enum):
    PUBLIC = "public"
    PRIVATE = "private"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DialRequest:
    peer_id: str
    addrs: tuple[Multiaddr, ...]


@dataclass(frozen=True)
class DialResponse:
    status: ResponseStatus
    text: str = ""
    addr: Multiaddr | None = None


# ---------------------------------------------------------------- codec
def encode_request(req: DialRequest) -> bytes:
    peer = field_bytes(1, b58decode(req.peer_id)) + b"".join(field_bytes(2, a.to_bytes()) for a in req.addrs)
    return _frame(field_varint(1, MessageType.DIAL) + field_bytes(2, field_bytes(1, peer)))


def encode_response(resp: DialResponse) -> bytes:
    inner = field_varint(1, resp.status) + (field_bytes(2, resp.text.encode()) if resp.text else b"")
    if resp.addr is not None:
        inner += field_bytes(3, resp.addr.to_bytes())
    return _frame(field_varint(1, MessageType.DIAL_RESPONSE) + field_bytes(3, inner))


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_MESSAGE_BYTES:
        raise AutoNATError(f"autonat message of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return encode_uvarint(len(body)) + body


def _fields(data: bytes, what: str):
    try:
        return decode_fields(data)
    except ProtobufError as exc:
        raise AutoNATError(f"malformed autonat {what}: {exc}") from exc


def _one(fields, number: int, wire_type: int, what: str):
    value = None
    for num, wtype, val in fields:
        if num == number:
            if wtype != wire_type:
                raise AutoNATError(f"autonat {what} field {number} has the wrong wire type")
            value = val
    return value


def decode_message(body: bytes) -> DialRequest | DialResponse:
    """Parse one message body (no length prefix) into a DialRequest or a DialResponse."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise AutoNATError("autonat message too large")
    fields = _fields(body, "message")
    msg_type = _one(fields, 1, WIRE_VARINT, "message")
    if msg_type == MessageType.DIAL:
        dial = _one(fields, 2, WIRE_LEN, "message")
        peer = _one(_fields(dial or b"", "dial"), 1, WIRE_LEN, "dial")
        if peer is None:
            raise AutoNATError("autonat dial lacks peer info")
        peer_fields = _fields(peer, "peer info")
        raw_id = _one(peer_fields, 1, WIRE_LEN, "peer info")
        if raw_id is None:
            raise AutoNATError("autonat peer info lacks an id")
        try:
            peer_id = decode_peer_id_bytes(raw_id)
        except (ProtocolError, InvalidPeerId, ValueError) as exc:
            raise AutoNATError(f"autonat peer id is invalid: {exc}") from exc
        addrs = []
        for num, wtype, val in peer_fields:
            if num == 2:
                if wtype != WIRE_LEN:
                    raise AutoNATError("autonat addrs must be bytes")
                with contextlib.suppress(MultiaddrError):
                    addrs.append(Multiaddr.from_bytes(val))
        return DialRequest(peer_id, tuple(addrs))
    if msg_type == MessageType.DIAL_RESPONSE:
        inner = _one(fields, 3, WIRE_LEN, "message")
        if inner is None:
            raise AutoNATError("autonat response lacks dialResponse")
        resp_fields = _fields(inner, "dialResponse")
        try:
            status = ResponseStatus(_one(resp_fields, 1, WIRE_VARINT, "dialResponse"))
        except ValueError as exc:
            raise AutoNATError(f"unknown autonat status: {exc}") from None
        text = _one(resp_fields, 2, WIRE_LEN, "dialResponse") or b""
        raw_addr = _one(resp_fields, 3, WIRE_LEN, "dialResponse")
        try:
            addr = Multiaddr.from_bytes(raw_addr) if raw_addr else None
        except MultiaddrError:
            addr = None
        return DialResponse(status, text.decode("utf-8", "replace"), addr)
    raise AutoNATError(f"unknown autonat message type {msg_type}")


async def read_message(stream) -> DialRequest | DialResponse:
    buffer = bytearray()
    while True:
        try:
            head = decode_uvarint(buffer)
        except VarintError as exc:
            raise AutoNATError(f"bad autonat length prefix: {exc}") from exc
        if head is not None:
            length, start = head
            if length > MAX_MESSAGE_BYTES:
                raise AutoNATError(f"autonat message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
            if len(buffer) >= start + length:
                return decode_message(bytes(buffer[start:start + length]))
        data = await stream.read()
        if not data:
            raise AutoNATError("stream ended before a complete autonat message")
        buffer += data


def dialback_candidates(addrs, observed_ip: str) -> list[Multiaddr]:
    """The requested addresses the server may dial: direct TCP on the requester's observed IP."""
    out = []
    for addr in addrs:
        if addr.is_relayed:
            continue
        try:
            host, _port = addr.tcp_endpoint()
        except MultiaddrError:
            continue
        plain = addr.without_peer_id()
        if host == observed_ip and plain not in out:
            out.append(plain)
    return out[:MAX_DIAL_ADDRS]


# ---------------------------------------------------------------- server
class AutoNATServer:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.served = 0

    def start(self) -> None:
        self.host.set_handler(AUTONAT_PROTOCOL, self.serve)

    async def serve(self, stream) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                request = await read_message(stream)
                response = await self._answer(stream, request)
        except AutoNATError as exc:
            response = DialResponse(ResponseStatus.E_BAD_REQUEST, str(exc)[:200])
        self.served += 1
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.write(encode_response(response))
            await stream.close()

    async def _answer(self, stream, request) -> DialResponse:
        if not isinstance(request, DialRequest):
            return DialResponse(ResponseStatus.E_BAD_REQUEST, "expected DIAL")
        if request.peer_id != stream.remote_peer:
            return DialResponse(ResponseStatus.E_BAD_REQUEST, "peer id is not the requester's")
        remote = stream.connection.remote_addr
        if remote is None:
            return DialResponse(ResponseStatus.E_DIAL_REFUSED, "request came over a relayed connection")
        candidates = dialback_candidates(request.addrs, remote.direct_endpoint()[0])
        if not candidates:
            return DialResponse(ResponseStatus.E_DIAL_REFUSED, "no address on the requester's observed IP")
        return await dial_back(request.peer_id, candidates)


async def dial_back(peer_id: str, candidates: list[Multiaddr]) -> DialResponse:
    """Dial ``peer_id`` at each candidate from a fresh host (no shared connection can help)."""
    dialer = Host(Identity.generate(), listen_addrs=())
    await dialer.start()
    try:
        for addr in candidates:
            try:
                async with asyncio.timeout(DIAL_TIMEOUT):
                    await dialer.connect(str(addr.with_peer_id(peer_id)))
                return DialResponse(ResponseStatus.OK, "", addr)
            except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
                log.debug("dial-back to %s failed: %s", addr, exc)
        return DialResponse(ResponseStatus.E_DIAL_ERROR, "dial-back failed")
    finally:
        await dialer.stop()


# ---------------------------------------------------------------- client
async def probe(host: Host, server_addr: str, addrs) -> DialResponse:
    """Ask the AutoNAT server at ``server_addr`` (``.../p2p/<id>``) to dial us back at ``addrs``."""
    server = await host.connect(server_addr)
    stream = await host.open_stream(server, AUTONAT_PROTOCOL)
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            await stream.write(encode_request(DialRequest(host.peer_id, tuple(Multiaddr.parse(a) for a in addrs))))
            response = await read_message(stream)
    finally:
        stream.reset()
    if not isinstance(response, DialResponse):
        raise AutoNATError("server answered with a DIAL request")
    return response


def candidate_addrs(host: Host, observed: Multiaddr | None) -> list[Multiaddr]:
    """What to ask a server to dial: our TCP listen addresses (AutoNAT dials back over TCP only), and
    their ports on the IP the server sees us from (a port forward or a public IP the host does not know it has)."""
    out = [a for a in (Multiaddr.parse(x).without_peer_id() for x in host.listen_addrs) if not a.is_quic]
    if observed is not None:
        ip = observed.direct_endpoint()[0]
        out += [Multiaddr.from_tcp(ip, a.tcp_endpoint()[1]) for a in list(out)]
    return list(dict.fromkeys(a for a in out if a.tcp_endpoint()[0] not in ("0.0.0.0", "::")))


def conclude(responses: list[DialResponse | BaseException], confirmations: int = 1) -> Reachability:
    """PUBLIC if any server reached us; PRIVATE if ``confirmations`` tried and failed; else UNKNOWN."""
    statuses = [r.status for r in responses if isinstance(r, DialResponse)]
    if ResponseStatus.OK in statuses:
        return Reachability.PUBLIC
    if statuses.count(ResponseStatus.E_DIAL_ERROR) >= confirmations:
        return Reachability.PRIVATE
    return Reachability.UNKNOWN


async def assess(host: Host, server_addrs: list[str], confirmations: int = 1) -> Reachability:
    """Ask every server (concurrently) to dial us back and conclude our reachability."""
    async def ask(server_addr: str) -> DialResponse:
        server = await host.connect(server_addr)
        record = host.peerbook.get(server)
        observed = None
        for _ in range(50):  # identify on the new connection tells us how the server sees us
            if record is not None and record.observed_addr is not None:
                observed = record.observed_addr
                break
            await asyncio.sleep(0.02)
            record = host.peerbook.get(server)
        return await probe(host, server_addr, candidate_addrs(host, observed))

    responses = await asyncio.gather(*(ask(a) for a in server_addrs), return_exceptions=True)
    for addr, resp in zip(server_addrs, responses):
        log.debug("autonat %s: %r", addr, resp)
    return conclude(list(responses), confirmations)
