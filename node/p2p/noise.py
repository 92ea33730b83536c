"""libp2p ``/noise``: Noise_XX_25519_ChaChaPoly_SHA256 handshake and transport framing, sans-I/O.

Follows the libp2p noise spec: empty prologue; every message (handshake and transport) is a
2-byte big-endian length followed by at most 65535 bytes; the handshake payload is the protobuf
``NoiseHandshakePayload{identity_key=1, identity_sig=2, extensions=4}`` where ``identity_sig``
is the ed25519 signature over ``"noise-libp2p-static-key:" + static X25519 public key``. The
initiator's first message carries no payload; the responder sends its payload in message 2,
the initiator in message 3. ChaChaPoly nonces are 4 zero bytes then the 64-bit counter,
little-endian. Transport messages are encrypted and decrypted straight into caller buffers
(``chachapoly``: OpenSSL through ``cryptography``) to keep the hot path free of copies.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Sequence
from typing import cast

import nacl.bindings
import nacl.exceptions
import nacl.utils

from node.identity import (
    Identity,
    InvalidPeerId,
    peer_id_from_public_key,
    public_key_from_protobuf,
    verify,
)

from .chachapoly import AuthenticationFailed, ChaChaPoly
from .errors import ProtocolError
from .protobuf import ProtobufError, decode_fields, field_bytes, single_bytes_field

BytesLike = bytes | bytearray | memoryview


PROTOCOL_ID = "/noise"
PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_SHA256"
SIGNATURE_PREFIX = b"noise-libp2p-static-key:"
MAX_MESSAGE = 65535
TAG_LEN = 16
MAX_PLAINTEXT = MAX_MESSAGE - TAG_LEN
DH_LEN = 32
_MAX_NONCE = (1 << 64) - 1
_NONCE = struct.Struct("<4xQ")
_LEN = struct.Struct(">H")
SMALL_READ_BYTES = 16 * 1024  # decrypted reads up to this size are returned as bytes
# encrypt(): buffers shorter than this are gathered (copied) into shared frames; longer ones are
# encrypted in place (a frame costs about as much CPU as copying a few KiB)
GATHER_BELOW = 4096


class NoiseError(ProtocolError):
    """Handshake or transport message failed: bad framing, bad MAC, bad identity."""


class PeerIdMismatch(NoiseError):
    """The remote proved an identity other than the one we dialed."""


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    temp = hmac.new(chaining_key, ikm, hashlib.sha256).digest()
    out1 = hmac.new(temp, b"\x01", hashlib.sha256).digest()
    out2 = hmac.new(temp, out1 + b"\x02", hashlib.sha256).digest()
    return out1, out2


def _dh(private: bytes, public: bytes) -> bytes:
    try:
        return nacl.bindings.crypto_scalarmult(private, public)
    except (nacl.exceptions.RuntimeError, nacl.exceptions.CryptoError, nacl.exceptions.TypeError) as exc:
        raise NoiseError("invalid X25519 public key") from exc


class _HandshakeCipher:
    """Handshake-phase CipherState: small messages with the handshake hash as associated data."""

    __slots__ = ("key", "nonce", "_aead")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.nonce = 0
        self._aead = ChaChaPoly(key)

    def _next_nonce(self) -> bytes:
        n = self.nonce
        self.nonce = n + 1  # at most 2 messages per key in XX: never near exhaustion
        return _NONCE.pack(n)

    def encrypt(self, ad: bytes, plaintext: bytes) -> bytes:
        return self._aead.seal(self._next_nonce(), ad, bytes(plaintext))

    def decrypt(self, ad: bytes, ciphertext: bytes) -> bytes:
        if len(ciphertext) < TAG_LEN:
            raise NoiseError("ciphertext shorter than the MAC")
        nonce = self._next_nonce()
        try:
            return self._aead.open(nonce, ad, bytes(ciphertext))
        except AuthenticationFailed as exc:
            raise NoiseError("decryption failed (bad MAC)") from exc


class CipherState:
    """One direction of transport messages: ChaChaPoly with a 64-bit counter nonce.

    ``seal_into``/``open_into`` write into caller buffers (``chachapoly.ChaChaPoly``).
    """

    __slots__ = ("key", "nonce", "_aead")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.nonce = 0
        self._aead = ChaChaPoly(key)

    def _next_nonce(self) -> bytes:
        n = self.nonce
        if n >= _MAX_NONCE:
            raise NoiseError("nonce exhausted")
        self.nonce = n + 1
        return _NONCE.pack(n)

    def seal_into(self, src: memoryview, dst: memoryview) -> None:
        """Encrypt ``src`` into ``dst`` (exactly ``len(src) + 16`` bytes)."""
        self._aead.seal_into(self._next_nonce(), src, dst)

    def open_into(self, src: memoryview, dst: memoryview) -> None:
        """Decrypt ``src`` into ``dst`` (exactly ``len(src) - 16`` bytes); NoiseError on a bad tag."""
        if len(src) < TAG_LEN:
            raise NoiseError("transport message shorter than the MAC")
        try:
            self._aead.open_into(self._next_nonce(), src, dst)
        except AuthenticationFailed as exc:
            raise NoiseError("transport message failed authentication") from exc


class _SymmetricState:
    def __init__(self) -> None:
        self.h = PROTOCOL_NAME  # exactly 32 bytes = HASHLEN, used as is
        self.ck = self.h
        self.cipher: _HandshakeCipher | None = None
        self.mix_hash(b"")  # empty prologue

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, key = _hkdf2(self.ck, ikm)
        self.cipher = _HandshakeCipher(key)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        out = self.cipher.encrypt(self.h, plaintext) if self.cipher else plaintext
        self.mix_hash(out)
        return out

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        out = self.cipher.decrypt(self.h, ciphertext) if self.cipher else ciphertext
        self.mix_hash(ciphertext)
        return out

    def split(self) -> tuple[CipherState, CipherState]:
        k1, k2 = _hkdf2(self.ck, b"")
        return CipherState(k1), CipherState(k2)


def generate_static_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair (private, public) for the noise static key."""
    private = nacl.utils.random(32)
    return private, nacl.bindings.crypto_scalarmult_base(private)


def encode_handshake_payload(identity: Identity, static_public: bytes) -> bytes:
    signature = identity.sign(SIGNATURE_PREFIX + static_public)
    return field_bytes(1, identity.public_key_protobuf) + field_bytes(2, signature)


def verify_handshake_payload(payload: bytes, remote_static: bytes) -> str:
    """Check the remote's signed payload against its static key; return its peer ID."""
    try:
        fields = decode_fields(payload)
        key_proto = single_bytes_field(fields, 1)
        signature = single_bytes_field(fields, 2)
    except ProtobufError as exc:
        raise NoiseError(f"malformed handshake payload: {exc}") from exc
    if key_proto is None or signature is None:
        raise NoiseError("handshake payload lacks identity_key or identity_sig")
    try:
        public_key = public_key_from_protobuf(key_proto)
    except InvalidPeerId as exc:
        raise NoiseError(f"unsupported identity key: {exc}") from exc
    if not verify(public_key, SIGNATURE_PREFIX + remote_static, signature):
        raise NoiseError("identity signature over the noise static key does not verify")
    return peer_id_from_public_key(public_key)


class NoiseHandshake:
    """The XX handshake for one connection; feed bytes, send bytes, read the outcome.

    When ``complete`` is True: ``remote_peer`` is the verified peer ID, ``send_cipher`` and
    ``recv_cipher`` are the transport CipherStates and ``unused`` holds bytes received after
    the last handshake message (already transport frames).
    """

    def __init__(self, identity: Identity, is_initiator: bool, expected_peer: str | None = None,
                 static_keypair: tuple[bytes, bytes] | None = None,
                 ephemeral_private: bytes | None = None) -> None:
        """``ephemeral_private`` fixes the ephemeral key (test vectors only); normally random."""
        self._identity = identity
        self.is_initiator = is_initiator
        self._expected_peer = expected_peer
        self._s_priv, self._s_pub = static_keypair or generate_static_keypair()
        if ephemeral_private is None:
            self._e_priv, self._e_pub = generate_static_keypair()
        else:
            self._e_priv, self._e_pub = ephemeral_private, nacl.bindings.crypto_scalarmult_base(ephemeral_private)
        self._re = b""
        self._rs = b""
        self._ss = _SymmetricState()
        self._buf = bytearray()
        self._out = bytearray()
        self._step = 0  # messages processed (sent + received)
        self.complete = False
        self.remote_peer: str | None = None
        self.send_cipher: CipherState | None = None
        self.recv_cipher: CipherState | None = None
        self.unused = b""
        if is_initiator:
            self._write_message_1()

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def transport(self) -> tuple[NoiseTransport, str]:
        """The transport framing and the verified remote peer ID, once ``complete``."""
        if not self.complete or self.send_cipher is None or self.recv_cipher is None or self.remote_peer is None:
            raise NoiseError("handshake not complete")
        return NoiseTransport(self.send_cipher, self.recv_cipher), self.remote_peer

    def receive_data(self, data: bytes) -> None:
        if self.complete:
            raise NoiseError("handshake already complete")
        self._buf += data
        while not self.complete and len(self._buf) >= 2:
            (length,) = _LEN.unpack_from(self._buf)
            if len(self._buf) < 2 + length:
                return
            message = bytes(self._buf[2:2 + length])
            del self._buf[:2 + length]
            self._on_message(message)
        if self.complete:
            self.unused = bytes(self._buf)
            self._buf.clear()

    def _send(self, message: bytes) -> None:
        self._out += _LEN.pack(len(message)) + message
        self._step += 1

    def _on_message(self, message: bytes) -> None:
        if self.is_initiator and self._step == 1:
            self._read_message_2(message)
            self._write_message_3()
            self._finish()
        elif not self.is_initiator and self._step == 0:
            self._read_message_1(message)
            self._write_message_2()
        elif not self.is_initiator and self._step == 2:
            self._read_message_3(message)
            self._finish()
        else:
            raise NoiseError("unexpected handshake message")

    def _write_message_1(self) -> None:
        ss = self._ss
        ss.mix_hash(self._e_pub)
        self._send(self._e_pub + ss.encrypt_and_hash(b""))

    def _read_message_1(self, message: bytes) -> None:
        if len(message) < DH_LEN:
            raise NoiseError("handshake message 1 too short")
        ss = self._ss
        self._re = message[:DH_LEN]
        ss.mix_hash(self._re)
        ss.decrypt_and_hash(message[DH_LEN:])  # no key yet: plaintext early data, ignored
        self._step += 1

    def _write_message_2(self) -> None:
        ss = self._ss
        ss.mix_hash(self._e_pub)
        ss.mix_key(_dh(self._e_priv, self._re))
        encrypted_s = ss.encrypt_and_hash(self._s_pub)
        ss.mix_key(_dh(self._s_priv, self._re))
        payload = ss.encrypt_and_hash(encode_handshake_payload(self._identity, self._s_pub))
        self._send(self._e_pub + encrypted_s + payload)

    def _read_message_2(self, message: bytes) -> None:
        if len(message) < DH_LEN + DH_LEN + TAG_LEN + TAG_LEN:
            raise NoiseError("handshake message 2 too short")
        ss = self._ss
        self._re = message[:DH_LEN]
        ss.mix_hash(self._re)
        ss.mix_key(_dh(self._e_priv, self._re))
        self._rs = ss.decrypt_and_hash(message[DH_LEN:DH_LEN + DH_LEN + TAG_LEN])
        ss.mix_key(_dh(self._e_priv, self._rs))
        payload = ss.decrypt_and_hash(message[DH_LEN + DH_LEN + TAG_LEN:])
        self._accept_remote(payload)
        self._step += 1

    def _write_message_3(self) -> None:
        ss = self._ss
        encrypted_s = ss.encrypt_and_hash(self._s_pub)
        ss.mix_key(_dh(self._s_priv, self._re))
        payload = ss.encrypt_and_hash(encode_handshake_payload(self._identity, self._s_pub))
        self._send(encrypted_s + payload)

    def _read_message_3(self, message: bytes) -> None:
        if len(message) < DH_LEN + TAG_LEN + TAG_LEN:
            raise NoiseError("handshake message 3 too short")
        ss = self._ss
        self._rs = ss.decrypt_and_hash(message[:DH_LEN + TAG_LEN])
        ss.mix_key(_dh(self._e_priv, self._rs))
        payload = ss.decrypt_and_hash(message[DH_LEN + TAG_LEN:])
        self._accept_remote(payload)
        self._step += 1

    def _accept_remote(self, payload: bytes) -> None:
        peer = verify_handshake_payload(payload, self._rs)
        if self._expected_peer is not None and peer != self._expected_peer:
            raise PeerIdMismatch(f"dialed {self._expected_peer} but remote is {peer}")
        self.remote_peer = peer

    def _finish(self) -> None:
        c1, c2 = self._ss.split()
        self.send_cipher, self.recv_cipher = (c1, c2) if self.is_initiator else (c2, c1)
        self.complete = True
        self._e_priv = b""


class NoiseTransport:
    """Transport-phase framing: plaintext in, framed ciphertext out, and the reverse.

    ``encrypt`` takes one buffer or a sequence of them (a muxer's headers and payloads) and
    returns all their frames as one buffer, without joining the plaintext first: large buffers
    are encrypted where they lie, small ones (headers, control frames, short tails) are gathered
    into shared frames. ``receive_data``/``receive_chunks`` buffer a partial frame and return the
    decrypted plaintext of all complete frames at once.
    """

    def __init__(self, send_cipher: CipherState, recv_cipher: CipherState) -> None:
        self._send = send_cipher
        self._recv = recv_cipher
        self._partial = bytearray()

    @staticmethod
    def _segments(parts: Sequence[BytesLike]) -> list[BytesLike]:
        """Contiguous plaintext pieces to frame one after the other: buffers of at least
        ``GATHER_BELOW`` bytes as they are (their last partial frame gathered with what follows
        when short), runs of smaller ones joined."""
        segments: list[BytesLike] = []
        small: list[BytesLike] = []
        for part in parts:
            size = len(part)
            if size < GATHER_BELOW:
                if size:
                    small.append(part)
                continue
            if small:
                segments.append(small[0] if len(small) == 1 else b"".join(small))
                small = []
            tail = size % MAX_PLAINTEXT
            if 0 < tail < GATHER_BELOW:
                view = memoryview(part)
                segments.append(view[:size - tail])
                small.append(view[size - tail:])
            else:
                segments.append(part)
        if small:
            segments.append(small[0] if len(small) == 1 else b"".join(small))
        return segments

    def encrypt(self, data: BytesLike | Sequence[BytesLike]) -> bytearray:
        """Frames for ``data``: a bytes-like object, or a list/tuple of them sent in order."""
        if isinstance(data, (list, tuple)):
            segments = self._segments(data)
        else:  # one buffer (any bytes-like object, not only the three BytesLike types)
            segments = [cast(BytesLike, data)]
        plain = 0
        frames = 0
        for segment in segments:
            size = len(segment)
            plain += size
            frames += -(-size // MAX_PLAINTEXT)
        out = bytearray(plain + frames * (2 + TAG_LEN))
        seal = self._send.seal_into
        pack_len = _LEN.pack_into
        offset = 0
        with memoryview(out) as dst:
            for segment in segments:
                total = len(segment)
                pos = 0
                with memoryview(segment) as src:
                    while pos < total:
                        n = total - pos if total - pos < MAX_PLAINTEXT else MAX_PLAINTEXT
                        pack_len(out, offset, n + TAG_LEN)
                        offset += 2
                        seal(src[pos:pos + n], dst[offset:offset + n + TAG_LEN])
                        offset += n + TAG_LEN
                        pos += n
        return out

    def receive_data(self, data: BytesLike) -> bytes | memoryview:
        """Decrypt every complete frame in ``data`` (plus any buffered partial frame)."""
        return self.receive_chunks((data,))

    def receive_chunks(self, chunks: Iterable[BytesLike]) -> bytes | memoryview:
        """Decrypt the complete frames in a sequence of received chunks, in order.

        Frames are decrypted in place from each chunk; only a frame split across chunks is
        copied (into ``_partial``). Small results come back as bytes; bulk ones (more than
        ``SMALL_READ_BYTES``) as a read-only memoryview over a buffer of their own, which the
        caller may slice and keep without copying (nothing here reuses it).
        """
        total = sum(len(c) for c in chunks) + len(self._partial)
        out = bytearray(total)
        open_into = self._recv.open_into
        unpack_len = _LEN.unpack_from
        written = 0
        with memoryview(out) as dst:
            for chunk in chunks:
                end = len(chunk)
                pos = 0
                partial = self._partial
                if partial:
                    if len(partial) < 2:
                        pos = 2 - len(partial) if end >= 2 - len(partial) else end
                        partial += chunk[:pos]
                        if len(partial) < 2:
                            continue
                    need = 2 + ((partial[0] << 8) | partial[1]) - len(partial)
                    take = need if need <= end - pos else end - pos
                    partial += memoryview(chunk)[pos:pos + take]
                    pos += take
                    if take < need:
                        continue
                    n = len(partial) - 2 - TAG_LEN
                    with memoryview(partial) as frame:
                        open_into(frame[2:], dst[written:written + n])
                    written += n
                    self._partial = bytearray()
                with memoryview(chunk) as src:
                    while end - pos >= 2:
                        (length,) = unpack_len(chunk, pos)
                        if end - pos - 2 < length:
                            break
                        n = length - TAG_LEN
                        if n < 0:
                            raise NoiseError("transport message shorter than the MAC")
                        open_into(src[pos + 2:pos + 2 + length], dst[written:written + n])
                        written += n
                        pos += 2 + length
                    if pos < end:
                        self._partial = bytearray(src[pos:])
            if not written:
                return b""
            if written <= SMALL_READ_BYTES:
                return bytes(dst[:written])
        return memoryview(out).toreadonly()[:written]
