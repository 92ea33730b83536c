"""Fetching between in-process hosts on 127.0.0.1: several holders, liars, a killed holder, resume."""
import asyncio
import logging
import os

import pytest

from node.artifacts import CHUNK_SIZE, ArtifactError, ArtifactLimits, ArtifactService, ArtifactStore
from node.identity import Identity
from node.metrics import Registry
from node.p2p.host import Host

from .harness import artifact_peers, know

MB = CHUNK_SIZE


def run(coro, timeout=60):
    asyncio.run(asyncio.wait_for(coro, timeout))


def test_fetch_from_three_holders_uses_all_and_then_serves_it(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 5, window_chunks=4, request_chunks=2) as peers:
            (h1, s1), (h2, s2), (h3, s3), (hd, sd), (hx, sx) = peers
            data = os.urandom(24 * MB + 12345)
            ident = await s1.add_bytes(data)
            assert await s2.add_bytes(data) == ident and await s3.add_bytes(data) == ident
            seen = []
            report = await sd.fetch_report(ident, [h1.peer_id, h2.peer_id, h3.peer_id],
                                           progress=lambda done, total: seen.append((done, total)))
            assert report.path.read_bytes() == data and sd.has(ident) and sd.path(ident) == report.path
            assert report.received_bytes == len(data) and not report.bad_holders and report.size == len(data)
            assert sum(report.per_holder.values()) == len(data)
            assert all(report.per_holder[h.peer_id] > 0 for h in (h1, h2, h3)), report.per_holder
            assert seen[0] == (0, len(data)) and seen[-1] == (len(data), len(data))
            assert [d for d, _ in seen] == sorted(d for d, _ in seen)
            # anyone who fetched serves: the original holders go away, x fetches from the downloader
            for host in (h1, h2, h3):
                await host.stop()
            assert await sx.fetch(ident, [hd.peer_id]) == sx.path(ident)
            assert sx.path(ident).read_bytes() == data
            # already held: no transfer
            again = await sx.fetch_report(ident, [])
            assert again.received_bytes == 0 and again.resumed_bytes == len(data)
    run(main())


def test_a_lying_holder_is_dropped_reported_and_the_download_completes(tmp_path, caplog):
    async def main():
        async with artifact_peers(tmp_path, 3, window_chunks=4, request_chunks=2) as peers:
            (honest, s_honest), (liar, s_liar), (hd, _) = peers
            registry = Registry()
            sd = ArtifactService(hd, tmp_path / "metered", ArtifactLimits(window_chunks=4, request_chunks=2),
                                 registry)
            data = os.urandom(12 * MB)
            ident = await s_honest.add_bytes(data)
            await s_liar.add_bytes(data)
            real_read = s_liar.store.read_chunk

            def tampered(artifact, index):
                chunk = real_read(artifact, index)
                return None if chunk is None else bytes([chunk[0] ^ 0xFF]) + chunk[1:]

            s_liar.store.read_chunk = tampered
            with caplog.at_level(logging.WARNING, logger="node.artifacts.service"):
                report = await sd.fetch_report(ident, [liar.peer_id, honest.peer_id])
            assert report.path.read_bytes() == data
            assert report.bad_holders == [liar.peer_id]
            assert "does not match its hash" in report.dropped[liar.peer_id]
            assert report.per_holder[liar.peer_id] == 0 and report.per_holder[honest.peer_id] == len(data)
            assert registry.counter("dekube_artifact_bad_holders_total", "").value() == 1
            assert registry.counter("dekube_artifact_received_bytes_total", "").value() == len(data)
            assert any("dropped for bad data" in r.getMessage() for r in caplog.records)
    run(main())


def test_only_liars_gives_a_clear_error(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2) as peers:
            (liar, s_liar), (_, sd) = peers
            data = os.urandom(2 * MB)
            ident = await s_liar.add_bytes(data)
            s_liar.store.read_chunk = lambda artifact, index: b"\0" * MB
            with pytest.raises(ArtifactError, match="chunks missing.*does not match its hash"):
                await sd.fetch(ident, [liar.peer_id])
            assert not sd.has(ident)
    run(main())


def test_unknown_artifact_and_unreachable_holders_give_clear_errors(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2) as peers:
            (h1, _), (_, sd) = peers
            with pytest.raises(ArtifactError, match="no holder could serve.*no artifact"):
                await sd.fetch("ab" * 32, [h1.peer_id])
            with pytest.raises(ArtifactError, match="no holders given"):
                await sd.fetch("ab" * 32, [])
            with pytest.raises(ArtifactError, match="not an artifact id"):
                await sd.fetch("nope", [h1.peer_id])
            ghost = Identity.generate().peer_id
            sd.host.peerbook.add_addrs(ghost, ["/ip4/127.0.0.1/tcp/1"])
            with pytest.raises(ArtifactError, match=ghost):
                await sd.fetch("cd" * 32, [ghost])
            stranger = Identity.generate().peer_id   # no address known at all
            with pytest.raises(ArtifactError, match=f"{stranger}: no manifest"):
                await sd.fetch("cd" * 32, [stranger])
    run(main())


def test_killed_holder_mid_transfer_other_holder_finishes(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 3, window_chunks=2, request_chunks=1) as peers:
            (h1, s1), (h2, s2), (hd, sd) = peers
            data = os.urandom(24 * MB)
            ident = await s1.add_bytes(data)
            await s2.add_bytes(data)
            killed = []

            def progress(done, total):
                if done >= 4 * MB and not killed:
                    killed.append(asyncio.ensure_future(h1.stop()))

            report = await sd.fetch_report(ident, [h1.peer_id, h2.peer_id], progress=progress)
            await killed[0]
            assert report.path.read_bytes() == data and not report.bad_holders
            assert report.per_holder[h2.peer_id] > report.per_holder[h1.peer_id]
    run(main())


def test_resume_after_the_only_holder_dies_and_the_downloader_restarts(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2, window_chunks=2, request_chunks=1) as peers:
            (h1, s1), (h2, s2) = peers
            data = os.urandom(24 * MB)
            ident = await s1.add_bytes(data)
            await s2.add_bytes(data)
            dl = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
            await dl.start()
            know(dl, h1)
            sd = ArtifactService(dl, tmp_path / "dl", ArtifactLimits(window_chunks=2, request_chunks=1))
            stopping = []

            def progress(done, total):
                if done >= 3 * MB and not stopping:
                    stopping.append(asyncio.ensure_future(h1.stop()))

            with pytest.raises(ArtifactError, match="chunks missing"):
                await sd.fetch(ident, [h1.peer_id], progress=progress)
            await dl.stop()
            (listed,) = ArtifactStore(tmp_path / "dl", 1 << 30).list()
            assert listed["complete"] is False and 0 < listed["have"] < 24
            # the downloader restarts (new host, same store) and resumes from another holder
            dl2 = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
            await dl2.start()
            try:
                know(dl2, h2)
                sd2 = ArtifactService(dl2, tmp_path / "dl")
                report = await sd2.fetch_report(ident, [h2.peer_id])
                assert report.path.read_bytes() == data
                assert report.resumed_bytes == listed["have"] * MB
                assert report.received_bytes == len(data) - report.resumed_bytes
            finally:
                await dl2.stop()
    run(main())


def test_concurrent_fetches_of_one_artifact_share_the_download(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2) as peers:
            (h1, s1), (_, sd) = peers
            data = os.urandom(5 * MB)
            ident = await s1.add_bytes(data)
            a, b = await asyncio.gather(sd.fetch_report(ident, [h1.peer_id]), sd.fetch_report(ident, [h1.peer_id]))
            assert a.path == b.path and a.received_bytes + b.received_bytes == len(data)
    run(main())


def test_a_corrupted_local_copy_is_fetched_again(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 2) as peers:
            (h1, s1), (_, sd) = peers
            data = os.urandom(3 * MB)
            ident = await s1.add_bytes(data)
            await sd.add_bytes(data)
            with open(sd.path(ident), "r+b") as f:
                f.seek(2 * MB + 7)
                f.write(b"\0\0\0")
            report = await sd.fetch_report(ident, [h1.peer_id])
            assert report.path.read_bytes() == data and report.received_bytes == MB
    run(main())


def test_a_partial_holder_serves_what_it_has_and_the_rest_comes_from_another(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 3, window_chunks=2, request_chunks=1) as peers:
            (full, s_full), (part, s_part), (_, sd) = peers
            data = os.urandom(6 * MB)
            ident = await s_full.add_bytes(data)
            partial = s_part.store.open_partial(s_full.store.manifest(ident))
            for index in (0, 1, 2):
                partial.write_chunk(index, data[index * MB:(index + 1) * MB])
            report = await sd.fetch_report(ident, [part.peer_id, full.peer_id])
            assert report.path.read_bytes() == data and not report.bad_holders
            assert report.per_holder[part.peer_id] <= 3 * MB and report.per_holder[full.peer_id] >= 3 * MB
            s_part.store.release_partial(partial)
    run(main())


def test_a_stalled_holder_is_worked_around(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 3, stall_timeout=0.5, window_chunks=2, request_chunks=1) as peers:
            (honest, s_honest), (stalled, s_stalled), (_, sd) = peers
            data = os.urandom(6 * MB)
            ident = await s_honest.add_bytes(data)
            await s_stalled.add_bytes(data)
            never = asyncio.Event()
            s_stalled._serve_chunks = lambda stream, request: never.wait()   # reads requests, never answers
            started = asyncio.get_running_loop().time()
            report = await sd.fetch_report(ident, [stalled.peer_id, honest.peer_id])
            assert report.path.read_bytes() == data
            assert report.per_holder[stalled.peer_id] == 0 and report.per_holder[honest.peer_id] == len(data)
            assert not report.bad_holders   # slow is not lying
            assert asyncio.get_running_loop().time() - started < 10
    run(main())


def test_holders_may_be_given_as_multiaddrs(tmp_path):
    async def main():
        async with artifact_peers(tmp_path, 1) as peers:
            (holder, service), = peers
            ident = await service.add_bytes(b"by address")
            dl = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
            await dl.start()
            try:
                sd = ArtifactService(dl, tmp_path / "dl")   # knows nothing about the holder beforehand
                for bad in ("/ip4/127.0.0.1/tcp/1", "/nonsense/1"):
                    with pytest.raises(ArtifactError, match="holder address"):
                        await sd.fetch(ident, [bad])
                path = await sd.fetch(ident, [holder.listen_addrs[0]])
                assert path.read_bytes() == b"by address"
            finally:
                await dl.stop()
    run(main())
