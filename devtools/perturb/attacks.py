"""Attacks as perturbations (issue 22, docs/adr/0192): attacker scripts that use only the wire and the
RPC, run against one victim for ``seconds`` while `Watch` holds the soak's attack invariant.

Invariant (every attack): the chain commits throughout (the highest validator height advances at
least once every `STALL_S`) and the victim's ``/health`` answers (never failing for `HEALTH_GRACE_S`
in a row). Each attack also checks that an honest newcomer is still served:

handshake_flood: idle TCP sockets to the victim's p2p port, `FLOOD_SOCKETS` of them from as many
loopback source addresses 127.0.x.y (one source outside loopback mode), reopened when closed; a fresh
identity must complete a handshake in at least half of its tries during the flood.
websocket_flood: `WS_CLIENTS` websockets to ``/ws`` from loopback sources, answering pings and idle.
artifact_squat: `SQUATTERS` throwaway identities x `STREAMS_EACH` artifact streams kept alive with a
manifest request every `SQUAT_REFRESH_S`; a fresh downloader asking for a manifest must get an answer
other than BUSY in at least half of its tries.

pt2_bomb (devtools/perturb/bomb_attack.py, against a compute node): tasks whose model archive is the
.pt2 exponent bomb; every one the victim is given must end unpaid.

`run_attack` runs one of `ATTACKS` and returns the violations found (empty when the victim held).
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import threading
import time
from collections.abc import Awaitable, Callable

import aiohttp

from devtools.perturb.network import Member, PerturbNet
from node.artifacts.protocol import (
    BUSY,
    HEADER_BYTES,
    NOT_FOUND,
    PROTOCOL,
    Error,
    GetManifest,
    decode_body,
    decode_header,
    encode,
    max_response_bytes,
)
from node.identity import Identity
from node.p2p.host import Host

STALL_S = 10.0
HEALTH_GRACE_S = 5.0
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 8.0
FLOOD_SOCKETS = 256
WS_CLIENTS = 300
SQUATTERS, STREAMS_EACH = 8, 4
SQUAT_REFRESH_S = 20.0
ATTACKER_JOIN_S = 90.0

CLOSING = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)

Attack = Callable[[PerturbNet, Member, asyncio.Event, list[str]], Awaitable[None]]


def sources(victim: Member, count: int) -> list[str | None]:
    """Source addresses for ``count`` attacker connections: distinct 127.0.x.y (x >= 1, so never the
    watcher's 127.0.0.1) when the victim listens on loopback, else the default source."""
    if not ipaddress.ip_address(victim.spec.host).is_loopback:
        return [None] * count
    return [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]


class Watch:
    """The attack invariant, sampled every second from the soak's own thread."""

    def __init__(self, net: PerturbNet, victim: Member):
        self.net = net
        self.victim = victim

    def top(self) -> int:
        return max((self.net.height(m) or 0) for m in self.net.validators)

    def run(self, seconds: float) -> list[str]:
        out: list[str] = []
        start = time.monotonic()
        top, progressed, unhealthy_since = self.top(), start, None
        while (now := time.monotonic()) - start < seconds:
            height = self.top()
            if height > top:
                top, progressed = height, now
            elif now - progressed > STALL_S and not any("no block" in v for v in out):
                out.append(f"no block committed for {STALL_S:g} s during the attack (height {top})")
            if self.net.healthy(self.victim, timeout=HEALTH_GRACE_S):
                unhealthy_since = None
            elif unhealthy_since is None:
                unhealthy_since = now
            elif now - unhealthy_since >= HEALTH_GRACE_S and not any("/health" in v for v in out):
                out.append(f"{self.victim.name} /health did not answer for {HEALTH_GRACE_S:g} s during the attack")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
        return out


def run_attack(net: PerturbNet, victim: Member, seconds: float, attack: Attack) -> list[str]:
    """Run ``attack`` in a thread of its own (its own event loop) for ``seconds`` under `Watch`."""
    found: list[str] = []
    ready = threading.Event()
    holder: dict = {}

    def main() -> None:
        async def go() -> None:
            stop = asyncio.Event()
            holder["loop"], holder["stop"] = asyncio.get_running_loop(), stop
            ready.set()
            await attack(net, victim, stop, found)
        try:
            asyncio.run(go())
        except Exception as exc:  # noqa: BLE001 - an attacker that crashed is reported, not raised in a thread
            found.append(f"the attacker failed: {exc!r}")
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="perturb-attack", daemon=True)
    thread.start()
    ready.wait(30)
    try:
        violations = Watch(net, victim).run(seconds)
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(ATTACKER_JOIN_S)
    if thread.is_alive():   # its verdict would be lost: say so rather than pass
        violations.append(f"the attacker did not finish within {ATTACKER_JOIN_S:g} s of the attack's end")
    return violations + found


async def _until(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


# ---- handshake flood --------------------------------------------------------------------------

async def _idle_socket(host: str, port: int, source: str | None, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                host, port, local_addr=(source, 0) if source else None)
        except OSError:
            if await _until(stop, 0.5):
                return
            continue
        try:
            halt = asyncio.ensure_future(stop.wait())
            while not stop.is_set():   # read what the victim sends (its multistream header), never answer
                read = asyncio.ensure_future(reader.read(1 << 16))
                await asyncio.wait({read, halt}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    break
                if read.exception() is not None or not read.result():
                    break   # closed by the victim
            halt.cancel()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await _until(stop, 0.2)   # closed by the victim: take the slot again at once, without spinning


async def _handshakes(victim: Member, stop: asyncio.Event) -> tuple[int, int]:
    """Dial the victim with a fresh identity every `PROBE_EVERY_S`; (successes, failures)."""
    ok = failed = 0
    while not await _until(stop, PROBE_EVERY_S):
        host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
        try:
            await host.start()
            await asyncio.wait_for(host.connect(victim.spec.p2p_addr), PROBE_TIMEOUT_S)
            ok += 1
        except (OSError, TimeoutError, Exception):  # noqa: BLE001 - any failure to connect counts
            failed += 1
        finally:
            with contextlib.suppress(Exception):
                await host.stop()
    return ok, failed


async def handshake_flood_attack(net: PerturbNet, victim: Member, stop: asyncio.Event, found: list[str]) -> None:
    del net
    flood = [asyncio.create_task(_idle_socket(victim.spec.host, victim.spec.p2p_port, source, stop))
             for source in sources(victim, FLOOD_SOCKETS)]
    ok, failed = await _handshakes(victim, stop)
    await asyncio.gather(*flood, return_exceptions=True)
    if failed > ok:
        found.append(f"handshake flood: a fresh peer could not connect to {victim.name} "
                     f"in {failed} of {ok + failed} tries")


# ---- websocket flood --------------------------------------------------------------------------

async def _idle_websocket(url: str, source: str | None, stop: asyncio.Event) -> None:
    connector = aiohttp.TCPConnector(local_addr=(source, 0) if source else None, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        while not stop.is_set():
            try:
                async with session.ws_connect(url, autoping=True, heartbeat=None) as ws:
                    halt = asyncio.ensure_future(stop.wait())
                    while not stop.is_set():   # pings are answered by aiohttp; stay until closed
                        receive = asyncio.ensure_future(ws.receive())
                        await asyncio.wait({receive, halt}, return_when=asyncio.FIRST_COMPLETED)
                        if not receive.done():
                            receive.cancel()
                            break
                        if receive.exception() is not None or receive.result().type in CLOSING:
                            break
                    halt.cancel()
            except (TimeoutError, aiohttp.ClientError, OSError):
                if await _until(stop, 0.5):
                    return


async def websocket_flood_attack(net: PerturbNet, victim: Member, stop: asyncio.Event, found: list[str]) -> None:
    del net, found   # the Watch's /health checks are this attack's verdict
    url = victim.spec.rpc_url.rstrip("/") + "/ws"
    await asyncio.gather(*(_idle_websocket(url, source, stop) for source in sources(victim, WS_CLIENTS)),
                         return_exceptions=True)


# ---- artifact slot squatting ------------------------------------------------------------------

async def _ask_manifest(stream, artifact: str) -> object:
    await stream.write(encode(GetManifest(artifact)))
    kind, length = decode_header(await stream.readexactly(HEADER_BYTES), max_response_bytes(1 << 20))
    return decode_body(kind, await stream.readexactly(length))


def _unknown_artifact() -> str:
    return os.urandom(32).hex()


async def _squatter(victim: Member, stop: asyncio.Event) -> None:
    host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
    await host.start()
    try:
        peer = await asyncio.wait_for(host.connect(victim.spec.p2p_addr), PROBE_TIMEOUT_S)
        streams = [await host.open_stream(peer, PROTOCOL) for _ in range(STREAMS_EACH)]
        while True:
            for stream in streams:   # a request now and then: the holder's idle timeout never fires
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(_ask_manifest(stream, _unknown_artifact()), PROBE_TIMEOUT_S)
            if await _until(stop, SQUAT_REFRESH_S):
                return
    finally:
        with contextlib.suppress(Exception):
            await host.stop()


async def _downloader(victim: Member) -> object:
    host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
    await host.start()
    try:
        peer = await asyncio.wait_for(host.connect(victim.spec.p2p_addr), PROBE_TIMEOUT_S)
        stream = await host.open_stream(peer, PROTOCOL)
        return await asyncio.wait_for(_ask_manifest(stream, _unknown_artifact()), PROBE_TIMEOUT_S)
    finally:
        with contextlib.suppress(Exception):
            await host.stop()


async def artifact_squat_attack(net: PerturbNet, victim: Member, stop: asyncio.Event, found: list[str]) -> None:
    del net
    squat = [asyncio.create_task(_squatter(victim, stop)) for _ in range(SQUATTERS)]
    served = busy = 0
    while not await _until(stop, PROBE_EVERY_S):
        with contextlib.suppress(Exception):
            answer = await _downloader(victim)
            if isinstance(answer, Error) and answer.code == BUSY:
                busy += 1
            elif isinstance(answer, Error) and answer.code == NOT_FOUND:
                served += 1
    await asyncio.gather(*squat, return_exceptions=True)
    if busy > served:
        found.append(f"artifact squat: fresh downloaders got BUSY from {victim.name} "
                     f"in {busy} of {busy + served} tries")


from devtools.perturb.bomb_attack import pt2_bomb_attack  # noqa: E402

ATTACKS: dict[str, Attack] = {"handshake_flood": handshake_flood_attack, "websocket_flood": websocket_flood_attack,
                              "artifact_squat": artifact_squat_attack, "pt2_bomb": pt2_bomb_attack}
