"""DCUtR: message codec (with fuzzing), the sans-I/O exchange, and the driver on loopback."""
import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relay_harness import (
    SINK_PROTOCOL,
    Sink,
    expected_answer,
    pattern,
    send_and_check,
    start_endpoint,
    start_relay,
    stop_all,
)

from node.p2p.multiaddr import Multiaddr
from node.p2p.muxer import StreamResetError
from node.p2p.protobuf import field_bytes, field_varint
from node.p2p.varint import encode_uvarint
from relay.dcutr import (
    DCUTR_PROTOCOL,
    MAX_MESSAGE_BYTES,
    DcutrError,
    DcutrInitiator,
    DcutrResponder,
    Dial,
    FrameReader,
    HolePunch,
    HolePunchType,
    Send,
    decode_holepunch,
    encode_holepunch,
)
from relay.holepunch import HolePuncher
from relay.holepunch_dial import dial_peer, upgrade_relayed
from relay.holepunch_inbound import upgrade_inbound

A1 = Multiaddr.parse("/ip4/10.0.0.1/tcp/4001")
A2 = Multiaddr.parse("/ip4/10.0.0.2/tcp/4002")


def body_of(framed: bytes) -> bytes:
    bodies = FrameReader().feed(framed)
    assert len(bodies) == 1
    return bodies[0]


# ---------------------------------------------------------------- messages
def test_roundtrip_connect_and_sync():
    for msg in (HolePunch(HolePunchType.CONNECT, (A1, A2)), HolePunch(HolePunchType.SYNC)):
        assert decode_holepunch(body_of(encode_holepunch(msg))) == msg


def test_wire_form_matches_the_spec_field_numbers():
    framed = encode_holepunch(HolePunch(HolePunchType.CONNECT, (A1,)))
    expected_body = field_varint(1, 100) + field_bytes(2, A1.to_bytes())
    assert framed == encode_uvarint(len(expected_body)) + expected_body


@pytest.mark.parametrize("body, reason", [
    (b"", "lacks a type"),
    (field_varint(1, 7), "unknown dcutr message type"),
    (field_bytes(1, b"x"), "must be a varint"),
    (field_varint(1, 100) + field_varint(2, 5), "must be bytes"),
    (field_varint(1, 100) + field_bytes(2, b"\x04") * 17, "more than 16"),
    (b"\xff\xff", "malformed"),
])
def test_malformed_messages_raise_clear_errors(body, reason):
    with pytest.raises(DcutrError, match=reason):
        decode_holepunch(body)


def test_unknown_fields_and_unparsable_addrs_are_skipped():
    body = field_varint(1, 300) + field_varint(9, 1) + field_bytes(2, b"\x99\x99\x01")
    assert decode_holepunch(body) == HolePunch(HolePunchType.SYNC, ())


def test_oversized_frame_is_refused_before_buffering_it():
    with pytest.raises(DcutrError, match="exceeds"):
        FrameReader().feed(encode_uvarint(MAX_MESSAGE_BYTES + 1))


def test_frames_reassemble_from_single_bytes():
    framed = encode_holepunch(HolePunch(HolePunchType.CONNECT, (A1,))) + encode_holepunch(HolePunch(HolePunchType.SYNC))
    reader = FrameReader()
    bodies = [b for i in range(len(framed)) for b in reader.feed(framed[i:i + 1])]
    assert [decode_holepunch(b).type for b in bodies] == [HolePunchType.CONNECT, HolePunchType.SYNC]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzz_decoder_raises_only_dcutr_error(data):
    try:
        decode_holepunch(data)
    except DcutrError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_cores_raise_only_dcutr_error(chunks):
    responder = DcutrResponder([A1])
    initiator = DcutrInitiator([A1])
    initiator.start(0.0)
    for core in (responder, initiator):
        try:
            for chunk in chunks:
                core.receive(chunk, 1.0)
        except DcutrError:
            pass


# ---------------------------------------------------------------- the exchange
def test_exchange_dials_at_half_the_round_trip():
    initiator, responder = DcutrInitiator([A1, "/ip4/1.2.3.4/tcp/1/p2p-circuit"]), DcutrResponder([A2])
    connect = initiator.start(now=10.0)
    assert decode_holepunch(body_of(connect.data)).obs_addrs == (A1,)  # relayed addresses are not offered
    (reply,) = responder.receive(connect.data, now=10.1)
    assert isinstance(reply, Send)
    sync, dial = initiator.receive(reply.data, now=10.3)
    assert decode_holepunch(body_of(sync.data)).type == HolePunchType.SYNC
    assert dial == Dial((A2,), pytest.approx(10.45), pytest.approx(0.3))
    (responder_dial,) = responder.receive(sync.data, now=10.4)
    assert responder_dial == Dial((A1,), 10.4, None)


def test_exchange_refuses_out_of_order_and_empty_offers():
    responder = DcutrResponder([A2])
    with pytest.raises(DcutrError, match="expected CONNECT"):
        responder.receive(encode_holepunch(HolePunch(HolePunchType.SYNC)), 0.0)
    with pytest.raises(DcutrError, match="no dialable"):
        DcutrResponder([A2]).receive(encode_holepunch(HolePunch(HolePunchType.CONNECT, ())), 0.0)
    with pytest.raises(DcutrError, match="we have no dialable"):
        DcutrResponder([]).receive(encode_holepunch(HolePunch(HolePunchType.CONNECT, (A1,))), 0.0)
    initiator = DcutrInitiator([A1])
    with pytest.raises(DcutrError, match="before the exchange"):
        initiator.receive(b"", 0.0)
    initiator.start(0.0)
    with pytest.raises(DcutrError, match="expected CONNECT"):
        initiator.receive(encode_holepunch(HolePunch(HolePunchType.SYNC)), 0.1)


# ---------------------------------------------------------------- the driver on loopback
async def _relayed_pair():
    a, b = await start_endpoint(), await start_endpoint()
    relay = await start_relay({a.host.peer_id, b.host.peer_id})
    relay_addr = relay.host.listen_addrs[0]
    punchers = []
    for endpoint in (a, b):
        puncher = HolePuncher(endpoint.host, punch_window=2.0, ipv6=False)
        puncher.start()
        observed = await puncher.connect_public(relay_addr)
        assert observed == Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{puncher.port}")
        punchers.append(puncher)
    await b.reserve(relay_addr)
    relayed = await a.dial(b.relayed_addrs)
    return a, b, relay, relayed, punchers


def test_direct_connect_upgrades_a_relayed_connection_on_loopback():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        sink = Sink()
        b.host.set_handler(SINK_PROTOCOL, sink)
        try:
            assert a.pipe_for(relayed) is not None
            direct = await pa.direct_connect(relayed)
            assert direct is not None and a.pipe_for(direct) is None
            assert direct.remote_peer == b.host.peer_id
            assert direct.secure.tcp.peername == ("127.0.0.1", pb.port)
            assert await pb.wait_direct(a.host.peer_id, 5) is not None
            data = pattern(4 << 20)
            assert await send_and_check(direct, data) == expected_answer(data)
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_responder_punches_and_records_even_when_the_relayed_connection_retires_under_it():
    """The relayed connection is retired as soon as either side has the direct one, which cancels
    the responder's stream handler: here the handler is cancelled the moment the exchange ends (the
    responder closes its DCUtR stream), and the punch must still happen and be recorded."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        cut = []

        async def serve_then_retire(stream):
            handler = asyncio.current_task()
            close = stream.close

            async def close_and_cancel():
                await close()
                cut.append(handler.cancel())   # what a retired relayed connection does to its handlers
            stream.close = close_and_cancel
            await pb.serve(stream)
        b.host.set_handler(DCUTR_PROTOCOL, serve_then_retire)
        try:
            direct = await pa.direct_connect(relayed)
            assert direct is not None and direct.remote_peer == b.host.peer_id
            assert cut == [True]   # one exchange, its handler cancelled
            recorded = await pb.wait_direct(a.host.peer_id, 5)
            assert recorded is not None and not recorded.closed
        finally:
            await pb.close()
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_initiator_accepts_a_punch_from_a_responder_whose_mapping_was_mispredicted():
    """B offers a wrong address (as a symmetric NAT's side does: its punch leaves from another
    port); A's SYNs miss, but A listens on its punch port too and takes B's connection (ADR 0194;
    before, only the responder listened and this stayed relayed)."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        pb.observed = {relay.host.peer_id: Multiaddr.parse("/ip4/127.0.0.1/tcp/9")}  # nothing listens there
        pb.predict = 0  # no mapping probes: loopback's ephemeral ports would read as a random NAT
        pa.attempts = 1
        try:
            direct = await pa.direct_connect(relayed)
            assert direct is not None and direct is not relayed
            assert direct.remote_peer == b.host.peer_id and await direct.ping() >= 0
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_direct_connect_gives_up_and_stays_relayed_when_no_path_exists():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        for puncher in (pa, pb):  # nothing listens there
            puncher.observed = {relay.host.peer_id: Multiaddr.parse("/ip4/127.0.0.1/tcp/9")}
        pa.attempts = 2
        try:
            assert await pa.direct_connect(relayed) is None
            assert not relayed.closed  # still usable
            assert await relayed.ping() >= 0
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_only_mappings_on_live_connections_are_offered():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        try:
            assert pa.own_addrs() == [Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{pa.port}")]
            await pa._public[relay.host.peer_id].close()
            assert pa.own_addrs() == []
            with pytest.raises(DcutrError, match="no observed address"):
                await pa._initiate(relayed)
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_malformed_dcutr_stream_is_answered_with_a_reset_and_the_peer_keeps_serving():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        try:
            stream = await relayed.open_stream("/libp2p/dcutr")
            await stream.write(b"\x05\xff\xff\xff\xff\xff")
            with pytest.raises(StreamResetError):
                await stream.read()  # reset by the responder
            assert await pa.direct_connect(relayed) is not None
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------- the dial policy
def test_dial_peer_prefers_direct_then_punched_then_relayed():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        try:
            path = await dial_peer(a.host, a, pa, b.host.peer_id, b.host.listen_addrs, b.relayed_addrs)
            assert path.kind == "direct" and a.pipe_for(path.conn) is None
            await path.conn.close()
            await relayed.close()
            unreachable = ["/ip4/127.0.0.1/tcp/9"]
            path = await dial_peer(a.host, a, pa, b.host.peer_id, unreachable, b.relayed_addrs, retire_after=0.1)
            assert path.kind == "punched" and a.pipe_for(path.conn) is None
            await path.retiring
            shared = [c for c in a.host.connections(b.host.peer_id) if not c.bulk and not c.closed]
            assert shared == [path.conn]  # the relayed connection is gone; the direct one is shared
            assert (await dial_peer(a.host, a, pa, b.host.peer_id, [], [])).conn is path.conn  # reused
            await path.conn.close()
            path = await dial_peer(a.host, a, None, b.host.peer_id, unreachable, b.relayed_addrs)
            assert path.kind == "relayed" and a.pipe_for(path.conn) is not None
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_inbound_side_starts_the_punch_on_its_own():
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        watcher = asyncio.create_task(upgrade_inbound(pb, b, retire_after=0.1))
        await asyncio.sleep(0)  # the watcher registers its callback
        await relayed.close()
        relayed = await a.dial(b.relayed_addrs)  # an inbound circuit at b, seen by the callback
        try:
            from_b = await pb.wait_direct(a.host.peer_id, 15)  # b initiated (the spec's B role)
            at_a = await pa.wait_direct(b.host.peer_id, 15)
            assert from_b is not None and at_a is not None
            assert at_a.direction == "inbound" and a.pipe_for(at_a) is None
            await asyncio.sleep(0.3)
            direct = [c for c in a.host.connections(b.host.peer_id) if a.pipe_for(c) is None and not c.closed]
            assert direct == [at_a]  # one punch per relayed connection
            for _ in range(50):  # b retires the relayed connection it punched around
                if relayed.closed:
                    break
                await asyncio.sleep(0.05)
            assert relayed.closed
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------- the switch to the direct connection
def test_new_streams_take_the_punched_connection_not_the_relayed_one():
    """Once a punch gives a direct connection, the Host opens new streams on it, never on the
    relayed one about to be retired (the spec: "all new streams should be opened in the direct
    connection"); before, the relayed connection stayed shared until it closed."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        b.host.set_handler(SINK_PROTOCOL, Sink())
        try:
            assert (await a.host.open_stream(b.host.peer_id, SINK_PROTOCOL)).connection is relayed
            direct = await pa.direct_connect(relayed)
            assert direct is not None and not relayed.closed
            stream = await a.host.open_stream(b.host.peer_id, SINK_PROTOCOL)
            assert stream.connection is direct
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_ping_caught_on_the_retired_relayed_connection_is_retried_on_the_direct_one():
    """The peer punches and closes the relayed connection while our ping waits on it (js-libp2p
    does so after DCUtR): Host.ping answers over the direct connection instead of failing."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        from node.p2p.ping import PROTOCOL_ID as PING
        from node.p2p.ping import serve_ping

        async def ping_then_switch(stream):
            if b.pipe_for(stream.connection) is None:
                await serve_ping(stream)
                return
            assert await pb.direct_connect(stream.connection) is not None  # b punches, then retires
            await stream.connection.close()

        b.host.set_handler(PING, ping_then_switch)
        try:
            assert await a.host.ping(b.host.peer_id) >= 0
            assert relayed.closed
            direct = [c for c in a.host.connections(b.host.peer_id) if not c.closed]
            assert direct and a.pipe_for(direct[0]) is None
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_inbound_side_sends_connect_and_the_dialer_waits_for_it():
    """DCUtR roles as the spec says: the inbound side of the circuit (B) opens the dcutr stream and
    is the noise initiator; the dialer (A) answers and does not start a punch of its own (before,
    the dialer initiated at once and B's punch was a second one, or deferred)."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await _relayed_pair()
        watcher = asyncio.create_task(upgrade_inbound(pb, b, retire_after=0.1))
        await asyncio.sleep(0)
        await relayed.close()
        started = []
        original = pa.direct_connect

        async def counted(conn):
            started.append(conn)
            return await original(conn)

        pa.direct_connect = counted
        try:
            relayed = await a.dial(b.relayed_addrs)
            path = await upgrade_relayed(pa, relayed, retire_after=0.1)
            assert path.kind == "punched" and a.pipe_for(path.conn) is None
            assert path.conn.direction == "inbound"  # b dialed as the DCUtR (and noise) initiator
            assert started == []                    # a never sent CONNECT
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_reachable_dialer_is_dialed_back_directly_before_any_punch():
    """Connection reversal: A listens on an address B can reach; B dials it on A's inbound relayed
    connection and both end direct, though no punch could work here (both offer a dead mapping;
    before, this stayed relayed)."""
    from node.identity import Identity
    from node.p2p.host import Host
    from relay.client import RelayClient

    async def main():
        host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
        await host.start()
        a = RelayClient(host)
        a.start()
        b = await start_endpoint()
        relay = await start_relay({a.host.peer_id, b.host.peer_id})
        relay_addr = relay.host.listen_addrs[0]
        punchers = []
        for endpoint in (a, b):
            puncher = HolePuncher(endpoint.host, punch_window=1.0, ipv6=False)
            puncher.start()
            await puncher.connect_public(relay_addr)
            puncher.observed = {relay.host.peer_id: Multiaddr.parse("/ip4/127.0.0.1/tcp/9")}  # no punch works
            punchers.append(puncher)
        pa, pb = punchers
        await b.reserve(relay_addr)
        watcher = asyncio.create_task(upgrade_inbound(pb, b, retire_after=0.1, reverse_private=True))
        await asyncio.sleep(0)
        try:
            relayed = await a.dial(b.relayed_addrs)
            path = await upgrade_relayed(pa, relayed, retire_after=0.1, punch_wait=10)
            assert path.kind == "punched" and a.pipe_for(path.conn) is None
            listen = Multiaddr.parse(a.host.listen_addrs[0]).without_peer_id()

            def direct_at_b():
                return [str(c.remote_addr) for c in b.host.connections(a.host.peer_id)
                        if not c.closed and b.pipe_for(c) is None]
            # A (the responder of B's reversal dial) can finish its upgrade before B, the dialer, has
            # its muxer's answer and registers the connection: give B a bounded moment to catch up
            for _ in range(100):
                if direct_at_b():
                    break
                await asyncio.sleep(0.05)
            assert direct_at_b() == [str(listen)]
            assert pa.direct == {} and pb.direct == {}  # no punch made it
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))
