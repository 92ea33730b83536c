"""``/multistream/1.0.0`` protocol negotiation as sans-I/O state machines.

Each message is a varint length followed by a UTF-8 line ending in ``\\n``. The dialer sends the
header and its first proposal at once; the listener echoes a protocol it supports or answers
``na``; ``ls`` lists the listener's protocols. Used for the connection upgrade (security, muxer)
and for every stream. Feed received bytes with ``receive_data``; send ``data_to_send()``;
when ``protocol`` is set, negotiation is done and ``unused`` holds bytes that already belong
to the negotiated protocol.
"""
from __future__ import annotations

from collections.abc import Sequence

from .errors import ProtocolError
from .varint import VarintError, decode_uvarint, encode_uvarint

PROTOCOL_ID = "/multistream/1.0.0"
NA = "na"
LS = "ls"
MAX_MESSAGE_BYTES = 1024
MAX_PROPOSALS = 32


class MultistreamError(ProtocolError):
    """Malformed multistream message, protocol mismatch, or no common protocol."""


class NoCommonProtocol(MultistreamError):
    """The listener declined every protocol the dialer proposed."""


def encode_message(text: str) -> bytes:
    payload = text.encode("utf-8") + b"\n"
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ValueError(f"multistream message longer than {MAX_MESSAGE_BYTES} bytes")
    return encode_uvarint(len(payload)) + payload


def _encode_ls_response(protocols: Sequence[str]) -> bytes:
    body = b"".join(encode_message(p) for p in protocols) + b"\n"
    return encode_uvarint(len(body)) + body


class _MessageReader:
    """Splits a byte stream into multistream messages, enforcing the length limit."""

    def __init__(self, max_message: int) -> None:
        self._buf = bytearray()
        self._max = max_message

    def feed(self, data: bytes | memoryview) -> None:
        self._buf += data

    def next_message(self) -> str | None:
        try:
            header = decode_uvarint(self._buf)
        except VarintError as exc:
            raise MultistreamError(f"bad multistream length prefix: {exc}") from exc
        if header is None:
            if len(self._buf) > 2:  # a valid length under the limit fits in 2 varint bytes
                raise MultistreamError("oversized multistream length prefix")
            return None
        length, start = header
        if length > self._max:
            raise MultistreamError(f"multistream message of {length} bytes exceeds {self._max}")
        if length == 0:
            raise MultistreamError("empty multistream message")
        if len(self._buf) < start + length:
            return None
        payload = bytes(self._buf[start:start + length])
        del self._buf[:start + length]
        if payload[-1:] != b"\n":
            raise MultistreamError("multistream message does not end in newline")
        try:
            text = payload[:-1].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MultistreamError("multistream message is not UTF-8") from exc
        if "\n" in text:
            raise MultistreamError("multistream message contains an inner newline")
        return text

    def take_rest(self) -> bytes:
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


class _Negotiator:
    def __init__(self, max_message: int) -> None:
        self._reader = _MessageReader(max_message)
        self._out = bytearray()
        self._header_seen = False
        self.protocol: str | None = None
        self.unused = b""

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def done(self) -> bool:
        return self.protocol is not None

    def receive_data(self, data: bytes | memoryview) -> None:
        if self.done:
            raise MultistreamError("negotiation already finished")
        self._reader.feed(data)
        while not self.done:
            message = self._reader.next_message()
            if message is None:
                return
            if not self._header_seen:
                if message != PROTOCOL_ID:
                    raise MultistreamError(f"expected {PROTOCOL_ID!r} header, got {message[:64]!r}")
                self._header_seen = True
                continue
            self._on_message(message)
        self.unused = self._reader.take_rest()

    def _on_message(self, message: str) -> None:
        raise NotImplementedError


class DialerNegotiator(_Negotiator):
    """The side that proposes protocols, in preference order, until the listener accepts one."""

    def __init__(self, protocols: Sequence[str], max_message: int = MAX_MESSAGE_BYTES) -> None:
        super().__init__(max_message)
        if not protocols:
            raise ValueError("need at least one protocol to propose")
        self._proposals = list(protocols)
        self._index = 0
        self._out += encode_message(PROTOCOL_ID) + encode_message(self._proposals[0])

    def _on_message(self, message: str) -> None:
        current = self._proposals[self._index]
        if message == current:
            self.protocol = current
        elif message == NA:
            self._index += 1
            if self._index == len(self._proposals):
                raise NoCommonProtocol(f"remote supports none of {self._proposals}")
            self._out += encode_message(self._proposals[self._index])
        else:
            raise MultistreamError(f"unexpected reply {message[:64]!r} to proposal {current!r}")


class ListenerNegotiator(_Negotiator):
    """The side that accepts the first proposal it supports."""

    def __init__(self, supported: Sequence[str], max_message: int = MAX_MESSAGE_BYTES,
                 max_proposals: int = MAX_PROPOSALS) -> None:
        super().__init__(max_message)
        self._supported = list(supported)
        self._max_proposals = max_proposals
        self._proposals_seen = 0
        self._out += encode_message(PROTOCOL_ID)

    def _on_message(self, message: str) -> None:
        self._proposals_seen += 1
        if self._proposals_seen > self._max_proposals:
            raise MultistreamError(f"more than {self._max_proposals} proposals")
        if message == LS:
            self._out += _encode_ls_response(self._supported)
        elif message in self._supported:
            self._out += encode_message(message)
            self.protocol = message
        else:
            self._out += encode_message(NA)
