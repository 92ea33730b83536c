"""All-gather rounds (`AllReduceGroup.allgather_mean`) among in-process peers over loopback TCP:
every member ends with the same bits, the mean of the decoded encodings in sorted member order;
malformed, oversized, wrong-size and missing contributions are excluded and reported."""
import asyncio
import time

import loopback_groups
import pytest
import torch
from loopback_groups import close_all, ids, run

from ml.allreduce import DeadlinePolicy, ExcludedFromRound
from ml.allreduce.wire import Frame, Kind
from ml.codecs import ErrorFeedback, get_codec

FAST = DeadlinePolicy(floor_s=0.5, initial_s=1.0, first_frame_grace_s=0.5, ceiling_s=5.0)
CHUNK = 1024  # all-gather pieces are 4 KiB


async def make_groups(n, **kwargs):
    kwargs.setdefault("chunk_numel", CHUNK)
    return await loopback_groups.make_groups(n, **kwargs)


def contributions(n, numel, seed):
    return [torch.randn(numel, generator=torch.Generator().manual_seed(seed + i)) for i in range(n)]


def reference_mean(codec, encodings, numel):
    acc = codec.decode(encodings[0], numel).clone()
    for data in encodings[1:]:
        acc.add_(codec.decode(data, numel))
    return acc.div_(len(encodings))


def flat(result):
    return torch.cat([t.reshape(-1) for t in result.tensors])


@pytest.mark.parametrize("codec_name,options,n", [("topk", {"ratio": 0.01}, 3), ("topk", {"ratio": 0.1}, 4),
                                                  ("sign", {}, 3), ("fp32", {}, 2)])
def test_every_member_gets_the_mean_of_the_decoded_encodings_bit_for_bit(codec_name, options, n):
    codec = get_codec(codec_name, **options)
    shapes = [(30, 40), (50_000,)]
    numel = 30 * 40 + 50_000

    async def main():
        groups, transports = await make_groups(n)
        xs = contributions(n, numel, seed=10)
        encodings = [codec.encode(x) for x in xs]
        try:
            results = await asyncio.gather(*(g.allgather_mean(e, codec, shapes, 3)
                                             for g, e in zip(groups, encodings)))
        finally:
            await close_all(groups, transports)
        return results, encodings

    results, encodings = run(main())
    expected = reference_mean(codec, encodings, numel)
    for r in results:
        assert r.participants == tuple(ids(n)) and r.attempts == 1 and not r.excluded
        assert [tuple(t.shape) for t in r.tensors] == shapes
        assert torch.equal(flat(r), expected)
        # an all-gather: each member sends its encoding to the n-1 others, plus frame headers
        assert (n - 1) * len(encodings[0]) <= r.bytes_sent < (n - 1) * len(encodings[0]) * 1.05 + 4096


def test_round_ids_are_shared_with_allreduce_and_error_feedback_stays_with_the_caller():
    codec = get_codec("topk", ratio=0.05)
    numel = 4000

    async def main():
        groups, transports = await make_groups(2)
        feedback = [ErrorFeedback(codec, numel) for _ in groups]
        outcomes = []
        try:
            dense = await asyncio.gather(*(g.allreduce([torch.ones(numel)], 0) for g in groups))
            for round_id in (1, 2):
                xs = contributions(2, numel, seed=20 * round_id)
                encodings = [fb.encode(x) for fb, x in zip(feedback, xs)]
                results = await asyncio.gather(*(g.allgather_mean(e, codec, [(numel,)], round_id)
                                                 for g, e in zip(groups, encodings)))
                outcomes.append((results, encodings))
            with pytest.raises(ValueError, match="not after"):
                await groups[0].allgather_mean(encodings[0], codec, [(numel,)], 2)
        finally:
            await close_all(groups, transports)
        return dense, outcomes

    dense, outcomes = run(main())
    assert all(torch.equal(flat(r), torch.ones(numel)) for r in dense)
    for results, encodings in outcomes:
        assert all(torch.equal(flat(r), reference_mean(codec, encodings, numel)) for r in results)


def _with_nan(data):
    """A top-k encoding whose last value (fp16, little-endian, at the end) is NaN."""
    return bytes(data[:-2]) + b"\x00\x7e"


def _rewrite_parts(group, rewrite):
    """Make `group` a faulty peer: its PART frames go out as `rewrite(meta, payload)` says."""
    real_send = group._links.send

    async def send(peer, frame):
        if frame.kind == Kind.PART:
            meta, payload = rewrite(frame.meta, frame.payload)
            frame = Frame(frame.kind, frame.round_id, frame.attempt, frame.slot, frame.chunk, meta, payload)
        await real_send(peer, frame)

    group._links.send = send


@pytest.mark.parametrize("fault,reason", [
    ("nan", "NaN"),
    ("truncated", "malformed contribution"),
    ("wrong-size", "malformed contribution"),
    ("oversized", "oversized"),
])
def test_a_bad_contribution_excludes_its_sender_and_the_others_agree(fault, reason):
    codec = get_codec("topk", ratio=0.01)
    numel = 40_000

    async def main():
        groups, transports = await make_groups(4, deadlines=FAST)
        xs = contributions(4, numel, seed=30)
        encodings = [codec.encode(x) for x in xs]
        if fault == "oversized":  # claims more bytes than a top-k encoding of numel values can have
            claim = 10 * codec.max_encoded_size(numel)
            _rewrite_parts(groups[2], lambda meta, payload: ({**meta, "bytes": claim} if meta else meta, payload))
        else:
            bad = {"nan": _with_nan(encodings[2]), "truncated": encodings[2][:-1],
                   "wrong-size": codec.encode(torch.randn(numel + 1))}[fault]
            _rewrite_parts(groups[2], lambda meta, payload: ({**meta, "bytes": len(bad)}, bad))
        start = time.monotonic()
        try:
            results = await asyncio.gather(*(g.allgather_mean(e, codec, [(numel,)], 0)
                                             for g, e in zip(groups, encodings)), return_exceptions=True)
        finally:
            await close_all(groups, transports)
        return results, encodings, time.monotonic() - start

    results, encodings, seconds = run(main())
    assert seconds < 10
    # peer2 itself may well finish: it holds everyone's contribution (its own as it encoded it);
    # the honest peers refuse its committed result (docs/adr/0092) and agree without it
    expected = reference_mean(codec, [encodings[i] for i in (0, 1, 3)], numel)
    for r in (results[0], results[1], results[3]):
        assert r.participants == ("peer0", "peer1", "peer3") and reason in r.excluded["peer2"]
        assert torch.equal(flat(r), expected)


def test_a_member_without_a_contribution_is_excluded_and_told():
    codec = get_codec("sign")
    numel = 10_000

    async def main():
        groups, transports = await make_groups(3)
        xs = contributions(3, numel, seed=40)
        encodings = [codec.encode(x) for x in xs]
        encodings[1] = None  # e.g. its gradient was not finite
        try:
            return await asyncio.gather(*(g.allgather_mean(e, codec, [(numel,)], 0)
                                          for g, e in zip(groups, encodings)), return_exceptions=True), xs
        finally:
            await close_all(groups, transports)

    results, xs = run(main())
    assert isinstance(results[1], ExcludedFromRound) and "no valid local contribution" in results[1].reason
    expected = reference_mean(codec, [codec.encode(xs[0]), codec.encode(xs[2])], numel)
    for r in (results[0], results[2]):
        assert r.participants == ("peer0", "peer2") and r.attempts == 2
        assert torch.equal(flat(r), expected)


def test_a_silent_member_is_excluded_within_the_deadline():
    codec = get_codec("topk")
    numel = 20_000

    async def main():
        groups, transports = await make_groups(3, deadlines=FAST)
        xs = contributions(3, numel, seed=50)
        encodings = [codec.encode(x) for x in xs]
        start = time.monotonic()
        try:
            results = await asyncio.gather(*(g.allgather_mean(e, codec, [(numel,)], 0)
                                             for g, e in zip(groups[:2], encodings)))
        finally:
            await close_all(groups, transports)
        return results, encodings, time.monotonic() - start

    results, encodings, seconds = run(main())
    assert seconds < 8
    for r in results:
        assert r.participants == ("peer0", "peer1") and "stalled" in r.excluded["peer2"]
        assert torch.equal(flat(r), reference_mean(codec, encodings[:2], numel))
