"""Usage receipts for relayed circuits: the relay proposes, both endpoints co-sign, the relay submits.

Protocol ``/dekube/relay-receipt/1.0.0`` (relay -> endpoint): the relay sends one
length-prefixed canonical encoding (consensus.encoding) of a receipt in the ledger's shape
(consensus.tx ``RELAY_RECEIPT``: relay, src, dst, payer, session, bytes_total, amount_total,
task_id); the endpoint answers ``0x00`` + a 64-byte ed25519 signature over
``relay_receipt_signing_bytes(chain_id, receipt)``, or ``0x01`` + a UTF-8 reason. An endpoint signs
only for a circuit it is part of (looked up by session), with that relay, at a price it accepts,
and for no more bytes than it counted itself plus what can be in flight (``in_flight_allowance``).
Totals are cumulative per session (ADR 0026), so a later receipt supersedes an earlier one.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from consensus.encoding import decode, encode
from consensus.tx import relay_receipt_signing_bytes
from node.identity import Identity, verify_by_peer_id
from node.p2p.errors import ProtocolError

from .messages import MessageReader, frame

RECEIPT_PROTOCOL = "/dekube/relay-receipt/1.0.0"
MIB = 1 << 20
MAX_REQUEST_BYTES = 1024
EXCHANGE_TIMEOUT = 10.0
RECEIPT_KEYS = ("relay", "src", "dst", "payer", "session", "bytes_total", "amount_total", "task_id")


class ReceiptError(ProtocolError):
    """A receipt request or answer is malformed, or an endpoint refused to sign."""


def amount_for(bytes_total: int, price_per_mib: int) -> int:
    """What ``bytes_total`` relayed bytes cost at ``price_per_mib`` (at least 1, the ledger's minimum)."""
    return max(1, bytes_total * price_per_mib // MIB)


def build_receipt(relay: str, src: str, dst: str, session: bytes, bytes_total: int, price_per_mib: int,
                  payer: str | None = None, task_id: bytes = b"") -> dict:
    return {"relay": relay, "src": src, "dst": dst, "payer": payer or src, "session": session,
            "bytes_total": bytes_total, "amount_total": amount_for(bytes_total, price_per_mib),
            "task_id": task_id}


def in_flight_allowance(bytes_counted: int) -> int:
    """How many more bytes than an endpoint counted a relay may claim: one full yamux window
    (16 MiB) toward the endpoint plus 0.1%."""
    return 16 * MIB + bytes_counted // 1000


def decode_request(body: bytes) -> dict:
    try:
        receipt = decode(body, max_size=MAX_REQUEST_BYTES)
    except ValueError as exc:
        raise ReceiptError(f"malformed receipt request: {exc}") from exc
    if not isinstance(receipt, dict) or tuple(sorted(receipt)) != tuple(sorted(RECEIPT_KEYS)):
        raise ReceiptError("receipt request does not have the receipt fields")
    for key in ("relay", "src", "dst", "payer"):
        if not isinstance(receipt[key], str):
            raise ReceiptError(f"receipt {key} is not a peer id")
    for key in ("bytes_total", "amount_total"):
        if not isinstance(receipt[key], int) or receipt[key] < 1:
            raise ReceiptError(f"receipt {key} must be a positive integer")
    if not isinstance(receipt["session"], bytes) or len(receipt["session"]) != 16:
        raise ReceiptError("receipt session must be 16 bytes")
    if not isinstance(receipt["task_id"], bytes) or len(receipt["task_id"]) > 32:
        raise ReceiptError("receipt task_id must be at most 32 bytes")
    return receipt


async def _read_frame(stream, max_bytes: int) -> bytes:
    reader = MessageReader(max_bytes)
    while True:
        data = await stream.read()
        if not data:
            raise ReceiptError("stream ended before the message did")
        body = reader.feed(data)
        if body is not None:
            return body


async def request_signature(host, endpoint: str, chain_id: str, receipt: dict) -> bytes:
    """Ask ``endpoint`` to sign ``receipt``; return its verified signature or raise ReceiptError."""
    async with asyncio.timeout(EXCHANGE_TIMEOUT):
        stream = await host.open_stream(endpoint, RECEIPT_PROTOCOL)
        try:
            await stream.write(frame(encode(receipt)))
            answer = await _read_frame(stream, 512)
        finally:
            stream.reset()
    if answer[:1] == b"\x01":
        raise ReceiptError(f"{endpoint} refused to sign: {answer[1:].decode(errors='replace')}")
    signature = answer[1:]
    if answer[:1] != b"\x00" or len(signature) != 64:
        raise ReceiptError(f"{endpoint} sent a malformed receipt answer")
    if not verify_by_peer_id(endpoint, relay_receipt_signing_bytes(chain_id, receipt), signature):
        raise ReceiptError(f"{endpoint}'s receipt signature does not verify")
    return signature


@dataclass
class CircuitCount:
    """What an endpoint knows of one of its relayed circuits."""

    relay: str
    remote: str
    is_source: bool       # we dialed (src) rather than accepted (dst)
    bytes_total: Callable[[], int]


class ReceiptSigner:
    """Endpoint side: answers receipt requests for our own circuits."""

    def __init__(self, identity: Identity, chain_id: str, lookup: Callable[[bytes], CircuitCount | None],
                 max_price_per_mib: int) -> None:
        self._identity = identity
        self._chain_id = chain_id
        self._lookup = lookup
        self._max_price_per_mib = max_price_per_mib

    def check(self, relay: str, receipt: dict) -> str | None:
        """Why we refuse to sign ``receipt`` from ``relay``, or None if we sign it."""
        circuit = self._lookup(receipt["session"])
        me = self._identity.peer_id
        if circuit is None:
            return "unknown circuit session"
        if receipt["relay"] != relay or circuit.relay != relay:
            return "receipt is not from the circuit's relay"
        src, dst = (me, circuit.remote) if circuit.is_source else (circuit.remote, me)
        if (receipt["src"], receipt["dst"]) != (src, dst):
            return "receipt endpoints do not match the circuit"
        if receipt["payer"] not in (src, dst) and not receipt["task_id"]:
            return "payer is not an endpoint"
        counted = circuit.bytes_total()
        if receipt["bytes_total"] > counted + in_flight_allowance(counted):
            return f"receipt claims {receipt['bytes_total']} bytes, we counted {counted}"
        if receipt["amount_total"] > amount_for(receipt["bytes_total"], self._max_price_per_mib):
            return "price above what we accept"
        return None

    def sign(self, receipt: dict) -> bytes:
        return self._identity.sign(relay_receipt_signing_bytes(self._chain_id, receipt))

    async def serve(self, stream) -> None:
        """Handler for RECEIPT_PROTOCOL streams (the remote peer is the relay)."""
        async with asyncio.timeout(EXCHANGE_TIMEOUT):
            try:
                receipt = decode_request(await _read_frame(stream, MAX_REQUEST_BYTES))
            except ProtocolError as exc:
                await stream.write(frame(b"\x01" + str(exc).encode()[:400]))
                await stream.close()
                return
            reason = self.check(stream.remote_peer, receipt)
            answer = b"\x00" + self.sign(receipt) if reason is None else b"\x01" + reason.encode()[:400]
            await stream.write(frame(answer))
            await stream.close()


def relay_receipt_payload(receipt: dict, src_sig: bytes, dst_sig: bytes) -> dict:
    """The ``relay_receipt`` transaction payload (consensus.tx PAYLOAD_SCHEMAS)."""
    return {"receipt": receipt, "src_sig": src_sig, "dst_sig": dst_sig}


Submit = Callable[[dict], Awaitable[None]]
