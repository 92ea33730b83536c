"""Relay load reports: the relay says how full it is, a client asks (ADR 0227).

Protocol ``/dekube/relay-load/1.0.0`` (client -> relay): the client opens the stream and sends
nothing; the relay answers one length-prefixed canonical encoding (consensus.encoding) of a map
``{"circuits", "max_circuits", "reservations", "max_reservations"}`` of non-negative integers and
closes. ``LoadReport.utilization`` turns it into the fraction of the relay that is in use, clamped
to [0, 1]: every number in it is the relay's word and is treated as such (relay/choice.py bounds
what an understated load gains). A report is at most ``MAX_REPORT_BYTES`` long and its integers
below 2**32; anything else is a ``LoadError``.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from consensus.encoding import decode, encode
from node.p2p.errors import ProtocolError

from .messages import MessageReader, RelayMessageError, frame

LOAD_PROTOCOL = "/dekube/relay-load/1.0.0"
MAX_REPORT_BYTES = 128
MAX_COUNT = 1 << 32
QUERY_TIMEOUT_S = 5.0
FIELDS = ("circuits", "max_circuits", "reservations", "max_reservations")


class LoadError(ProtocolError):
    """A load report is malformed, too long, or did not come in time."""


@dataclass(frozen=True)
class LoadReport:
    circuits: int
    max_circuits: int
    reservations: int
    max_reservations: int

    @property
    def utilization(self) -> float:
        """The busier of the circuit and the reservation slots, as a fraction in [0, 1] (a relay
        announcing no capacity is full)."""
        return max(_fraction(self.circuits, self.max_circuits), _fraction(self.reservations, self.max_reservations))

    def encode(self) -> bytes:
        return encode({name: getattr(self, name) for name in FIELDS})


def _fraction(used: int, capacity: int) -> float:
    return 1.0 if capacity <= 0 else min(1.0, used / capacity)


def decode_report(body: bytes) -> LoadReport:
    try:
        value = decode(body, max_size=MAX_REPORT_BYTES)
    except ValueError as exc:
        raise LoadError(f"malformed load report: {exc}") from exc
    if not isinstance(value, dict) or sorted(value) != sorted(FIELDS):
        raise LoadError("load report does not have the load fields")
    for name in FIELDS:
        count = value[name]
        if type(count) is not int or not 0 <= count < MAX_COUNT:
            raise LoadError(f"load report {name} is not a count")
    return LoadReport(**value)


async def serve_load(stream, report: LoadReport) -> None:
    """Relay side: answer one load query with ``report``."""
    try:
        await stream.write(frame(report.encode()))
        await stream.close()
    except (ConnectionError, RuntimeError):
        stream.reset()


async def query_load(host, relay: str) -> LoadReport:
    """Ask the connected (or dialable) ``relay`` for its load; raises LoadError, ProtocolError,
    ConnectionError, OSError or TimeoutError."""
    async with asyncio.timeout(QUERY_TIMEOUT_S):
        stream = await host.open_stream(relay, LOAD_PROTOCOL)
        try:
            reader = MessageReader(MAX_REPORT_BYTES)
            while True:
                data = await stream.read()
                if not data:
                    raise LoadError("stream ended before the load report did")
                try:
                    body = reader.feed(data)
                except RelayMessageError as exc:
                    raise LoadError(str(exc)) from exc
                if body is not None:
                    return decode_report(body)
        finally:
            stream.reset()
