"""Fuzz every decoder of the transport with random and mutated bytes (hypothesis).

Each must either accept the input or raise its own ProtocolError subclass; anything else
(IndexError, struct.error, UnicodeDecodeError, ...) would crash a connection handler.
DEKUBE_FUZZ_EXAMPLES=3000 runs a longer campaign (default 300 examples per decoder).
"""
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.identify import IdentifyError, IdentifyInfo, decode_identify, encode_identify
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from node.p2p.multistream import DialerNegotiator, ListenerNegotiator, MultistreamError, encode_message
from node.p2p.noise import CipherState, NoiseError, NoiseHandshake, NoiseTransport
from node.p2p.ping import PingError, check_pong
from node.p2p.protobuf import ProtobufError, decode_fields
from node.p2p.varint import VarintError, decode_uvarint

FUZZ = settings(max_examples=int(os.environ.get("DEKUBE_FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
ALICE = Identity.from_seed(b"\x0a" * 32)
BOB = Identity.from_seed(b"\x0b" * 32)


@st.composite
def mutated(draw, valid: bytes):
    """A valid message with a few bytes flipped, inserted, dropped or the tail cut."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[pos]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


def junk_or_mutation(valid: bytes):
    return st.one_of(st.binary(max_size=600), mutated(valid))


@FUZZ
@given(st.binary(max_size=16))
def test_varint(data):
    try:
        decode_uvarint(data)
    except VarintError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_protobuf(data):
    try:
        decode_fields(data)
    except ProtobufError:
        pass


VALID_ADDR = Multiaddr.parse(f"/ip4/127.0.0.1/tcp/4001/p2p/{ALICE.peer_id}").to_bytes()


@FUZZ
@given(junk_or_mutation(VALID_ADDR))
def test_multiaddr_bytes(data):
    try:
        Multiaddr.from_bytes(data)
    except MultiaddrError:
        pass


@FUZZ
@given(st.text(max_size=80))
def test_multiaddr_text(text):
    try:
        Multiaddr.parse(text)
    except MultiaddrError:
        pass


VALID_PROPOSAL = encode_message("/multistream/1.0.0") + encode_message("/noise")


@FUZZ
@given(junk_or_mutation(VALID_PROPOSAL), st.integers(1, 50))
def test_multistream_listener(data, chunk):
    negotiator = ListenerNegotiator(["/noise", "/yamux/1.0.0"])
    try:
        for i in range(0, len(data), chunk):
            if negotiator.done:
                break
            negotiator.receive_data(data[i:i + chunk])
    except MultistreamError:
        pass


@FUZZ
@given(junk_or_mutation(VALID_PROPOSAL))
def test_multistream_dialer(data):
    try:
        DialerNegotiator(["/noise"]).receive_data(data)
    except MultistreamError:
        pass


def _handshake_messages() -> tuple[bytes, bytes, bytes]:
    a = NoiseHandshake(ALICE, True)
    b = NoiseHandshake(BOB, False)
    m1 = a.data_to_send()
    b.receive_data(m1)
    m2 = b.data_to_send()
    a.receive_data(m2)
    return m1, m2, a.data_to_send()


MSG1, MSG2, MSG3 = _handshake_messages()


@FUZZ
@given(junk_or_mutation(MSG1))
def test_noise_responder_message_1(data):
    try:
        NoiseHandshake(BOB, False).receive_data(data)
    except NoiseError:
        pass


@FUZZ
@given(junk_or_mutation(MSG2))
def test_noise_initiator_message_2(data):
    try:
        NoiseHandshake(ALICE, True, expected_peer=BOB.peer_id).receive_data(data)
    except NoiseError:
        pass


@FUZZ
@given(junk_or_mutation(MSG3))
def test_noise_responder_message_3(data):
    a = NoiseHandshake(ALICE, True)
    b = NoiseHandshake(BOB, False)
    b.receive_data(a.data_to_send())
    b.data_to_send()
    try:
        b.receive_data(data)
    except NoiseError:
        return
    assert not b.complete, "a message 3 not answering our message 2 cannot complete the handshake"


KEY = b"\x07" * 32
VALID_FRAMES = bytes(NoiseTransport(CipherState(KEY), CipherState(KEY)).encrypt(b"hello world" * 50))


@FUZZ
@given(junk_or_mutation(VALID_FRAMES))
def test_noise_transport_frames(data):
    transport = NoiseTransport(CipherState(b"\0" * 32), CipherState(KEY))
    try:
        plain = transport.receive_data(data)
    except NoiseError:
        return
    assert plain in (b"", b"hello world" * 50)


VALID_IDENTIFY = encode_identify(IdentifyInfo(
    public_key=ALICE.public_key_protobuf, listen_addrs=[Multiaddr.parse("/ip4/1.2.3.4/tcp/5")],
    protocols=["/ipfs/ping/1.0.0"], observed_addr=Multiaddr.parse("/ip4/5.6.7.8/tcp/9")))


@FUZZ
@given(junk_or_mutation(VALID_IDENTIFY))
def test_identify(data):
    try:
        info = decode_identify(data)
        _ = info.peer_id  # derives the peer id from the key: may raise IdentifyError
    except IdentifyError:
        pass


@FUZZ
@given(st.binary(min_size=32, max_size=32), st.binary(max_size=40))
def test_ping_reply(sent, received):
    try:
        check_pong(sent, received)
    except PingError:
        assert sent != received
    else:
        assert sent == received


def test_all_error_types_are_protocol_errors():
    for exc in (VarintError, ProtobufError, MultiaddrError, MultistreamError, NoiseError, IdentifyError, PingError):
        assert issubclass(exc, ProtocolError)


def test_identify_round_trip():
    info = decode_identify(VALID_IDENTIFY)
    assert info.peer_id == ALICE.peer_id
    assert [str(a) for a in info.listen_addrs] == ["/ip4/1.2.3.4/tcp/5"]
    assert info.protocols == ["/ipfs/ping/1.0.0"] and str(info.observed_addr) == "/ip4/5.6.7.8/tcp/9"
    assert info.agent_version == "dekube/0.1.0"
    assert decode_identify(VALID_IDENTIFY[1:]).peer_id == ALICE.peer_id  # unprefixed legacy form
