"""Relay failover: reservations on two relays chosen by RTT and refreshed before expiry; when the
relay carrying a transfer dies, new dials use another relay at once and the transfer resumes from
the receiver's offset."""
import asyncio
import os
import time

from relay_harness import eventually, pattern, start_endpoint, start_relay, stop_all

from devtools.resumable import RESUMABLE_PROTOCOL, ResumableReceiver, send_resumable
from node.identity import Identity
from relay.service import RelayLimits

MIB = 1 << 20


def test_reservations_kept_on_two_relays_refreshed_and_replaced():
    async def main():
        b = await start_endpoint()
        relays = [await start_relay({b.host.peer_id}, RelayLimits(reservation_ttl=2)) for _ in range(3)]
        keeper = asyncio.create_task(b.maintain([r.host.listen_addrs[0] for r in relays]))
        try:
            await eventually(lambda: len(b.reservations) == 2)
            assert len(b.relayed_addrs) == 2
            first_expiry = {relay: rsvp.expire for relay, rsvp in b.reservations.items()}
            await eventually(lambda: all(b.reservations.get(r, None) is not None and b.reservations[r].expire > e
                                         for r, e in first_expiry.items()), timeout=6)
            victim = next(r for r in relays if r.host.peer_id in b.reservations)
            await stop_all(victim)
            started = time.monotonic()
            await eventually(lambda: len(b.reservations) == 2 and victim.host.peer_id not in b.reservations,
                             timeout=10)
            assert time.monotonic() - started < 5  # the failover target
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await stop_all(b, *relays)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_transfer_resumes_through_second_relay_when_first_dies():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relays = [await start_relay({a.host.peer_id, b.host.peer_id}) for _ in range(2)]
        receiver = ResumableReceiver()
        b.host.set_handler(RESUMABLE_PROTOCOL, receiver.serve)
        try:
            for relay in relays:
                await b.reserve(relay.host.listen_addrs[0])
            addrs = b.relayed_addrs
            used = []

            async def open_path():
                conn = await a.dial(addrs, bulk=True)
                used.append(a.pipe_for(conn).relay_peer)
                return await conn.open_stream(RESUMABLE_PROTOCOL)

            data = pattern(48 * MIB)
            transfer_id = os.urandom(16)
            sender = asyncio.create_task(send_resumable(open_path, transfer_id, data))
            await eventually(lambda: transfer_id in receiver.transfers
                             and len(receiver.transfers[transfer_id].data) >= 8 * MIB, timeout=30)
            victim = next(r for r in relays if r.host.peer_id == used[0])
            await stop_all(victim)
            starts = await asyncio.wait_for(sender, 60)
            assert await receiver.wait(transfer_id) == data
            assert len(used) == 2 and used[1] != used[0]
            assert starts[0] == 0 and 8 * MIB <= starts[-1] < len(data)
        finally:
            await stop_all(a, b, *relays)
    asyncio.run(asyncio.wait_for(main(), 90))


def test_dial_does_not_wait_for_a_silent_relay():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        held = []

        async def swallow(reader, writer):  # accepts TCP and never answers, like a relay whose packets vanish
            held.append(writer)
            await reader.read()

        silent = await asyncio.start_server(swallow, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        try:
            await b.reserve(relay.host.listen_addrs[0])
            ghost = f"/ip4/127.0.0.1/tcp/{port}/p2p/{Identity.generate().peer_id}/p2p-circuit/p2p/{b.host.peer_id}"
            started = time.monotonic()
            conn = await a.dial([ghost] + b.relayed_addrs, stagger=0.5)
            assert conn.remote_peer == b.host.peer_id
            assert a.pipe_for(conn).relay_peer == relay.host.peer_id
            assert time.monotonic() - started < a.host.limits.handshake_timeout / 2
        finally:
            silent.close()
            for writer in held:
                writer.close()
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_maintain_does_not_wait_for_a_silent_candidate():
    async def main():
        b = await start_endpoint()
        relays = [await start_relay({b.host.peer_id}) for _ in range(2)]
        held = []

        async def swallow(reader, writer):
            held.append(writer)
            await reader.read()

        silent = await asyncio.start_server(swallow, "127.0.0.1", 0)
        ghost = f"/ip4/127.0.0.1/tcp/{silent.sockets[0].getsockname()[1]}/p2p/{Identity.generate().peer_id}"
        started = time.monotonic()
        keeper = asyncio.create_task(b.maintain([ghost] + [r.host.listen_addrs[0] for r in relays]))
        try:
            await eventually(lambda: len(b.reservations) == 2, timeout=10)
            assert time.monotonic() - started < 4  # not the 5 s ping timeout of the silent candidate
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            silent.close()
            for writer in held:
                writer.close()
            await stop_all(b, *relays)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_abandoned_relay_is_dialed_last():
    """After ``abandon`` (a transfer stalled on it) the connection is closed and the next dial goes
    through the other relay first, even though the abandoned one is listed first and still up."""
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relays = [await start_relay({a.host.peer_id, b.host.peer_id}) for _ in range(2)]
        try:
            for relay in relays:
                await b.reserve(relay.host.listen_addrs[0])
            first = relays[0].host.peer_id
            addrs = sorted(b.relayed_addrs, key=lambda addr: first not in addr)  # relay 0 listed first
            conn = await a.dial(addrs, bulk=True)
            assert a.pipe_for(conn).relay_peer == first
            await a.abandon(conn)
            assert conn.closed
            again = await a.dial(addrs, bulk=True)
            assert a.pipe_for(again).relay_peer == relays[1].host.peer_id
        finally:
            await stop_all(a, b, *relays)
    asyncio.run(asyncio.wait_for(main(), 30))
