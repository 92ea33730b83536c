"""Signed receipts on the wire (docs/adr/0209) among in-process peers over loopback TCP: with a signer,
every receipt a member keeps carries its sender's signature of exactly what it received (butterfly
parts with a non-reducer, all-gather encodings), the mean is the unsigned group's, and a
member whose signature does not verify is excluded naming it."""
import asyncio

import pytest
import torch
from loopback_groups import close_all, run, start_transports

from ml.allreduce import AllReduceGroup, DeadlinePolicy
from ml.allreduce.receipts import WireSigner, receipt_message
from ml.codecs import get_codec
from ml.compute.executor import task_signer
from node.identity import Identity, verify_by_peer_id

TASK = b"\x05" * 32
IDENTITIES = {i.peer_id: i for i in (Identity.from_seed(bytes([n + 40]) * 32) for n in range(4))}
NAMES = sorted(IDENTITIES)
FAST = DeadlinePolicy(floor_s=0.5, initial_s=1.0, first_frame_grace_s=0.5, ceiling_s=5.0)


async def signed_groups(n, signers=None, **kwargs):
    names = NAMES[:n]
    transports = await start_transports(names)
    signers = signers or {p: task_signer(IDENTITIES[p], TASK) for p in names}
    groups = [AllReduceGroup(t, t.my_id, names, chunk_numel=1024, signer=signers[t.my_id], **kwargs)
              for t in transports]
    for g in groups:
        await g.start()
    return groups, transports


def contributions(n, numel):
    return [torch.randn(numel, generator=torch.Generator().manual_seed(70 + i)) for i in range(n)]


def flat(result):
    return torch.cat([t.reshape(-1) for t in result.tensors])


def signed_by_sender(receiver, receipt, round_id):
    message = receipt_message(TASK, round_id, receipt.sender, receiver, receipt.digest, receipt.start, receipt.stop,
                              receipt.chunk)
    return verify_by_peer_id(receipt.sender, message, receipt.signature)


def test_butterfly_receipts_are_signed_and_the_mean_is_unchanged():
    numel = 5000

    async def main(signed):
        if signed:
            groups, transports = await signed_groups(4, non_reducers={NAMES[3]})
        else:
            transports = await start_transports(NAMES)
            groups = [AllReduceGroup(t, t.my_id, NAMES, chunk_numel=1024, non_reducers={NAMES[3]}) for t in transports]
            for g in groups:
                await g.start()
        try:
            return await asyncio.gather(*(g.allreduce([x], 9) for g, x in zip(groups, contributions(4, numel))))
        finally:
            await close_all(groups, transports)

    signed, plain = run(main(True)), run(main(False))
    assert all(torch.equal(flat(a), flat(b)) for a, b in zip(signed, plain))
    for name, result in zip(NAMES, signed):
        if name == NAMES[3]:   # a non-reducer receives no parts
            assert result.received == ()
            continue
        assert {r.sender for r in result.received} == set(NAMES) - {name}
        for receipt in result.received:
            assert receipt.start < receipt.stop and signed_by_sender(name, receipt, 9)
            assert not signed_by_sender(name, receipt, 10)


def test_allgather_receipts_are_signed():
    codec = get_codec("topk", ratio=0.05)

    async def main():
        groups, transports = await signed_groups(3)
        encodings = [codec.encode(x) for x in contributions(3, 4000)]
        try:
            return await asyncio.gather(*(g.allgather_mean(e, codec, [(4000,)], 2) for g, e in zip(groups, encodings)))
        finally:
            await close_all(groups, transports)

    results = run(main())
    for name, result in zip(NAMES, results):
        assert len(result.received) == 2 and all(signed_by_sender(name, r, 2) for r in result.received)


@pytest.mark.parametrize("mode", ["butterfly", "allgather"])
def test_a_member_whose_signature_does_not_verify_is_excluded(mode):
    names = NAMES[:3]
    signers = {p: task_signer(IDENTITIES[p], TASK) for p in names}
    # names[1] signs with another key: its bytes carry no signature of its own
    stranger = Identity.from_seed(b"\x63" * 32)
    signers[names[1]] = WireSigner(names[1], TASK, stranger.sign, verify_by_peer_id)

    async def main():
        groups, transports = await signed_groups(3, signers, deadlines=FAST)
        xs = contributions(3, 3000)
        try:
            if mode == "butterfly":
                calls = [g.allreduce([x], 0) for g, x in zip(groups, xs)]
            else:
                codec = get_codec("topk", ratio=0.05)
                calls = [g.allgather_mean(codec.encode(x), codec, [(3000,)], 0) for g, x in zip(groups, xs)]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await close_all(groups, transports)

    results = run(main())
    for r in results:   # names[1] itself only takes the others' result (docs/adr/0242): nobody applies its bytes
        assert names[1] not in r.participants and "signature" in r.excluded[names[1]], r.excluded
        assert torch.equal(r.tensors[0], results[0].tensors[0])
