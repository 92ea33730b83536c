"""Reachability (AutoNAT v1): codec, address choice, verdicts, and dial-back on loopback."""
import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.identity import Identity
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr
from node.p2p.protobuf import field_bytes, field_varint
from node.p2p.varint import decode_uvarint
from relay.reachability import (
    AUTONAT_PROTOCOL,
    AutoNATError,
    AutoNATServer,
    DialRequest,
    DialResponse,
    Reachability,
    ResponseStatus,
    assess,
    conclude,
    decode_message,
    dialback_candidates,
    encode_request,
    encode_response,
    probe,
    read_message,
)

PEER = Identity.from_seed(bytes(32)).peer_id


def unframe(data: bytes) -> bytes:
    length, start = decode_uvarint(data)
    assert len(data) == start + length
    return data[start:]


def test_request_and_response_roundtrip():
    req = DialRequest(PEER, (Multiaddr.parse("/ip4/1.2.3.4/tcp/5"),))
    assert decode_message(unframe(encode_request(req))) == req
    resp = DialResponse(ResponseStatus.OK, "fine", Multiaddr.parse("/ip4/1.2.3.4/tcp/5"))
    assert decode_message(unframe(encode_response(resp))) == resp


@pytest.mark.parametrize("body, reason", [
    (field_varint(1, 7), "unknown autonat message type"),
    (field_varint(1, 0), "lacks peer info"),
    (field_varint(1, 0) + field_bytes(2, field_bytes(1, field_bytes(1, b"junk"))), "peer id is invalid"),
    (field_varint(1, 1), "lacks dialResponse"),
    (field_varint(1, 1) + field_bytes(3, field_varint(1, 55)), "unknown autonat status"),
    (field_bytes(1, b"x"), "wrong wire type"),
    (b"\x0a\xff", "malformed"),
])
def test_malformed_messages_raise_clear_errors(body, reason):
    with pytest.raises(AutoNATError, match=reason):
        decode_message(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_decoder_raises_only_autonat_error(data):
    try:
        decode_message(data)
    except AutoNATError:
        pass


def test_server_dials_only_the_requesters_observed_ip():
    addrs = [Multiaddr.parse(a) for a in ("/ip4/10.0.0.5/tcp/1", "/ip4/192.168.1.2/tcp/1", "/ip4/10.0.0.5/tcp/2",
                                          "/ip4/10.0.0.5/tcp/1", "/ip4/10.0.0.9/tcp/7/p2p-circuit")]
    assert [str(a) for a in dialback_candidates(addrs, "10.0.0.5")] == ["/ip4/10.0.0.5/tcp/1", "/ip4/10.0.0.5/tcp/2"]


def test_verdicts():
    ok, err, refused = (DialResponse(s) for s in (ResponseStatus.OK, ResponseStatus.E_DIAL_ERROR,
                                                   ResponseStatus.E_DIAL_REFUSED))
    assert conclude([err, ok]) is Reachability.PUBLIC
    assert conclude([err, refused]) is Reachability.PRIVATE
    assert conclude([err], confirmations=2) is Reachability.UNKNOWN
    assert conclude([refused, TimeoutError()]) is Reachability.UNKNOWN
    assert conclude([]) is Reachability.UNKNOWN


async def _server_and_client():
    server_host = Host(Identity.generate())
    await server_host.start()
    server = AutoNATServer(server_host)
    server.start()
    client = Host(Identity.generate())
    await client.start()
    return server, client


def test_dial_back_on_loopback():
    async def main():
        server, client = await _server_and_client()
        server_addr = server.host.listen_addrs[0]
        try:
            assert await assess(client, [server_addr]) is Reachability.PUBLIC
            resp = await probe(client, server_addr, ["/ip4/127.0.0.1/tcp/9"])  # nobody listens there
            assert resp.status == ResponseStatus.E_DIAL_ERROR
            resp = await probe(client, server_addr, ["/ip4/10.9.9.9/tcp/4001"])  # not the IP it sees us on
            assert resp.status == ResponseStatus.E_DIAL_REFUSED
        finally:
            await server.host.stop()
            await client.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_private_when_the_listener_is_unreachable():
    async def main():
        server, client = await _server_and_client()
        hidden = Host(Identity.generate(), listen_addrs=())  # dials out, accepts nothing
        await hidden.start()
        try:
            assert await assess(hidden, [server.host.listen_addrs[0]]) is Reachability.UNKNOWN  # nothing to offer
            resp = await probe(hidden, server.host.listen_addrs[0], ["/ip4/127.0.0.1/tcp/9"])
            assert conclude([resp]) is Reachability.PRIVATE
        finally:
            await hidden.stop()
            await server.host.stop()
            await client.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_bad_requests_are_answered_and_the_server_keeps_serving():
    async def main():
        server, client = await _server_and_client()
        server_addr = server.host.listen_addrs[0]
        try:
            peer = await client.connect(server_addr)
            for junk in (b"\x03\x0a\xff\xff", encode_request(DialRequest(PEER, ()))):
                stream = await client.open_stream(peer, AUTONAT_PROTOCOL)
                await stream.write(junk)
                resp = await read_message(stream)
                assert resp.status == ResponseStatus.E_BAD_REQUEST
            assert await assess(client, [server_addr]) is Reachability.PUBLIC
            assert server.served == 3
        finally:
            await server.host.stop()
            await client.stop()
    asyncio.run(asyncio.wait_for(main(), 60))
