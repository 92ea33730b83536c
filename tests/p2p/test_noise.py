"""libp2p noise: handshake checked against the `noiseprotocol` reference implementation,
identity verification, tampering, and transport framing."""
import nacl.bindings
import pytest
from noise.connection import Keypair, NoiseConnection

from node.identity import Identity
from node.p2p.noise import (
    MAX_PLAINTEXT,
    TAG_LEN,
    CipherState,
    NoiseError,
    NoiseHandshake,
    NoiseTransport,
    PeerIdMismatch,
    encode_handshake_payload,
    generate_static_keypair,
    verify_handshake_payload,
)

ALICE = Identity.from_seed(b"\xaa" * 32)
BOB = Identity.from_seed(b"\xbb" * 32)


def frame(msg: bytes) -> bytes:
    return len(msg).to_bytes(2, "big") + msg


def reference(initiator: bool, static_private: bytes) -> NoiseConnection:
    conn = NoiseConnection.from_name(b"Noise_XX_25519_ChaChaPoly_SHA256")
    conn.set_keypair_from_private_bytes(Keypair.STATIC, static_private)
    conn.set_as_initiator() if initiator else conn.set_as_responder()
    conn.start_handshake()
    return conn


def run_pair(a: NoiseHandshake, b: NoiseHandshake) -> None:
    for _ in range(4):
        out = a.data_to_send()
        if out:
            b.receive_data(out)
        out = b.data_to_send()
        if out:
            a.receive_data(out)


def test_initiator_against_reference_responder():
    ours = NoiseHandshake(ALICE, True, expected_peer=BOB.peer_id)
    priv, pub = generate_static_keypair()
    ref = reference(False, priv)
    ref.read_message(ours.data_to_send()[2:])
    ours.receive_data(frame(ref.write_message(encode_handshake_payload(BOB, pub))))
    payload = ref.read_message(ours.data_to_send()[2:])
    assert ours.complete and ours.remote_peer == BOB.peer_id
    assert verify_handshake_payload(payload, ours._s_pub) == ALICE.peer_id
    transport = NoiseTransport(ours.send_cipher, ours.recv_cipher)
    data = bytes(range(256)) * 600  # spans several frames
    wire, got, pos = transport.encrypt(data), b"", 0
    while pos < len(wire):
        n = int.from_bytes(wire[pos:pos + 2], "big")
        assert n <= 65535
        got += ref.decrypt(bytes(wire[pos + 2:pos + 2 + n]))
        pos += 2 + n
    assert got == data
    assert transport.receive_data(frame(ref.encrypt(b"pong"))) == b"pong"


def test_responder_against_reference_initiator():
    ours = NoiseHandshake(BOB, False)
    priv, pub = generate_static_keypair()
    ref = reference(True, priv)
    ours.receive_data(frame(ref.write_message(b"")))
    payload = ref.read_message(ours.data_to_send()[2:])
    assert verify_handshake_payload(payload, ours._s_pub) == BOB.peer_id
    ours.receive_data(frame(ref.write_message(encode_handshake_payload(ALICE, pub))))
    assert ours.complete and ours.remote_peer == ALICE.peer_id
    transport = NoiseTransport(ours.send_cipher, ours.recv_cipher)
    assert transport.receive_data(frame(ref.encrypt(b"hello"))) == b"hello"
    wire = transport.encrypt(b"world")
    assert ref.decrypt(bytes(wire[2:])) == b"world"


def test_pair_and_transport_both_ways_with_partial_feeds():
    a = NoiseHandshake(ALICE, True, expected_peer=BOB.peer_id)
    b = NoiseHandshake(BOB, False)
    run_pair(a, b)
    assert a.complete and b.complete
    assert a.remote_peer == BOB.peer_id and b.remote_peer == ALICE.peer_id
    ta = NoiseTransport(a.send_cipher, a.recv_cipher)
    tb = NoiseTransport(b.send_cipher, b.recv_cipher)
    data = bytes(range(251)) * 1000
    wire = bytes(ta.encrypt(data))
    got = b"".join(bytes(tb.receive_data(wire[i:i + 7777])) for i in range(0, len(wire), 7777))
    assert got == data
    assert tb.encrypt(b"") == b""
    assert ta.receive_data(bytes(tb.encrypt(b"x" * (MAX_PLAINTEXT + 1)))) == b"x" * (MAX_PLAINTEXT + 1)


def test_peer_id_mismatch_detected():
    a = NoiseHandshake(ALICE, True, expected_peer=Identity.generate().peer_id)
    b = NoiseHandshake(BOB, False)
    with pytest.raises(PeerIdMismatch):
        run_pair(a, b)


def test_signature_over_wrong_static_key_rejected():
    priv, pub = generate_static_keypair()
    _, other_pub = generate_static_keypair()
    with pytest.raises(NoiseError):
        verify_handshake_payload(encode_handshake_payload(BOB, other_pub), pub)
    with pytest.raises(NoiseError):
        verify_handshake_payload(b"\x0a\x01", pub)
    with pytest.raises(NoiseError):
        verify_handshake_payload(b"", pub)


@pytest.mark.parametrize("flip_at", [0, 40, 70, 100])
def test_tampered_message_2_rejected(flip_at):
    a = NoiseHandshake(ALICE, True)
    b = NoiseHandshake(BOB, False)
    b.receive_data(a.data_to_send())
    msg2 = bytearray(b.data_to_send())
    msg2[2 + flip_at] ^= 1
    with pytest.raises(NoiseError):
        a.receive_data(bytes(msg2))


def test_tampered_or_replayed_transport_frame_rejected():
    a = NoiseHandshake(ALICE, True)
    b = NoiseHandshake(BOB, False)
    run_pair(a, b)
    ta = NoiseTransport(a.send_cipher, a.recv_cipher)
    tb = NoiseTransport(b.send_cipher, b.recv_cipher)
    frame1 = bytes(ta.encrypt(b"secret"))
    bad = bytearray(frame1)
    bad[5] ^= 0x80
    with pytest.raises(NoiseError):
        NoiseTransport(CipherState(b.recv_cipher.key), CipherState(b"\0" * 32)).receive_data(bytes(bad))
    assert tb.receive_data(frame1) == b"secret"
    with pytest.raises(NoiseError):
        tb.receive_data(frame1)  # replay: the nonce moved on
    with pytest.raises(NoiseError):
        tb.receive_data(b"\x00\x05abcde")  # shorter than the MAC


def test_short_and_unexpected_handshake_messages():
    with pytest.raises(NoiseError):
        NoiseHandshake(BOB, False).receive_data(frame(b"short"))
    a = NoiseHandshake(ALICE, True)
    with pytest.raises(NoiseError):
        a.receive_data(frame(b"\x01" * 40))
    b = NoiseHandshake(BOB, False)
    b.receive_data(NoiseHandshake(ALICE, True).data_to_send())
    with pytest.raises(NoiseError):
        b.receive_data(frame(b"\x00" * 20))


def test_low_order_point_rejected():
    b = NoiseHandshake(BOB, False)
    with pytest.raises(NoiseError):
        b.receive_data(frame(b"\x00" * 32))


def test_transport_frames_match_libsodium_and_reassemble_across_chunks():
    key = b"\x33" * 32
    sender = NoiseTransport(CipherState(key), CipherState(b"\0" * 32))
    receiver = NoiseTransport(CipherState(b"\0" * 32), CipherState(key))
    data = bytes(range(256)) * 2000  # 512000 bytes: 8 frames, the last one partial
    wire = bytes(sender.encrypt(data))
    first = wire[2:2 + 65535]  # frame 0: nonce 0, the first MAX_PLAINTEXT bytes (libsodium as reference)
    assert first == nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(
        data[:65535 - 16], None, bytes(12), key)
    chunks = [wire[i:i + 100_001] for i in range(0, len(wire), 100_001)]
    got = b"".join([receiver.receive_chunks(chunks[:3]), receiver.receive_chunks(chunks[3:])])
    assert got == data


def test_encrypting_a_list_of_buffers_frames_them_without_joining():
    """Large buffers are framed where they lie, small ones (headers) gathered: the plaintext
    stream is the same as for the joined bytes, in about as many frames."""
    key = b"\x44" * 32
    payload = bytes(range(256)) * 1024  # 256 KiB: 4 full frames and a 68-byte tail
    parts = []
    for i in range(4):
        parts += [bytes([i]) * 12, memoryview(payload)]  # a yamux header, then a payload view
    parts += [b"", bytearray(b"window update"), b"ping" * 3]
    sender = NoiseTransport(CipherState(key), CipherState(b"\0" * 32))
    receiver = NoiseTransport(CipherState(b"\0" * 32), CipherState(key))
    wire = bytes(sender.encrypt(parts))
    frames, pos = 0, 0
    while pos < len(wire):
        pos += 2 + int.from_bytes(wire[pos:pos + 2], "big")
        frames += 1
    joined = b"".join(parts)
    assert bytes(receiver.receive_data(wire)) == joined
    assert frames == 4 * 4 + 5  # per payload 4 full frames; headers and tails share the 5 others
    assert len(wire) == len(joined) + frames * (2 + TAG_LEN)
    assert sender.encrypt([]) == sender.encrypt([b"", b""]) == b""


def test_bulk_reads_come_back_as_read_only_views_of_their_own_buffer():
    key = b"\x55" * 32
    sender = NoiseTransport(CipherState(key), CipherState(b"\0" * 32))
    receiver = NoiseTransport(CipherState(b"\0" * 32), CipherState(key))
    first = receiver.receive_data(bytes(sender.encrypt(b"a" * 100_000)))
    second = receiver.receive_data(bytes(sender.encrypt(b"b" * 100_000)))
    assert type(first) is memoryview and first.readonly and first == b"a" * 100_000  # not reused
    assert second == b"b" * 100_000
    assert type(receiver.receive_data(bytes(sender.encrypt(b"small")))) is bytes


def test_fixed_key_vector_matches_reference_byte_for_byte():
    """With every key fixed, our three handshake messages and transport keys equal the reference's."""
    s_i, e_i, s_r, e_r = (bytes([n]) * 32 for n in (1, 2, 3, 4))
    pub = nacl.bindings.crypto_scalarmult_base
    ours_i = NoiseHandshake(ALICE, True, BOB.peer_id, (s_i, pub(s_i)), ephemeral_private=e_i)
    ours_r = NoiseHandshake(BOB, False, None, (s_r, pub(s_r)), ephemeral_private=e_r)
    m1 = ours_i.data_to_send()
    ours_r.receive_data(m1)
    m2 = ours_r.data_to_send()
    ours_i.receive_data(m2)
    m3 = ours_i.data_to_send()
    ours_r.receive_data(m3)

    def ref(initiator, static, ephemeral):
        conn = NoiseConnection.from_name(b"Noise_XX_25519_ChaChaPoly_SHA256")
        conn.set_keypair_from_private_bytes(Keypair.STATIC, static)
        conn.set_keypair_from_private_bytes(Keypair.EPHEMERAL, ephemeral)
        conn.set_as_initiator() if initiator else conn.set_as_responder()
        conn.start_handshake()
        return conn

    ref_i, ref_r = ref(True, s_i, e_i), ref(False, s_r, e_r)
    r1 = ref_i.write_message(b"")
    ref_r.read_message(r1)
    r2 = ref_r.write_message(encode_handshake_payload(BOB, pub(s_r)))
    ref_i.read_message(r2)
    r3 = ref_i.write_message(encode_handshake_payload(ALICE, pub(s_i)))
    ref_r.read_message(r3)
    assert (m1[2:], m2[2:], m3[2:]) == (r1, r2, r3)
    assert m1[:2] == len(r1).to_bytes(2, "big")
    transport = NoiseTransport(ours_i.send_cipher, ours_i.recv_cipher)
    wire = transport.encrypt(b"vector")
    assert ref_r.decrypt(bytes(wire[2:])) == b"vector"
    assert ours_r.complete and ours_r.remote_peer == ALICE.peer_id
