"""Ring all-reduce (reduce-scatter then all-gather) for one attempt, pipelined in chunks.

Member i sends to i+1 and receives from i-1. In reduce-scatter step t it forwards the running sum
of shard (i - t) and adds its own values to shard (i - t - 1); after n-1 steps it holds the full
sum of shard (i + 1), divides it by n, encodes it once and keeps that encoding's decoding. The
all-gather forwards those bytes unchanged, so every member decodes the same bits. Partial sums
are re-encoded at every hop, so use the ring only with float codecs (fp32/fp16/bf16); quantizing
codecs belong to the butterfly. The ring splits shards by the group's configured upload rates
(evenly by default); measuring them is the butterfly's job.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import torch

from .attempt import AttemptContext, run_all
from .payloads import Payload, decode_into, encode_local, encode_result, sum_in_order
from .wire import Kind

RING_CODECS = ("fp32", "fp16", "bf16")
SlotFuture = Callable[[int, int], "asyncio.Future[Any]"]   # (slot, chunk) -> its payload when ready


async def run_ring(ctx: AttemptContext) -> None:
    members = ctx.plan.members
    n = len(members)
    i = members.index(ctx.me)
    ready: dict[tuple[int, int], asyncio.Future[Any]] = {}

    def slot_future(slot: int, chunk: int) -> asyncio.Future[Any]:
        key = (slot, chunk)
        if key not in ready:
            ready[key] = asyncio.get_running_loop().create_future()
        return ready[key]

    for c, (_a, _b) in enumerate(ctx.plan.chunks(i)):
        slot_future(0, c).set_result(None)  # step 0 sends our own shard: encoded by the sender
    await run_all([_sender(ctx, i, n, members[(i + 1) % n], slot_future),
                   _receiver(ctx, i, n, members[(i - 1) % n], slot_future)])


def _send_shard(i: int, n: int, slot: int) -> int:
    return (i - slot) % n if slot < n - 1 else (i + 1 - (slot - (n - 1))) % n


async def _sender(ctx: AttemptContext, i: int, n: int, successor: str, slot_future: SlotFuture) -> None:
    for slot in range(2 * (n - 1)):
        shard = _send_shard(i, n, slot)
        for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
            payload = await slot_future(slot, c)
            if payload is None:
                payload = await ctx.offload(encode_local, ctx.codec, ctx.flat[a:b], ctx.me)
            meta = ctx.first_meta if c == 0 and slot == 0 else None
            await ctx.links.send(successor, ctx.frame(Kind.PART if slot < n - 1 else Kind.RESULT,
                                                      slot, c, payload, meta))


async def _receiver(ctx: AttemptContext, i: int, n: int, predecessor: str, slot_future: SlotFuture) -> None:
    for step in range(n - 1):  # reduce-scatter
        shard = (i - step - 1) % n
        for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
            # the first chunk of every step waits out the start grace: it depends on the chain
            # of predecessors, each of which may itself be waiting out a late start
            frame = await ctx.take(Kind.PART, step, c, predecessor, first=(c == 0), stall_factor=1.0 + step)
            if c == 0 and step == 0:
                ctx.check_first_meta(predecessor, frame.meta)
            last = step == n - 2
            payload, final = await ctx.offload(_add_own, ctx, frame.payload, a, b, predecessor, last, n)
            if last:
                ctx.out[a:b] = final
                slot_future(n - 1, c).set_result(payload)
            else:
                slot_future(step + 1, c).set_result(payload)
    for step in range(n - 1):  # all-gather
        shard = (i - step) % n
        for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
            frame = await ctx.take(Kind.RESULT, n - 1 + step, c, predecessor, first=(c == 0),
                                   stall_factor=float(n))
            await ctx.offload(decode_into, ctx.codec, frame.payload, ctx.out[a:b], predecessor, "result")
            if step < n - 2:
                slot_future(n + step, c).set_result(frame.payload)


def _add_own(ctx: AttemptContext, payload: bytes, a: int, b: int, sender: str, last: bool,
             n: int) -> tuple[Payload, torch.Tensor | None]:
    """Add our values to a received partial sum; on the last step divide and encode once."""
    acc = sum_in_order(ctx.codec, [(sender, payload), (ctx.me, ctx.flat[a:b])], ctx.me, "partial sum", b - a)
    if not last:
        return encode_local(ctx.codec, acc, ctx.me), None
    return encode_result(ctx.codec, acc.div_(n))
