"""The libp2p TLS certificate (libp2p/specs tls/tls.md): make one for our identity, verify a peer's.

A host presents a self-signed X.509 certificate over an ephemeral P-256 key. The certificate
carries the libp2p Public Key Extension (OID 1.3.6.1.4.1.53594.1.1): the DER ``SignedKey ::=
SEQUENCE { publicKey OCTET STRING, signature OCTET STRING }`` where ``publicKey`` is the host's
protobuf ``PublicKey`` (ed25519 here) and ``signature`` is the host key's signature over
``"libp2p-tls-handshake:" + SubjectPublicKeyInfo`` of the certificate key. (The spec's ASN.1 says
BIT STRING; go-, rust-, js- and py-libp2p all write OCTET STRING, which is what interoperates.)

``verify_certificate`` checks a peer's DER certificate with bounded work (size cap before
parsing) and returns the peer ID it proves: valid now, self-signature valid with a hash of at least
256 bits, exactly one libp2p extension, no other critical extension, the SignedKey well formed and
its signature good. Any failure raises ``CertificateError``. Used by node/p2p/quic_transport.py.
"""
from __future__ import annotations

import datetime
import os

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from node.identity import Identity, InvalidPeerId, peer_id_from_public_key, public_key_from_protobuf, verify

from .errors import ProtocolError

LIBP2P_EXTENSION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.1")
SIGNATURE_PREFIX = b"libp2p-tls-handshake:"
MAX_CERTIFICATE_BYTES = 16 * 1024   # ours is ~450 bytes; refuse anything large before parsing
MAX_SIGNED_KEY_BYTES = 2048
CERT_VALIDITY = datetime.timedelta(days=365 * 100)  # ephemeral key, new per host start
CLOCK_SKEW = datetime.timedelta(hours=1)             # not_before is back-dated by this much
_STRONG_HASHES = (hashes.SHA256, hashes.SHA384, hashes.SHA512)


class CertificateError(ProtocolError):
    """A peer's certificate does not prove a libp2p identity."""


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(body)) + body


def encode_signed_key(public_key_protobuf: bytes, signature: bytes) -> bytes:
    """DER ``SEQUENCE { OCTET STRING, OCTET STRING }``."""
    return _der(0x30, _der(0x04, public_key_protobuf) + _der(0x04, signature))


def _read_tlv(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """One DER TLV with ``tag`` at ``pos``: (value, position after it). Definite lengths, minimal form."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise CertificateError(f"SignedKey: expected DER tag {tag:#x}")
    first = data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 2 or pos + count > len(data):
            raise CertificateError("SignedKey: bad DER length")
        length = int.from_bytes(data[pos:pos + count], "big")
        if length < 0x80 or (count == 2 and length < 0x100):
            raise CertificateError("SignedKey: non-minimal DER length")
        pos += count
    if pos + length > len(data):
        raise CertificateError("SignedKey: DER value runs past the end")
    return data[pos:pos + length], pos + length


def decode_signed_key(data: bytes) -> tuple[bytes, bytes]:
    """(public key protobuf, signature) from a DER SignedKey; CertificateError if malformed."""
    if len(data) > MAX_SIGNED_KEY_BYTES:
        raise CertificateError("SignedKey too large")
    body, end = _read_tlv(data, 0, 0x30)
    if end != len(data):
        raise CertificateError("SignedKey: trailing bytes")
    public_key, pos = _read_tlv(body, 0, 0x04)
    signature, pos = _read_tlv(body, pos, 0x04)
    if pos != len(body):
        raise CertificateError("SignedKey: trailing bytes in the sequence")
    return public_key, signature


def make_certificate(identity: Identity, *, now: datetime.datetime | None = None,
                     validity: datetime.timedelta = CERT_VALIDITY
                     ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A fresh P-256 key and the self-signed certificate binding it to ``identity``."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    spki = key.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    signed_key = encode_signed_key(identity.public_key_protobuf, identity.sign(SIGNATURE_PREFIX + spki))
    name = x509.Name([x509.NameAttribute(NameOID.SERIAL_NUMBER, os.urandom(8).hex())])
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + validity)
            .add_extension(x509.UnrecognizedExtension(LIBP2P_EXTENSION_OID, signed_key), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def verify_certificate(der: bytes, *, now: datetime.datetime | None = None) -> str:
    """The peer ID a peer's DER certificate proves; CertificateError when it proves none."""
    if not isinstance(der, (bytes, bytearray)) or len(der) > MAX_CERTIFICATE_BYTES:
        raise CertificateError("certificate missing or too large")
    try:
        cert = x509.load_der_x509_certificate(bytes(der))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CertificateError(f"certificate does not parse: {exc}") from None
    return verify_loaded_certificate(cert, now=now)


def verify_loaded_certificate(cert: x509.Certificate, *, now: datetime.datetime | None = None) -> str:
    """``verify_certificate`` for an already parsed certificate (what the TLS stack hands over)."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise CertificateError("certificate not valid at this time")
        algorithm = cert.signature_hash_algorithm
        public = cert.public_key()
        if not isinstance(public, (ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey)):
            raise CertificateError("certificate key type not supported (need ECDSA or Ed25519)")
        if isinstance(public, ec.EllipticCurvePublicKey) and not isinstance(algorithm, _STRONG_HASHES):
            raise CertificateError("certificate signed with a weak or missing hash")
        extensions = cert.extensions  # raises DuplicateExtension for a repeated OID
        ours = [ext for ext in extensions if ext.oid == LIBP2P_EXTENSION_OID]
        if len(ours) != 1:
            raise CertificateError("certificate lacks the libp2p public key extension")
        if any(ext.critical and ext.oid != LIBP2P_EXTENSION_OID for ext in extensions):
            raise CertificateError("certificate has a critical extension we do not understand")
        cert.verify_directly_issued_by(cert)
        value = ours[0].value
        assert isinstance(value, x509.UnrecognizedExtension)
        public_key_protobuf, signature = decode_signed_key(value.value)
        host_key = public_key_from_protobuf(public_key_protobuf)
        spki = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except CertificateError:
        raise
    except InvalidPeerId as exc:
        raise CertificateError(f"certificate host key: {exc}") from None
    except x509.DuplicateExtension:
        raise CertificateError("certificate repeats an extension") from None
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm) as exc:
        raise CertificateError(f"certificate invalid: {exc!r}") from None
    if not verify(host_key, SIGNATURE_PREFIX + spki, signature):
        raise CertificateError("libp2p extension signature does not verify")
    return peer_id_from_public_key(host_key)
