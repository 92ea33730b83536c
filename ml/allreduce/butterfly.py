"""Butterfly all-reduce (direct reduce-scatter + all-gather) for one attempt, pipelined in chunks.

Each member sends shard k of its contribution, encoded once, straight to reducer k. Reducer k
decodes the chunks of all members, sums them exactly in fp32 in the members' sorted order (its own
contribution unquantized), divides by the member count, encodes that mean once and sends the same
bytes to everyone; it keeps the decoding of those bytes itself, so all members hold the same bits.
So every value is quantized at most twice (contribution, result) whatever the group size.
Parts go to all reducers, and results to all members, concurrently (one stream each); the links
interleave them on the uplink in turns of 256 KiB (links.py, uplink.py, docs/adr/0097). A
staggered schedule (all of one destination, then the next) measured slower.
Non-reducers (NAT'd or slow peers) only send parts and receive results.
With a signer (docs/adr/0209) each member signs the digest of all its parts for a reducer and sends
the signature in the meta of the last one; a reducer refuses parts whose signature does not verify.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import torch

from .attempt import AttemptContext, run_all
from .inbox import PeerFailure
from .payloads import Payload, decode_into, encode_local, encode_result, sum_in_order
from .receipts import Receipt, feed
from .wire import Kind

RATE_DEAD_BAND = 2.0  # measured upload rates this close to the median count as equal


async def run_butterfly(ctx: AttemptContext) -> None:
    plan = ctx.plan
    jobs = []
    for shard, reducer in enumerate(plan.reducers):
        if reducer == ctx.me:
            results = [asyncio.get_running_loop().create_future() for _ in plan.chunks(shard)]
            jobs.append(_reduce_shard(ctx, shard, results))
            jobs += [_send_results(ctx, shard, results, member) for member in plan.members if member != ctx.me]
        else:
            jobs.append(_send_parts(ctx, reducer))
            jobs.append(_receive_results(ctx, shard, reducer))
    await run_all(jobs)


async def _send_parts(ctx: AttemptContext, reducer: str) -> None:
    plan = ctx.plan
    shard = plan.shard_of(reducer)
    chunks = plan.chunks(shard)
    hasher = hashlib.sha256() if ctx.signer is not None else None   # all parts for this reducer, signed
    for c, (a, b) in enumerate(chunks):
        payload = await ctx.offload(_encode_part, ctx, a, b, hasher)
        meta = ctx.first_meta if c == 0 else None
        if hasher is not None and ctx.signer is not None and c == len(chunks) - 1:
            start, stop = plan.shards[shard]
            meta = {**(meta or {}), "sig": ctx.signer.sign(ctx.round_id, reducer, hasher.hexdigest(), start, stop,
                                                           plan.chunk_numel)}
        await ctx.links.send(reducer, ctx.frame(Kind.PART, shard, c, payload, meta))


def _encode_part(ctx: AttemptContext, a: int, b: int, hasher: Any) -> Payload:
    """This member's part [a, b), hashed into `hasher` (if any) as it goes on the wire; in a worker thread."""
    payload = encode_local(ctx.codec, ctx.flat[a:b], ctx.me)
    if hasher is not None:
        feed(hasher, payload)
    return payload


async def _receive_results(ctx: AttemptContext, shard: int, reducer: str) -> None:
    for c, (a, b) in enumerate(ctx.plan.chunks(shard)):
        frame = await ctx.take(Kind.RESULT, shard, c, reducer, first=True, stall_factor=2.0)
        if shard == 0 and "rates" in frame.meta:
            ctx.agreed_rates = _parse_rates(ctx, frame.meta)
        await ctx.offload(decode_into, ctx.codec, frame.payload, ctx.out[a:b], reducer, "result")


def _parse_rates(ctx: AttemptContext, meta: dict[str, Any]) -> dict[str, float]:
    """The upload-rate table reducer 0 sends with its last result chunk (junk entries dropped)."""
    rates = meta.get("rates")
    table = {}
    if isinstance(rates, dict):
        for index, rate in rates.items():
            if index.isdigit() and int(index) < len(ctx.universe) and isinstance(rate, (int, float)) and rate > 0:
                table[ctx.universe[int(index)]] = float(rate)
    return table


async def _reduce_shard(ctx: AttemptContext, shard: int, results: list[asyncio.Future[Any]]) -> None:
    plan = ctx.plan
    others = [m for m in plan.members if m != ctx.me]
    chunks = plan.chunks(shard)
    # (arrival time, bytes) of each part, to measure upload rates
    arrivals: dict[str, list[tuple[float, int]]] = {m: [] for m in others}
    hashers = {m: hashlib.sha256() for m in others}  # each sender's parts, for its receipt
    signatures: dict[str, Any] = {}                    # each sender's signature, with its last part
    for c, (a, b) in enumerate(chunks):
        payloads = {}
        for sender in others:
            frame = await ctx.take(Kind.PART, shard, c, sender, first=(c == 0))
            if c == 0:
                ctx.check_first_meta(sender, frame.meta)
            payloads[sender] = frame.payload
            signatures[sender] = frame.meta.get("sig")
            arrivals[sender].append((frame.received_at, len(frame.payload)))
        encoded, mean = await ctx.offload(_reduce_chunk, ctx, payloads, a, b, hashers)
        ctx.out[a:b] = mean
        if c == len(chunks) - 1:   # every part is hashed: keep the receipts before the last result goes out
            _keep_receipts(ctx, shard, hashers, signatures)
        meta = None
        if shard == 0 and c == len(chunks) - 1:
            meta = _rates_meta(ctx, arrivals)
            ctx.agreed_rates = _parse_rates(ctx, meta)
        results[c].set_result((encoded, meta))
    if not chunks:
        _keep_receipts(ctx, shard, hashers, signatures)


def _keep_receipts(ctx: AttemptContext, shard: int, hashers: dict[str, Any], signatures: dict[str, Any]) -> None:
    """Each sender's receipt for this reducer's shard; with a signer, only parts their sender signed (an
    empty shard carries no parts, so nothing to sign)."""
    start, stop = ctx.plan.shards[shard]
    chunk = ctx.plan.chunk_numel
    for sender, hasher in hashers.items():
        digest = hasher.hexdigest()
        if ctx.signer is None or start == stop:
            ctx.received[sender] = Receipt(sender, digest, start, stop, chunk)
            continue
        receipt = ctx.signer.receipt(ctx.round_id, sender, digest, start, stop, chunk, signatures.get(sender))
        if receipt is None:
            raise PeerFailure(sender, "parts without a valid signature of their sender", bad_data=True)
        ctx.received[sender] = receipt


async def _send_results(ctx: AttemptContext, shard: int, results: list[asyncio.Future[Any]],
                        member: str) -> None:
    for c, result in enumerate(results):
        encoded, meta = await result
        await ctx.links.send(member, ctx.frame(Kind.RESULT, shard, c, encoded, meta))


def _rates_meta(ctx: AttemptContext, arrivals: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    """Each member's upload rate as reducer 0 saw its parts arrive (bytes after the first part over
    the time from first to last), clamped to 1/4..4x the median so one odd reading cannot starve a
    reducer, and readings within RATE_DEAD_BAND of the median taken as the median: concurrent TCP
    streams on equal links read up to ~1.9x apart from round to round, and shards cut by that
    noise made the largest one the round's bottleneck. Every member sends to every reducer at
    once, so each stream gets a similar share of its sender's upload: the readings compare
    members fairly."""
    rates = {}
    for sender, seen in arrivals.items():
        span = seen[-1][0] - seen[0][0] if len(seen) > 1 else 0.0
        if span > 0:
            rates[sender] = sum(size for _, size in seen[1:]) / span
    if rates:
        median = sorted(rates.values())[len(rates) // 2]
        rates = {p: _settle_rate(r, median) for p, r in rates.items()}
    index = {peer: i for i, peer in enumerate(ctx.universe)}
    return {"rates": {str(index[p]): round(r) for p, r in sorted(rates.items())}}


def _settle_rate(rate: float, median: float) -> float:
    if median / RATE_DEAD_BAND <= rate <= median * RATE_DEAD_BAND:
        return median
    return min(max(rate, median / 4), median * 4)


def _reduce_chunk(ctx: AttemptContext, payloads: dict[str, bytes], a: int, b: int,
                  hashers: dict[str, Any]) -> tuple[Payload, torch.Tensor]:
    """Hash each sender's part into its receipt; sum in sorted member order (our own part
    unquantized), divide, encode once; runs in a worker thread."""
    for sender, payload in payloads.items():
        feed(hashers[sender], payload)
    terms = [(m, ctx.flat[a:b] if m == ctx.me else payloads[m]) for m in ctx.plan.members]
    acc = sum_in_order(ctx.codec, terms, ctx.me, "contribution", b - a)
    return encode_result(ctx.codec, acc.div_(len(ctx.plan.members)))
