"""The libp2p TLS certificate (node/p2p/tls_cert.py): ours verifies to our peer ID; expired, forged,
extension-less, duplicated-extension, critical-unknown and junk certificates are refused; and a
certificate made by py-libp2p's QUIC transport (an independent implementation) verifies to its
peer ID, and ours to py-libp2p's verifier."""
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node.identity import Identity
from node.p2p.tls_cert import (
    LIBP2P_EXTENSION_OID,
    SIGNATURE_PREFIX,
    CertificateError,
    decode_signed_key,
    encode_signed_key,
    make_certificate,
    verify_certificate,
)

NOW = datetime.datetime.now(datetime.UTC)


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def build(identity: Identity, *, extensions=None, signer=None, key=None, not_after=None, hash_alg=None,
          sign_spki_of=None):
    """A certificate like ours with one thing changed."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    spki_key = sign_spki_of or key
    spki = spki_key.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    signed = encode_signed_key((signer or identity).public_key_protobuf,
                               (signer or identity).sign(SIGNATURE_PREFIX + spki))
    if signer is not None:  # claim identity's key, signed by someone else
        signed = encode_signed_key(identity.public_key_protobuf, signer.sign(SIGNATURE_PREFIX + spki))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(1).not_valid_before(NOW - datetime.timedelta(hours=1))
               .not_valid_after(not_after or NOW + datetime.timedelta(days=1)))
    for ext, critical in (extensions if extensions is not None
                          else [(x509.UnrecognizedExtension(LIBP2P_EXTENSION_OID, signed), True)]):
        builder = builder.add_extension(ext, critical=critical)
    return der(builder.sign(key, hash_alg or hashes.SHA256()))


def test_our_certificate_verifies_to_our_peer_id():
    identity = Identity.generate()
    cert, key = make_certificate(identity)
    assert verify_certificate(der(cert)) == identity.peer_id
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert build(identity) and verify_certificate(build(identity)) == identity.peer_id


def test_expired_and_not_yet_valid_refused():
    identity = Identity.generate()
    cert, _ = make_certificate(identity, validity=datetime.timedelta(minutes=5))
    with pytest.raises(CertificateError, match="not valid at this time"):
        verify_certificate(der(cert), now=NOW + datetime.timedelta(hours=1))
    with pytest.raises(CertificateError, match="not valid at this time"):
        verify_certificate(der(cert), now=NOW - datetime.timedelta(hours=2))


def test_signature_by_another_key_refused():
    victim, attacker = Identity.generate(), Identity.generate()
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(build(victim, signer=attacker))


def test_signature_over_another_certificate_key_refused():
    """A SignedKey lifted from another certificate (signing a different SPKI) does not transfer."""
    identity = Identity.generate()
    with pytest.raises(CertificateError, match="does not verify"):
        verify_certificate(build(identity, sign_spki_of=ec.generate_private_key(ec.SECP256R1())))


def test_self_signature_must_verify():
    identity = Identity.generate()
    good = bytearray(build(identity))
    good[-5] ^= 0x01  # inside the certificate's ECDSA signature
    with pytest.raises(CertificateError):
        verify_certificate(bytes(good))


def test_missing_duplicated_and_critical_unknown_extensions_refused():
    identity = Identity.generate()
    with pytest.raises(CertificateError, match="lacks the libp2p"):
        verify_certificate(build(identity, extensions=[]))
    spki_key = ec.generate_private_key(ec.SECP256R1())
    signed = encode_signed_key(identity.public_key_protobuf, identity.sign(
        SIGNATURE_PREFIX + spki_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)))
    ext = x509.UnrecognizedExtension(LIBP2P_EXTENSION_OID, signed)
    # two libp2p extensions: cryptography's builder refuses that, so write a look-alike OID of the same
    # length and patch its last arc in the DER
    twin = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.2"), signed)
    raw = build(identity, key=spki_key, extensions=[(ext, False), (twin, False)])
    twin_oid = bytes.fromhex("060a2b0601040183a25a0102")
    assert raw.count(twin_oid) == 1
    with pytest.raises(CertificateError, match="repeats"):
        verify_certificate(raw.replace(twin_oid, twin_oid[:-1] + b"\x01"))
    other = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), b"\x05\x00")
    with pytest.raises(CertificateError, match="critical extension"):
        verify_certificate(build(identity, key=spki_key, extensions=[(ext, False), (other, True)]))
    # a non-critical unknown extension is ignored, and a non-critical libp2p extension is fine
    assert verify_certificate(build(identity, key=spki_key,
                                    extensions=[(ext, False), (other, False)])) == identity.peer_id


def test_weak_hash_refused():
    identity = Identity.generate()
    with pytest.raises(CertificateError, match="weak"):
        verify_certificate(build(identity, hash_alg=hashes.SHA224()))


@pytest.mark.parametrize("junk", [b"", b"\x30", b"\x30\x82\xff\xff" + b"\x00" * 10, b"\x00" * 100,
                                  b"\x30" * 20000, "text"])
def test_junk_refused(junk):
    with pytest.raises(CertificateError):
        verify_certificate(junk)  # type: ignore[arg-type]


def test_signed_key_codec_round_trip_and_malformed():
    pk, sig = b"\x08\x01\x12\x20" + b"k" * 32, b"s" * 64
    assert decode_signed_key(encode_signed_key(pk, sig)) == (pk, sig)
    long_sig = b"s" * 300  # two-byte DER length
    assert decode_signed_key(encode_signed_key(pk, long_sig)) == (pk, long_sig)
    good = encode_signed_key(pk, sig)
    for bad in (good + b"\x00", good[:-1], b"\x31" + good[1:], b"\x30\x81\x05" + good[2:7],
                b"\x30\x03\x03\x01\x00", b"\x30" + b"\x80" + good[2:]):
        with pytest.raises(CertificateError):
            decode_signed_key(bad)


def _pylibp2p():
    pytest.importorskip("libp2p.transport.quic.security", reason="py-libp2p with QUIC not installed")
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.transport.quic.security import CertificateGenerator, PeerAuthenticator
    return create_new_key_pair, ID, CertificateGenerator, PeerAuthenticator


def test_pylibp2p_certificate_verifies_here_and_ours_there():
    """Interop vectors made live: py-libp2p (an independent implementation) writes a certificate we
    verify to its peer ID, and its verifier accepts ours with our peer ID."""
    create_new_key_pair, ID, CertificateGenerator, PeerAuthenticator = _pylibp2p()
    pair = create_new_key_pair()
    peer_id = ID.from_pubkey(pair.public_key)
    theirs = CertificateGenerator().generate_certificate(pair.private_key, peer_id)
    assert verify_certificate(der(theirs.certificate)) == peer_id.to_base58()

    identity = Identity.generate()
    ours, _ = make_certificate(identity)
    assert PeerAuthenticator().verify_peer_certificate(ours).to_base58() == identity.peer_id
