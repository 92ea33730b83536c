"""Multiaddr parsing and binary encoding, checked against the `multiaddr` package."""
import multiaddr as oracle
import pytest

from node.identity import Identity
from node.p2p.multiaddr import Multiaddr, MultiaddrError

PEER = Identity.from_seed(b"\x01" * 32).peer_id

ADDRS = [
    "/ip4/127.0.0.1/tcp/4001",
    f"/ip4/10.0.0.1/tcp/1/p2p/{PEER}",
    "/ip6/::1/tcp/65535",
    "/dns4/example.com/tcp/443/wss",
    f"/ip4/1.2.3.4/tcp/1/p2p/{PEER}/p2p-circuit/p2p/{PEER}",
    "/ip4/1.2.3.4/udp/9/quic-v1",
]


@pytest.mark.parametrize("text", ADDRS)
def test_text_and_binary_match_reference(text):
    ma = Multiaddr.parse(text)
    assert str(ma) == text
    assert ma.to_bytes() == oracle.Multiaddr(text).to_bytes()
    assert Multiaddr.from_bytes(ma.to_bytes()) == ma


def test_peer_id_and_tcp_endpoint():
    ma = Multiaddr.parse(f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}")
    assert ma.peer_id == PEER
    assert ma.tcp_endpoint() == ("127.0.0.1", 4001)
    assert str(ma.without_peer_id()) == "/ip4/127.0.0.1/tcp/4001"
    assert Multiaddr.parse("/ip4/127.0.0.1/tcp/4001").with_peer_id(PEER) == ma
    relayed = Multiaddr.parse(ADDRS[4])
    assert relayed.is_relayed and relayed.peer_id == PEER
    with pytest.raises(MultiaddrError):
        relayed.tcp_endpoint()


@pytest.mark.parametrize("bad", ["", "ip4/1.2.3.4", "/ip4/1.2.3", "/ip4/1.2.3.4/tcp/70000", "/tcp",
                                 "/foo/1", "/p2p/notapeer", "/ip4/1.2.3.4/tcp/x"])
def test_bad_text_raises(bad):
    with pytest.raises(MultiaddrError):
        Multiaddr.parse(bad)


@pytest.mark.parametrize("bad", [b"", b"\x04\x01\x02", b"\x99\x99\x99", b"\xa5\x03\x05\x00\x01", b"\x80"])
def test_bad_bytes_raise(bad):
    with pytest.raises(MultiaddrError):
        Multiaddr.from_bytes(bad)


def test_encapsulate_and_value_of():
    relay = Multiaddr.parse(f"/ip4/10.0.0.1/tcp/1/p2p/{PEER}")
    circuit = relay.encapsulate(f"/p2p-circuit/p2p/{PEER}")
    assert str(circuit) == ADDRS[4].replace("1.2.3.4", "10.0.0.1")
    assert circuit.value_of("tcp") == "1" and circuit.value_of("udp") is None
