"""Commit certificates (the precommits that committed a block) as bytes: the block's ``last_commit``
and the validator's stored certificates. A canonical list of encoded votes."""
from __future__ import annotations

from consensus.encoding import EncodingError, decode, encode
from consensus.messages import MessageError, Vote, decode_vote, encode_vote

MAX_CERTIFICATE_BYTES = 1024 * 1024


class CertificateError(ValueError):
    """Bytes that are not an encoded commit certificate."""


def encode_certificate(votes) -> bytes:
    return encode([encode_vote(vote) for vote in votes])


def decode_certificate(data: bytes) -> tuple[Vote, ...]:
    try:
        items = decode(data, max_size=MAX_CERTIFICATE_BYTES)
    except EncodingError as exc:
        raise CertificateError(f"malformed certificate: {exc}") from None
    if type(items) is not list or not all(type(item) is bytes for item in items):
        raise CertificateError("a certificate is a list of encoded votes")
    try:
        return tuple(decode_vote(item) for item in items)
    except MessageError as exc:
        raise CertificateError(f"malformed vote in certificate: {exc}") from None
