"""DCUtR and AutoNAT messages are byte-compatible with py-libp2p 0.8.1's generated protobufs."""
import pytest

from node.identity import Identity, b58decode
from node.p2p.multiaddr import Multiaddr
from node.p2p.varint import decode_uvarint
from relay.dcutr import HolePunch, HolePunchType, decode_holepunch, encode_holepunch
from relay.reachability import (
    DialRequest,
    DialResponse,
    ResponseStatus,
    decode_message,
    encode_request,
    encode_response,
)

dcutr_pb2 = pytest.importorskip("libp2p.relay.circuit_v2.pb.dcutr_pb2")
autonat_pb2 = pytest.importorskip("libp2p.host.autonat.pb.autonat_pb2")

ADDRS = (Multiaddr.parse("/ip4/10.99.0.101/tcp/40123"), Multiaddr.parse("/ip6/::1/tcp/4001"))
PEER = Identity.from_seed(b"\x07" * 32).peer_id


def body(framed: bytes) -> bytes:
    length, start = decode_uvarint(framed)
    return framed[start:start + length]


def test_holepunch_both_ways():
    ours = HolePunch(HolePunchType.CONNECT, ADDRS)
    theirs = dcutr_pb2.HolePunch()
    theirs.ParseFromString(body(encode_holepunch(ours)))
    assert theirs.type == dcutr_pb2.HolePunch.CONNECT
    assert list(theirs.ObsAddrs) == [a.to_bytes() for a in ADDRS]
    sync = dcutr_pb2.HolePunch(type=dcutr_pb2.HolePunch.SYNC)
    assert decode_holepunch(sync.SerializeToString()) == HolePunch(HolePunchType.SYNC)
    connect = dcutr_pb2.HolePunch(type=dcutr_pb2.HolePunch.CONNECT, ObsAddrs=[a.to_bytes() for a in ADDRS])
    assert decode_holepunch(connect.SerializeToString()) == ours


def test_autonat_both_ways():
    request = DialRequest(PEER, ADDRS)
    theirs = autonat_pb2.Message()
    theirs.ParseFromString(body(encode_request(request)))
    assert theirs.type == autonat_pb2.Message.DIAL
    assert theirs.dial.peer.id == b58decode(PEER)
    assert list(theirs.dial.peer.addrs) == [a.to_bytes() for a in ADDRS]
    response = autonat_pb2.Message(
        type=autonat_pb2.Message.DIAL_RESPONSE, dialResponse=autonat_pb2.Message.DialResponse(
            status=autonat_pb2.Message.E_DIAL_ERROR, statusText="no", addr=ADDRS[0].to_bytes()))
    assert decode_message(response.SerializeToString()) == DialResponse(ResponseStatus.E_DIAL_ERROR, "no", ADDRS[0])
    ours = DialResponse(ResponseStatus.OK, "", ADDRS[1])
    theirs = autonat_pb2.Message()
    theirs.ParseFromString(body(encode_response(ours)))
    assert theirs.dialResponse.status == autonat_pb2.Message.OK and theirs.dialResponse.addr == ADDRS[1].to_bytes()
    their_request = autonat_pb2.Message(type=autonat_pb2.Message.DIAL, dial=autonat_pb2.Message.Dial(
        peer=autonat_pb2.Message.PeerInfo(id=b58decode(PEER), addrs=[a.to_bytes() for a in ADDRS])))
    assert decode_message(their_request.SerializeToString()) == request
