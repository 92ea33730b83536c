"""Circuit relay v2 over loopback: A reaches B through our relay; admission, reservations, malformed
messages, back-pressure and receipts that match the bytes moved."""
import asyncio

import pytest
from relay_harness import (
    SINK_PROTOCOL,
    Sink,
    eventually,
    expected_answer,
    pattern,
    send_and_check,
    start_endpoint,
    start_relay,
    stop_all,
)

from consensus.tx import build_tx, relay_receipt_signing_bytes
from node.identity import Identity, verify_by_peer_id
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr
from relay.client import RelayClient, RelayRefused
from relay.messages import (
    HOP_PROTOCOL,
    STOP_PROTOCOL,
    HopMessage,
    HopType,
    Peer,
    Status,
    StopMessage,
    StopType,
    decode_hop,
    decode_stop,
    encode_hop,
    encode_stop,
    frame,
)
from relay.service import Admission, RelayLimits, RelayService, read_message

MIB = 1 << 20


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 120))


def test_a_reaches_b_through_relay_64mib_intact_and_receipts_match():
    async def main():
        a, b = await start_endpoint(chain_id="test-chain"), await start_endpoint(chain_id="test-chain")
        relay = await start_relay({a.host.peer_id, b.host.peer_id}, RelayLimits(receipt_interval_bytes=16 * MIB),
                                  chain_id="test-chain")
        try:
            rsvp = await b.reserve(relay.host.listen_addrs[0])
            assert rsvp.relay == relay.host.peer_id and rsvp.voucher
            assert b.relayed_addrs[0].endswith(f"/p2p/{relay.host.peer_id}/p2p-circuit/p2p/{b.host.peer_id}")
            b.host.set_handler(SINK_PROTOCOL, Sink())
            conn = await a.dial(b.relayed_addrs, bulk=True)
            assert conn.remote_peer == b.host.peer_id and conn.remote_addr is None
            data = pattern(64 * MIB)
            assert await send_and_check(conn, data) == expected_answer(data)
            [circuit] = relay.circuits
            pipe_a = a.pipe_for(conn)
            [(_, pipe_b)] = b.circuits.values()
            await eventually(lambda: circuit.src_to_dst == pipe_b.bytes_received
                             and circuit.dst_to_src == pipe_a.bytes_received)
            assert circuit.src_to_dst == pipe_a.bytes_sent  # quiescent: everything sent was forwarded
            assert circuit.src_to_dst >= 64 * MIB
            await conn.close()
            await eventually(lambda: not relay.circuits and relay.submitted
                             and relay.submitted[-1]["receipt"]["bytes_total"] >= circuit.bytes_total)
            receipts = [p["receipt"] for p in relay.submitted]
            assert len(receipts) >= 4  # every 16 MiB plus the final one
            assert [r["bytes_total"] for r in receipts] == sorted(r["bytes_total"] for r in receipts)
            final = relay.submitted[-1]
            for endpoint_total in (pipe_a.bytes_total, pipe_b.bytes_total):
                assert abs(final["receipt"]["bytes_total"] - endpoint_total) <= endpoint_total / 1000
            message = relay_receipt_signing_bytes("test-chain", final["receipt"])
            assert verify_by_peer_id(a.host.peer_id, message, final["src_sig"])
            assert verify_by_peer_id(b.host.peer_id, message, final["dst_sig"])
            assert final["receipt"]["src"] == a.host.peer_id and final["receipt"]["relay"] == relay.host.peer_id
            tx = build_tx(relay.identity, "test-chain", 0, "relay_receipt", final)  # ledger schema accepts it
            assert tx.payload["receipt"]["session"] == circuit.session
        finally:
            await stop_all(a, b, relay)
    run(main())


def test_unregistered_peer_refused_and_ledger_stake_admits():
    async def main():
        staked, poor, stranger = Identity.generate(), Identity.generate(), Identity.generate()
        stakes = {staked.peer_id: 100, poor.peer_id: 5}
        relay = await start_relay(set(), admission={"min_stake": 10, "stake_of": stakes.get})
        clients = []
        try:
            for identity in (staked, poor, stranger):
                clients.append(await start_endpoint(identity))
            assert (await clients[0].reserve(relay.host.listen_addrs[0])).relay == relay.host.peer_id
            for refused in clients[1:]:
                with pytest.raises(RelayRefused) as info:
                    await refused.reserve(relay.host.listen_addrs[0])
                assert info.value.status == Status.PERMISSION_DENIED
            assert relay.counters["reservations_refused"] == 2
        finally:
            await stop_all(relay, *clients)
    run(main())


def test_circuit_without_reservation_refused():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        try:
            await b.host.connect(relay.host.listen_addrs[0])  # connected, but no reservation
            with pytest.raises(RelayRefused) as info:
                await a.dial_via(relay.host.listen_addrs[0], b.host.peer_id)
            assert info.value.status == Status.NO_RESERVATION
            # a reserved target is reachable, an unadmitted source is not
            await b.reserve(relay.host.listen_addrs[0])
            relay.admission.allow_list.discard(a.host.peer_id)
            with pytest.raises(RelayRefused) as info:
                await a.dial_via(relay.host.listen_addrs[0], b.host.peer_id)
            assert info.value.status == Status.PERMISSION_DENIED
        finally:
            await stop_all(a, b, relay)
    run(main())


def test_stop_from_relay_without_our_reservation_refused():
    async def main():
        b = await start_endpoint()
        rogue = await start_endpoint()
        try:
            await rogue.host.connect(b.host.listen_addrs[0])
            stream = await rogue.host.open_stream(b.host.peer_id, STOP_PROTOCOL)
            await stream.write(frame(encode_stop(StopMessage(StopType.CONNECT, peer=Peer(rogue.host.peer_id)))))
            answer, _ = await read_message(stream, decode_stop)
            assert answer.status == Status.PERMISSION_DENIED
        finally:
            await stop_all(b, rogue)
    run(main())


def test_per_ip_reservation_limit():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id}, RelayLimits(max_reservations_per_ip=1))
        try:
            await a.reserve(relay.host.listen_addrs[0])
            await a.reserve(relay.host.listen_addrs[0])  # refreshing one's own reservation is fine
            with pytest.raises(RelayRefused) as info:
                await b.reserve(relay.host.listen_addrs[0])
            assert info.value.status == Status.RESOURCE_LIMIT_EXCEEDED
        finally:
            await stop_all(a, b, relay)
    run(main())


@pytest.mark.parametrize("junk", [b"\x05\x08\x07\x12\x01\x00", b"\xff\xff\xff\xff\x0f", b"\x02\x08", b""])
def test_malformed_hop_gets_status_and_relay_keeps_serving(junk):
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        try:
            await a.host.connect(relay.host.listen_addrs[0])
            stream = await a.host.open_stream(relay.host.peer_id, HOP_PROTOCOL)
            await stream.write(junk)
            await stream.close()
            answer, _ = await read_message(stream, decode_hop)
            assert answer.type == HopType.STATUS and answer.status == Status.MALFORMED_MESSAGE
            stream = await a.host.open_stream(relay.host.peer_id, HOP_PROTOCOL)
            await stream.write(frame(encode_hop(HopMessage(HopType.STATUS, status=Status.OK))))
            answer, _ = await read_message(stream, decode_hop)
            assert answer.status == Status.UNEXPECTED_MESSAGE
            await b.reserve(relay.host.listen_addrs[0])
            b.host.set_handler(SINK_PROTOCOL, Sink())
            conn = await a.dial(b.relayed_addrs)
            data = pattern(MIB)
            assert await send_and_check(conn, data) == expected_answer(data)
            assert relay.counters["malformed"] == 1
        finally:
            await stop_all(a, b, relay)
    run(main())


def test_back_pressure_without_loss():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        try:
            await b.reserve(relay.host.listen_addrs[0])
            resume = asyncio.Event()
            b.host.set_handler(SINK_PROTOCOL, Sink(pause=resume))
            conn = await a.dial(b.relayed_addrs)
            data = pattern(160 * MIB)
            sender = asyncio.ensure_future(send_and_check(conn, data, chunk=4 * MIB))
            await asyncio.sleep(1.5)
            assert not sender.done()  # B reads nothing: the writer is held back, not buffered without bound
            [circuit] = relay.circuits
            assert circuit.src_to_dst < 80 * MIB
            resume.set()
            assert await sender == expected_answer(data)
        finally:
            await stop_all(a, b, relay)
    run(main())


@pytest.mark.parametrize("junk", [b"\x03\x08\x05\x00", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", b"\x02\x08\x00"])
def test_malformed_stop_gets_status_and_target_stays_reachable(junk):
    async def main():
        a, b, rogue = await start_endpoint(), await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        try:
            await rogue.host.connect(b.host.listen_addrs[0])
            stream = await rogue.host.open_stream(b.host.peer_id, STOP_PROTOCOL)
            await stream.write(junk)
            answer, _ = await read_message(stream, decode_stop)
            assert answer.type == StopType.STATUS
            assert answer.status in (Status.MALFORMED_MESSAGE, Status.UNEXPECTED_MESSAGE)
            await b.reserve(relay.host.listen_addrs[0])
            b.host.set_handler(SINK_PROTOCOL, Sink())
            data = pattern(MIB)
            assert await send_and_check(await a.dial(b.relayed_addrs), data) == expected_answer(data)
        finally:
            await stop_all(a, b, rogue, relay)
    run(main())


def test_circuit_limit_per_peer():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id}, RelayLimits(max_circuits_per_peer=2))
        try:
            await b.reserve(relay.host.listen_addrs[0])
            conns = [await a.dial(b.relayed_addrs) for _ in range(2)]
            assert len(relay.circuits) == 2
            with pytest.raises(RelayRefused) as info:
                await a.dial_via(relay.host.listen_addrs[0], b.host.peer_id)
            assert info.value.status == Status.RESOURCE_LIMIT_EXCEEDED
            await conns[0].close()
            await eventually(lambda: len(relay.circuits) == 1)
            await a.dial(b.relayed_addrs)  # room again once a circuit ends
        finally:
            await stop_all(a, b, relay)
    run(main())


def test_wildcard_listener_advertises_the_reached_address():
    async def main():
        host = Host(Identity.generate(), ["/ip4/0.0.0.0/tcp/0"])
        await host.start()
        relay = RelayService(host, Admission(stake_of=lambda peer: 1))
        relay.start()
        b = await start_endpoint()
        try:
            port = Multiaddr.parse(host.listen_addrs[0]).tcp_endpoint()[1]
            rsvp = await b.reserve(f"/ip4/127.0.0.1/tcp/{port}/p2p/{host.peer_id}")
            assert [str(a) for a in rsvp.addrs] == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{host.peer_id}"]
            assert b.relayed_addrs == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{host.peer_id}/p2p-circuit/p2p/{b.host.peer_id}"]
        finally:
            await stop_all(b, relay)
    run(main())


def test_reservation_over_a_relayed_connection_refused():
    async def main():
        a = await start_endpoint()
        outer = await start_relay({a.host.peer_id})
        inner = await start_relay({a.host.peer_id})
        inner_client = RelayClient(inner.host)  # the inner relay is itself reachable only via the outer one
        inner_client.start()
        outer.admission.allow_list.add(inner.host.peer_id)
        try:
            await inner_client.reserve(outer.host.listen_addrs[0])
            conn = await a.dial(inner_client.relayed_addrs)
            assert conn.remote_peer == inner.host.peer_id and a.host.is_connected(inner.host.peer_id)
            with pytest.raises(RelayRefused) as info:
                await a.reserve(inner.host.listen_addrs[0])  # reuses the live (relayed) connection
            assert info.value.status == Status.PERMISSION_DENIED
        finally:
            await stop_all(a, outer, inner)
    run(main())


def test_peers_with_a_reservation_are_protected_from_eviction():
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        try:
            assert not relay.host.is_protected(b.host.peer_id)
            await b.reserve(relay.host.listen_addrs[0])
            assert relay.host.is_protected(b.host.peer_id) and not relay.host.is_protected(a.host.peer_id)
            relay.policy.reservations[b.host.peer_id].expire = 0     # the reservation ran out
            await a.reserve(relay.host.listen_addrs[0])               # the next reservation re-tags
            assert relay.host.is_protected(a.host.peer_id) and not relay.host.is_protected(b.host.peer_id)
        finally:
            await stop_all(relay, a, b)
    run(main())
