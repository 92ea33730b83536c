"""All-gather of encoded contributions for one attempt, and their mean (docs/adr/0091).

For codecs whose encodings cannot be summed and re-encoded without losing what error feedback
needs (top-k, sign): every member's contribution is encoded once by its owner, who keeps the
error-feedback residual, and sent unchanged to every other member in pieces of `piece_bytes`.
The first piece's meta says the total length, which must not exceed the codec's
`max_encoded_size`; a contribution that is oversized, cut, undecodable, of another size or not
finite fails the attempt naming its sender. Every member decodes all contributions (its own from
its own encoding) and sums them in the members' sorted order, so all hold the same bits.

A member holding every contribution confirms it to every other member (an empty RESULT frame, slot
0, chunk 0) and finishes the attempt only once every other member confirmed too (docs/adr/0141):
like the butterfly's dependency on every reducer's result, a member never commits a mean over a
member whose contribution some other member did not receive (that member may already have
given up the attempt and committed a later one without it).

With a signer (docs/adr/0209) the first piece's meta also carries the sender's signature of the
digest of its whole encoding for that receiver; a contribution whose signature does not verify
fails the attempt naming its sender.
"""
from __future__ import annotations

import hashlib
import math

import torch

from ml.codecs.base import CodecError, all_finite

from .attempt import AttemptContext, run_all
from .inbox import PeerFailure
from .payloads import decode_into
from .receipts import Receipt
from .wire import Kind, received_bytes


async def run_allgather(ctx: AttemptContext) -> None:
    others = [m for m in ctx.plan.members if m != ctx.me]
    decoded = {ctx.me: ctx.flat}
    digest = await ctx.offload(lambda: hashlib.sha256(ctx.encoded).hexdigest()) if ctx.signer is not None else ""
    jobs = [_send_contribution(ctx, member, digest) for member in others]
    jobs += [_receive_contribution(ctx, member, decoded) for member in others]
    await run_all(jobs)
    # every contribution is here and decodes: confirm it, and wait for everyone's confirmation while
    # the mean is computed (docs/adr/0141)
    jobs = [ctx.links.send(member, ctx.frame(Kind.RESULT, 0, 0, b"")) for member in others]
    jobs += [_receive_confirmation(ctx, member) for member in others]
    jobs.append(_mean_into_out(ctx, decoded))
    await run_all(jobs)


async def _mean_into_out(ctx: AttemptContext, decoded: dict[str, torch.Tensor]) -> None:
    mean = await ctx.offload(mean_in_order, [decoded[m] for m in ctx.plan.members])
    if not await ctx.offload(all_finite, mean):
        raise CodecError("the sum of finite contributions overflowed to Inf")
    ctx.out.copy_(mean)


async def _receive_confirmation(ctx: AttemptContext, sender: str) -> None:
    """`sender` holds every contribution of this attempt (it sends no other RESULT frame)."""
    frame = await ctx.take(Kind.RESULT, 0, 0, sender, first=False)
    if len(frame.payload) != 0:
        raise PeerFailure(sender, f"malformed confirmation: {len(frame.payload)} bytes", bad_data=True)


async def _send_contribution(ctx: AttemptContext, member: str, digest: str) -> None:
    data = memoryview(ctx.encoded)
    size = ctx.piece_bytes
    for c in range(pieces(len(data), size)):
        meta = {**ctx.first_meta, "bytes": len(data)} if c == 0 else None
        if meta is not None and ctx.signer is not None:
            meta["sig"] = ctx.signer.sign(ctx.round_id, member, digest, 0, 0, 0)
        await ctx.links.send(member, ctx.frame(Kind.PART, 0, c, data[c * size:(c + 1) * size], meta))


async def _receive_contribution(ctx: AttemptContext, sender: str, decoded: dict[str, torch.Tensor]) -> None:
    first = await ctx.take(Kind.PART, 0, 0, sender, first=True)
    ctx.check_first_meta(sender, first.meta)
    total = first.meta.get("bytes")
    limit = ctx.codec.max_encoded_size(ctx.flat.numel())
    if not isinstance(total, int) or isinstance(total, bool) or not 0 < total <= limit:
        raise PeerFailure(sender, f"oversized or malformed contribution: {total!r} bytes (at most {limit})",
                          bad_data=True)
    count = pieces(total, ctx.piece_bytes)
    received = [received_bytes(first)]
    for c in range(1, count):
        received.append(received_bytes(await ctx.take(Kind.PART, 0, c, sender, first=False)))
    sizes = [len(p) for p in received]
    expected = [min(ctx.piece_bytes, total - c * ctx.piece_bytes) for c in range(count)]
    if sizes != expected:
        raise PeerFailure(sender, f"malformed contribution: pieces of {sizes} bytes, expected {expected}",
                          bad_data=True)
    payload = received[0] if count == 1 else b"".join(received)
    digest = await ctx.offload(lambda: hashlib.sha256(payload).hexdigest())
    receipt = Receipt(sender, digest, 0, 0, 0)
    if ctx.signer is not None:
        signed = ctx.signer.receipt(ctx.round_id, sender, digest, 0, 0, 0, first.meta.get("sig"))
        if signed is None:
            raise PeerFailure(sender, "a contribution without a valid signature of its sender", bad_data=True)
        receipt = signed
    out = torch.empty_like(ctx.flat)
    await ctx.offload(decode_into, ctx.codec, payload, out, sender, "contribution")
    decoded[sender] = out
    ctx.received[sender] = receipt


def pieces(total: int, piece_bytes: int) -> int:
    """How many frames carry a contribution of `total` bytes (at least one)."""
    return max(1, math.ceil(total / piece_bytes))


def mean_in_order(values: list[torch.Tensor]) -> torch.Tensor:
    """The mean of `values`, summed in the given order (the same bits on every member)."""
    acc = values[0].clone()
    for v in values[1:]:
        acc.add_(v)
    return acc.div_(len(values))
