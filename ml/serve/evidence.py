"""Dispute evidence pushed to the referees (ADR 0182): the client delivers its bundle, the referee keeps it.

A client behind NAT, or one whose node listens on no address another machine can dial (the CLI's
short-lived client node listens on 0.0.0.0), cannot be fetched from; it can dial out. Once its
`serve_dispute` is committed and the referees are drawn, it pushes the bundle to each referee over
`/dekube/serve-dispute/1.0.0` (`Delivery`, one `deliver_bundle` per referee, retried every `RETRY_S`
until that referee stored it, voted, or the dispute closed):

    client -> {"type": "deliver", "dispute": hex id}
    referee <- {"type": "send"} | {"type": "stored"} (already has it) | {"type": "error", "error": why}
    client -> the bundle (one frame, length prefix included)
    referee <- {"type": "stored"} | {"type": "error", "error": why}

The referee (`receive`, behind `dispute.make_bundle_handler(inbox=...)`) asks the ledger before it
reads a byte of the bundle: the dispute must be open, the stream's peer its client, this node one of
its referees that has not voted. Then the bundle is read within the wire's frame limit, hashed off the
event loop and kept (`Inbox`, bounded in bytes) only when it hashes to the dispute's committed
inputs, exactly what a fetched bundle must do; `referee_duty` uses it before trying to fetch. A
delivery that is unsolicited, for another node's dispute or forged gets a clear error and changes
nothing: the inbox holds only bundles the ledger asked this node to judge.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging

from ml.serve.wire import MAX_FRAME, WireError, decode_frame, encode_frame, frame_length
from node.p2p.errors import ProtocolError

log = logging.getLogger(__name__)

BUNDLE_PROTOCOL = "/dekube/serve-dispute/1.0.0"
DELIVER_TIMEOUT_S = 30.0
RETRY_S = 5.0
MAX_INBOX_BYTES = 4 * MAX_FRAME
MAX_REQUEST = 4096
MIN_RATE = 1 << 20   # bytes/s a bundle transfer is given at least (a relayed link may be slow)
STREAM_ERRORS = (WireError, TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError)


def transfer_timeout(length: int, timeout: float = DELIVER_TIMEOUT_S) -> float:
    """Seconds allowed to move `length` bytes of evidence: `timeout` plus the time at MIN_RATE."""
    return timeout + length / MIN_RATE


class DeliveryRefused(Exception):
    """A delivery this referee does not take (the message says why)."""


async def read_header(stream, timeout: float, limit: int = MAX_REQUEST) -> dict:
    """The header of one small frame from `stream` (at most `limit` bytes)."""
    prefix = await asyncio.wait_for(stream.readexactly(4), timeout)
    length = frame_length(prefix)
    if length > limit:
        raise WireError(f"a request of {length} bytes exceeds {limit}")
    return decode_frame(await asyncio.wait_for(stream.readexactly(length), timeout)).header


class Inbox:
    """The bundles clients delivered to this referee, by content hash (the newest within `max_bytes`),
    and the ledger check a delivery must pass before its bundle is read."""

    def __init__(self, gateway, peer_id: str, max_bytes: int = MAX_INBOX_BYTES):
        self.gateway, self.peer_id, self.max_bytes = gateway, peer_id, max_bytes
        self._bundles: dict[bytes, bytes] = {}
        self.receiving: set[bytes] = set()   # the inputs of deliveries being read: one at a time each

    def get(self, inputs: bytes) -> bytes | None:
        return self._bundles.get(inputs)

    def discard(self, inputs: bytes) -> None:
        self._bundles.pop(inputs, None)

    def add(self, inputs: bytes, bundle: bytes) -> None:
        self._bundles[inputs] = bundle
        while sum(map(len, self._bundles.values())) > self.max_bytes and len(self._bundles) > 1:
            self._bundles.pop(next(iter(self._bundles)))

    async def expected(self, client: str, dispute: str) -> bytes:
        """The inputs hash the bundle of `dispute` must have, if `client` may deliver it to this node now."""
        from node.ledger.errors import LedgerUnavailable

        try:
            if len(bytes.fromhex(dispute)) != 32:
                raise ValueError
        except ValueError:
            raise DeliveryRefused("a delivery names its dispute by its 32-byte id in hex") from None
        try:
            record = await self.gateway.call("dkb_getServeDispute", dispute)
        except LedgerUnavailable as exc:
            raise DeliveryRefused(f"cannot look the dispute up on the ledger now: {exc}") from None
        if not record or record.get("status") != "open":
            raise DeliveryRefused("no open dispute has that id")
        if record.get("client") != client:
            raise DeliveryRefused("only the dispute's client delivers its evidence")
        if not any(peer == self.peer_id and vote is None for peer, vote in record.get("referees", [])):
            raise DeliveryRefused("this node is not a referee of that dispute waiting for its evidence")
        return bytes.fromhex(record["inputs"])


async def receive(stream, request: dict, inbox: Inbox, timeout: float = DELIVER_TIMEOUT_S) -> None:
    """Take one delivery (the `request` header already read from `stream`) into `inbox`, or refuse it."""
    async def answer(kind: str, error: str = "") -> None:
        await stream.write(encode_frame({"type": kind, **({"error": error} if error else {})}))

    try:
        inputs = await inbox.expected(stream.remote_peer, str(request.get("dispute", "")))
    except DeliveryRefused as exc:
        log.info("dispute evidence from %s refused: %s", stream.remote_peer[:16], exc)
        await answer("error", str(exc))
        await stream.close()
        return
    if inbox.get(inputs) is None:
        if inputs in inbox.receiving:
            await answer("error", "a delivery of that bundle is under way")
            await stream.close()
            return
        inbox.receiving.add(inputs)
        try:
            error = await _read_bundle(stream, inputs, inbox, answer, timeout)
        finally:
            inbox.receiving.discard(inputs)
        if error:
            log.info("dispute evidence from %s refused: %s", stream.remote_peer[:16], error)
            await answer("error", error)
            await stream.close()
            return
    await answer("stored")
    await stream.close()


async def _read_bundle(stream, inputs: bytes, inbox: Inbox, answer, timeout: float) -> str:
    """Ask for the bundle, read it and keep it if it hashes to `inputs`; the reason if not."""
    await answer("send")
    prefix = await asyncio.wait_for(stream.readexactly(4), timeout)
    try:
        length = frame_length(prefix)
    except WireError as exc:
        return f"the bundle is refused: {exc}"
    bundle = prefix + await asyncio.wait_for(stream.readexactly(length), transfer_timeout(length, timeout))
    if await asyncio.to_thread(lambda: hashlib.sha256(bundle).digest()) != inputs:
        return "the bundle does not hash to the dispute's committed inputs"
    inbox.add(inputs, bundle)
    log.info("dispute evidence %s stored from %s", inputs.hex()[:16], stream.remote_peer[:16])
    return ""


async def deliver_bundle(host, referee: str, dispute: bytes, bundle: bytes,
                         timeout: float = DELIVER_TIMEOUT_S) -> str | None:
    """Push `bundle` (the evidence of `dispute`) to `referee`: None once it stored it, else why not."""
    stream = None
    try:
        stream = await asyncio.wait_for(host.open_stream(referee, BUNDLE_PROTOCOL), timeout)
        await stream.write(encode_frame({"type": "deliver", "dispute": dispute.hex()}))
        reply = await read_header(stream, timeout)
        if reply.get("type") == "send":
            await asyncio.wait_for(stream.write(bundle), transfer_timeout(len(bundle), timeout))
            reply = await read_header(stream, transfer_timeout(len(bundle), timeout))
    except STREAM_ERRORS as exc:
        return f"delivery failed: {exc!r}"
    finally:
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()
    return None if reply.get("type") == "stored" else str(reply.get("error", "unexpected answer"))[:300]


class Delivery:
    """A client's deliveries of one dispute's bundle to its referees: `round(record)` (the dispute as
    dkb_getServeDispute shows it) pushes it to each referee that has neither stored it nor voted,
    at most every `retry_s` per referee, learning the referee's addresses from its ledger record."""

    def __init__(self, gateway, host, dispute: bytes, bundle: bytes, retry_s: float = RETRY_S):
        self.gateway, self.host, self.dispute, self.bundle, self.retry_s = gateway, host, dispute, bundle, retry_s
        self.stored: set[str] = set()
        self.errors: dict[str, str] = {}
        self._due: dict[str, float] = {}

    async def round(self, record: dict) -> None:
        now = asyncio.get_running_loop().time()
        waiting = [peer for peer, vote in record.get("referees", [])
                   if vote is None and peer not in self.stored and self._due.get(peer, 0.0) <= now]
        await asyncio.gather(*(self._deliver(peer, now) for peer in waiting))

    async def _deliver(self, referee: str, now: float) -> None:
        from node.ledger.errors import LedgerUnavailable

        self._due[referee] = now + self.retry_s
        if not self.host.peerbook.addrs(referee) and not self.host.is_connected(referee):
            with contextlib.suppress(LedgerUnavailable, ValueError):
                node = await self.gateway.call("dkb_getNode", referee) or {}
                self.host.peerbook.add_addrs(referee, [*node.get("listen_addrs", []), *node.get("relay_addrs", [])])
        error = await deliver_bundle(self.host, referee, self.dispute, self.bundle)
        if error is None:
            self.stored.add(referee)
            self.errors.pop(referee, None)
        else:
            self.errors[referee] = error
            log.warning("delivering dispute evidence to %s: %s", referee[:16], error)
