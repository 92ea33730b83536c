"""Butterfly all-reduce (direct reduce-scatter + all-gather) for one attempt, pipelined in chunks.

Each member sends shard k of its contribution, encoded once, straight to reducer k. Reducer k
decodes the chunks of all members, sums them exactly in fp32 in the members' sorted order (its own
contribution unquantized), divides by the member count, encodes that mean once and sends the same
bytes to everyone; it keeps the decoding of those bytes itself, so all members hold the same bits.
So every value is quantized at most twice (contribution, result) whatever the group size.
Non-reducers (NAT'd or slow peers) only send parts and receive results.
"""
from __future__ import annotations

import torch

from ml.codecs.base import all_finite

from .attempt import AttemptContext, decode_checked, encode_checked, run_all
from .inbox import PeerFailure
from .wire import Kind


async def run_butterfly(ctx: AttemptContext) -> None:
    plan = ctx.plan
    jobs = []
    for shard, reducer in enumerate(plan.reducers):
        if reducer == ctx.me:
            jobs.append(_reduce_shard(ctx, shard))
        else:
            jobs.append(_send_parts(ctx, shard, reducer))
            jobs.append(_receive_results(ctx, shard, reducer))
    await run_all(jobs)


async def _send_parts(ctx: AttemptContext, shard: int, reducer: str) -> None:
    for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
        payload = await ctx.offload(encode_checked, ctx.codec, ctx.flat[a:b], ctx.me)
        meta = ctx.first_meta if c == 0 else None
        await ctx.links.send(reducer, ctx.frame(Kind.PART, shard, c, payload, meta))


async def _receive_results(ctx: AttemptContext, shard: int, reducer: str) -> None:
    for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
        frame = await ctx.take(Kind.RESULT, shard, c, reducer, first=True, stall_factor=2.0)
        if c == 0 and shard == 0:
            ctx.agreed_rates = _parse_rates(ctx, frame.meta)
        ctx.out[a:b] = await ctx.offload(decode_checked, ctx.codec, frame.payload, b - a, reducer, "result")


def _parse_rates(ctx: AttemptContext, meta: dict) -> dict[str, float]:
    """The upload-rate table reducer 0 sends with its first result chunk (junk entries dropped)."""
    rates = meta.get("rates")
    table = {}
    if isinstance(rates, dict):
        for index, rate in rates.items():
            if index.isdigit() and int(index) < len(ctx.universe) and isinstance(rate, (int, float)) and rate > 0:
                table[ctx.universe[int(index)]] = float(rate)
    return table


async def _reduce_shard(ctx: AttemptContext, shard: int) -> None:
    plan = ctx.plan
    others = [m for m in plan.members if m != ctx.me]
    for c, (a, b) in enumerate(plan.chunks(shard)):
        payloads = {}
        for sender in others:
            frame = await ctx.take(Kind.PART, shard, c, sender, first=(c == 0))
            if c == 0:
                ctx.check_first_meta(sender, frame.meta)
            payloads[sender] = frame.payload
        encoded, mean = await ctx.offload(_reduce_chunk, ctx, payloads, a, b)
        ctx.out[a:b] = mean
        meta = None
        if c == 0:
            meta = _rates_meta(ctx)
            if shard == 0:
                ctx.agreed_rates = _parse_rates(ctx, meta)
        for member in others:
            await ctx.links.send(member, ctx.frame(Kind.RESULT, shard, c, encoded, meta))


def _rates_meta(ctx: AttemptContext) -> dict:
    index = {peer: i for i, peer in enumerate(ctx.universe)}
    rates = dict(ctx.rates_seen)
    own = ctx.first_meta.get("rate")
    if isinstance(own, (int, float)) and own > 0:
        rates[ctx.me] = own
    return {"rates": {str(index[p]): r for p, r in sorted(rates.items()) if p in index}}


def _reduce_chunk(ctx: AttemptContext, payloads: dict[str, bytes], a: int, b: int) -> tuple[bytes, torch.Tensor]:
    """Sum in sorted member order, divide, encode once; runs in a worker thread."""
    numel = b - a
    acc = None
    for member in ctx.plan.members:
        if member == ctx.me:
            values = ctx.flat[a:b]
            if not all_finite(values):
                raise PeerFailure(ctx.me, "non-finite values (NaN/Inf) in local contribution")
        else:
            values = decode_checked(ctx.codec, payloads[member], numel, member, "contribution")
        acc = values.clone() if acc is None else acc.add_(values)
    acc.div_(len(ctx.plan.members))
    encoded = ctx.codec.encode(acc)
    mean = ctx.codec.decode(encoded, numel)
    return encoded, mean
