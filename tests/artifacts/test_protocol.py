"""The wire protocol: codec, and a serving node facing malformed, oversized and wrong messages, and
a downloader facing holders that send wrong manifests, oversized frames or unrequested chunks."""
import asyncio
import os
import struct

import pytest

from node.artifacts import CHUNK_SIZE, PROTOCOL, ArtifactError
from node.artifacts.protocol import (
    BAD_REQUEST,
    BUSY,
    NOT_FOUND,
    Chunk,
    Error,
    GetChunks,
    GetManifest,
    ManifestMsg,
    NoChunk,
    ProtocolViolation,
    chunk_header,
    decode,
    decode_body,
    decode_header,
    encode,
)

from .harness import artifact_peers

MB = CHUNK_SIZE
LIMIT = 2 * MB


@pytest.mark.parametrize("message", [GetManifest("ab" * 32), ManifestMsg(b"m" * 100), GetChunks("cd" * 32, 3, 9),
                                     Chunk(7, b"data"), NoChunk(4), Error(NOT_FOUND, "no such thing")])
def test_codec_round_trip(message):
    assert decode(encode(message), LIMIT) == message


def test_chunk_header_matches_encode():
    assert chunk_header(5, 4) + b"abcd" == encode(Chunk(5, b"abcd"))


def test_decoder_refuses_bad_frames():
    with pytest.raises(ProtocolViolation, match="exceeds"):
        decode_header(struct.pack(">IB", 1 << 31, 4), LIMIT)
    with pytest.raises(ProtocolViolation, match="empty"):
        decode_header(struct.pack(">IB", 0, 4), LIMIT)
    with pytest.raises(ProtocolViolation, match="unknown message type"):
        decode_header(struct.pack(">IB", 5, 99), LIMIT)
    with pytest.raises(ProtocolViolation):
        decode_header(b"\0\0", LIMIT)
    with pytest.raises(ProtocolViolation, match="32-byte id"):
        decode_body(1, b"short")
    with pytest.raises(ProtocolViolation):
        decode_body(3, b"x" * 39)
    with pytest.raises(ProtocolViolation):
        decode_body(4, b"ab")
    with pytest.raises(ProtocolViolation):
        decode_body(5, b"abcde")
    with pytest.raises(ProtocolViolation):
        decode_body(6, b"")
    with pytest.raises(ProtocolViolation, match="does not match"):
        decode(encode(NoChunk(1)) + b"x", LIMIT)


async def exchange(host, peer, frames: bytes):
    """Send raw ``frames`` on a new artifact stream; every message that comes back until EOF/reset."""
    stream = await host.open_stream(peer, PROTOCOL)
    await stream.write(frames)
    await stream.close()   # half-close: the holder answers what it got, then ends the stream
    out = []
    try:
        while True:
            header = await asyncio.wait_for(stream.readexactly(5), 10)
            kind, length = decode_header(header, LIMIT)
            out.append(decode_body(kind, await stream.readexactly(length)))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    return out


def run(coro, timeout=60):
    asyncio.run(asyncio.wait_for(coro, timeout))


def test_server_answers_bad_requests_without_harm(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2) as peers:
            (holder, service), (client, _) = peers
            data = os.urandom(2 * MB + 1)
            ident = await service.add_bytes(data)
            peer = holder.peer_id
            # unknown id, for the manifest and for chunks
            (answer,) = await exchange(client, peer, encode(GetManifest("ee" * 32)))
            assert isinstance(answer, Error) and answer.code == NOT_FOUND
            (answer,) = await exchange(client, peer, encode(GetChunks("ee" * 32, 0, 1)))
            assert answer.code == NOT_FOUND
            # range outside the artifact, zero and too many chunks: refused, stream reset
            for start, count in ((2, 2), (0, 0), (0, 65), (1 << 31, 1)):
                (answer,) = await exchange(client, peer, encode(GetChunks(ident, start, count)))
                assert isinstance(answer, Error) and answer.code == BAD_REQUEST
            # oversized frame, unknown type, response types sent as requests, garbage
            for frames in (struct.pack(">IB", 1 << 30, 1), struct.pack(">IB", 2, 77) + b"x",
                           encode(Chunk(0, b"x" * 10)), encode(ManifestMsg(b"m")), b"\0\0\0\x01\x01",
                           encode(GetManifest(ident))[:-3] + b"\0" * 64):
                answers = await exchange(client, peer, frames)
                assert answers and isinstance(answers[-1], Error) and answers[-1].code == BAD_REQUEST, frames
            # the holder still serves well-formed requests, pipelined on one stream
            answers = await exchange(client, peer, encode(GetManifest(ident)) + encode(GetChunks(ident, 1, 2))
                                     + encode(GetChunks(ident, 0, 1)))
            assert [type(a) for a in answers] == [ManifestMsg, Chunk, Chunk, Chunk]
            assert [a.index for a in answers[1:]] == [1, 2, 0]
            assert answers[2].data == data[2 * MB:] and answers[3].data == data[:MB]
            assert not service._uploads   # every serving stream was released
    run(main())


def test_server_limits_concurrent_uploads_per_peer(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2, max_uploads_per_peer=1) as peers:
            (holder, service), (client, _) = peers
            ident = await service.add_bytes(b"x" * 10)
            first = await client.open_stream(holder.peer_id, PROTOCOL)   # held open: one upload slot in use
            await first.write(encode(GetManifest(ident)))
            kind, length = decode_header(await first.readexactly(5), LIMIT)
            decode_body(kind, await first.readexactly(length))
            (answer,) = await exchange(client, holder.peer_id, encode(GetManifest(ident)))
            assert isinstance(answer, Error) and answer.code == BUSY
            await first.close()
    run(main())


def fake_holder(host, script):
    """Serve the artifact protocol on ``host`` with ``script(request) -> bytes`` answering each request."""
    async def handler(stream):
        while True:
            try:
                header = await stream.readexactly(5)
            except asyncio.IncompleteReadError:
                return
            kind, length = decode_header(header, 1 << 10)
            reply = script(decode_body(kind, await stream.readexactly(length)))
            await stream.write(reply)
    host.set_handler(PROTOCOL, handler)


@pytest.mark.parametrize("case", ["wrong_manifest", "oversized_frame", "unrequested_chunk", "manifest_for_chunks",
                                  "wrong_length_chunk", "oversized_manifest"])
def test_a_misbehaving_holder_is_dropped_and_an_honest_one_completes(tmp_path, case):
    async def main():
        async with artifact_peers(tmp_path, 3) as peers:
            (honest, s_honest), (bad, s_bad), (_, sd) = peers
            data = os.urandom(3 * MB + 5)
            ident = await s_honest.add_bytes(data)
            manifest = s_honest.store.manifest(ident)
            other = await s_bad.add_bytes(os.urandom(100))

            def script(request):
                if isinstance(request, GetManifest):
                    if case == "wrong_manifest":
                        return encode(ManifestMsg(s_bad.store.manifest(other).encode()))
                    if case == "oversized_manifest":
                        return struct.pack(">IB", 64 << 20, 2)
                    return encode(ManifestMsg(manifest.encode()))
                if case == "oversized_frame":
                    return struct.pack(">IB", 1 << 31, 4)
                if case == "unrequested_chunk":
                    return encode(Chunk(request.start + request.count, data[:MB]))
                if case == "manifest_for_chunks":
                    return encode(ManifestMsg(manifest.encode()))
                return encode(Chunk(request.start, b"short"))

            fake_holder(bad, script)
            report = await sd.fetch_report(ident, [bad.peer_id, honest.peer_id])
            assert report.path.read_bytes() == data
            assert report.bad_holders == [bad.peer_id], report
            assert bad.peer_id in report.dropped and report.per_holder.get(bad.peer_id, 0) == 0
    run(main())


def test_manifest_over_the_size_limit_is_refused_not_a_liar(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 1) as peers:
            (holder, service), = peers
            ident = await service.add_bytes(os.urandom(3 * MB))
            async with artifact_peers(tmp_path / "small", 1, max_size=2 * MB) as small:
                (client, sd), = small
                client.peerbook.add_addrs(holder.peer_id, holder.listen_addrs)
                with pytest.raises(ArtifactError, match="exceeds the limit"):
                    await sd.fetch(ident, [holder.peer_id])
    run(main())
