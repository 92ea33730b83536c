"""Worker process of a local job: `python -m ml.job.worker --rank R --world N` with the TrainSpec as
JSON on the first stdin line.

Protocol, one JSON object per line: the worker prints {"event": "listening", "peer", "pid", "address":
[h, p]}, reads
the address book {"addresses": {peer: [h, p]}} from stdin, then prints {"event": "progress", ...} per
report and finally {"event": "done", ...summary} or {"event": "error", "message": ...} (exit 1).
After "done" it keeps its all-reduce endpoint open until the parent sends {"shutdown": true} (sent
once every worker is done or gone), so a peer still finishing the last round never finds it gone.
Peers are named "worker-<rank>". A peer that dies mid-job is dropped by the all-reduce and the others
train on (`ml.job.local`); the rounds that lacked someone are in the summary's "short_rounds".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from ml.allreduce import AllReduceGroup, DeadlinePolicy, TcpTransport
from ml.job.runner import train_over_group
from ml.train.allreduce_averager import group_codec
from ml.train.progress import ProgressFeed
from ml.train.spec import TrainSpec


def peer_name(rank: int) -> str:
    return f"worker-{rank}"


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def read_line() -> dict:
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line:
        raise RuntimeError("stdin closed before the expected message")
    return json.loads(line)


async def work(rank: int, world: int, mode: str) -> None:
    spec = TrainSpec.from_dict(await read_line())
    me = peer_name(rank)
    transport = TcpTransport(me)
    address = list(await transport.start())
    group = AllReduceGroup(transport, me, [peer_name(r) for r in range(world)], mode=mode,
                           codec=group_codec(spec), deadlines=DeadlinePolicy())
    await group.start()  # before anyone learns our address: a stream for an unset protocol is reset
    emit("listening", rank=rank, peer=me, pid=os.getpid(), address=address)
    book = (await read_line())["addresses"]
    transport.addresses.update({peer: tuple(address) for peer, address in book.items()})
    feed = ProgressFeed()
    feed.subscribe(lambda progress: emit("progress", **progress.to_dict()))
    try:
        emit("done", peer=me, **await train_over_group(spec, rank, world, group, feed))
        await read_line()  # the shutdown message: every worker has finished
    finally:
        await group.close()
        await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="one worker of a local training job")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--mode", default="butterfly", choices=("butterfly", "ring"))
    args = parser.parse_args()
    try:
        asyncio.run(work(args.rank, args.world, args.mode))
    except Exception as exc:  # reported to the parent, which decides what the job's failure means
        emit("error", rank=args.rank, message=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
