"""Loopback relay test bench: a relay Host with RelayService and endpoint Hosts with RelayClients."""
from __future__ import annotations

import asyncio
import hashlib

from node.identity import Identity
from node.p2p.host import Host
from relay.client import RelayClient
from relay.service import Admission, RelayLimits, RelayService

SINK_PROTOCOL = "/dekube/test-sink/1.0.0"


async def start_relay(allow: set[str], limits: RelayLimits | None = None, **kwargs) -> RelayService:
    host = Host(Identity.generate())
    await host.start()
    service = RelayService(host, Admission(allow, **kwargs.pop("admission", {})), limits, **kwargs)
    service.start()
    return service


async def start_endpoint(identity: Identity | None = None, **kwargs) -> RelayClient:
    host = Host(identity or Identity.generate())
    await host.start()
    client = RelayClient(host, **kwargs)
    client.start()
    return client


async def stop_all(*parts) -> None:
    for part in parts:
        if isinstance(part, RelayService):
            await part.stop()
            await part.host.stop()
        elif part is not None:
            await part.host.stop()


class Sink:
    """A stream handler that hashes everything it receives and answers the byte count and digest."""

    def __init__(self, pause: asyncio.Event | None = None) -> None:
        self.pause = pause
        self.received = 0
        self.done = asyncio.Event()

    async def __call__(self, stream) -> None:
        digest = hashlib.sha256()
        while True:
            if self.pause is not None:
                await self.pause.wait()
            data = await stream.read()
            if not data:
                break
            digest.update(data)
            self.received += len(data)
        await stream.write(f"{self.received} {digest.hexdigest()}".encode())
        await stream.close()
        self.done.set()


def pattern(size: int) -> bytes:
    block = hashlib.sha256(b"dekube-relay-test").digest() * (1 << 15)  # 1 MiB
    return (block * (size // len(block) + 1))[:size]


async def send_and_check(conn, data: bytes, chunk: int = 1 << 20) -> str:
    stream = await conn.open_stream(SINK_PROTOCOL)
    for pos in range(0, len(data), chunk):
        await stream.write(data[pos:pos + chunk])
    await stream.close()
    answer = b""
    while True:
        part = await stream.read()
        if not part:
            break
        answer += part
    return answer.decode()


def expected_answer(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


async def eventually(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


