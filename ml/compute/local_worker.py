"""One process of a local job over the node's p2p stack: `python -m ml.compute.local_worker --rank R`
with the TrainSpec as JSON on the first stdin line.

It starts a p2p Host on 127.0.0.1 with a fresh identity and prints {"event": "listening", "peer" (its
peer ID), "pid", "addrs"}; reads {"peers": {peer_id: [addr, ...]}} (every worker, itself included); starts its
all-reduce group over bulk Host connections, builds its trainer, waits until every peer's group is up (the task-ready
barrier), trains, prints {"event": "progress", ...} per report and {"event": "done", ...summary};
then keeps serving until {"shutdown": true}. Errors print {"event": "error", "message"} (exit 1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from ml.compute import ready_protocol
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.job.runner import train_to_end
from ml.train.progress import ProgressFeed
from ml.train.spec import TrainSpec
from node.identity import Identity
from node.p2p.host import Host

LOCAL_TASK_ID = bytes(32)
READY_TIMEOUT_S = 60.0


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def read_message() -> dict:
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line:
        raise RuntimeError("stdin closed before the expected message")
    return json.loads(line)


async def work(mode: str) -> None:
    spec = TrainSpec.from_dict(await read_message())
    host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
    await host.start()
    transport = HostTransport(host)
    ready: set[bytes] = set()
    host.set_handler(ready_protocol.PROTOCOL, ready_protocol.make_handler(ready.__contains__))
    group = None
    try:
        emit("listening", peer=host.peer_id, pid=os.getpid(), addrs=host.listen_addrs)
        peers = (await read_message())["peers"]
        for peer, addrs in peers.items():
            if peer != host.peer_id:
                host.peerbook.add_addrs(peer, addrs)
        workers = sorted(peers)
        group = make_group(spec, transport, host.peer_id, workers, LOCAL_TASK_ID, mode)
        await group.start()
        feed = ProgressFeed()
        feed.subscribe(lambda progress: emit("progress", **progress.to_dict()))
        trainer = await asyncio.to_thread(prepare_trainer, spec, group, host.peer_id, workers, feed)
        ready.add(LOCAL_TASK_ID)
        await ready_protocol.wait_until_ready(host, [p for p in workers if p != host.peer_id], LOCAL_TASK_ID,
                                              READY_TIMEOUT_S)
        summary = await train_to_end(trainer)
        emit("done", peer_id=host.peer_id, **summary)
        await read_message()  # shutdown: every worker is done
    finally:
        if group is not None:
            await group.close()
        await transport.close()
        await host.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="one worker of a local job over the p2p stack")
    parser.add_argument("--rank", type=int, required=True, help="index of this process (for messages)")
    parser.add_argument("--mode", default="butterfly", choices=("butterfly", "ring"))
    args = parser.parse_args()
    try:
        asyncio.run(work(args.mode))
    except Exception as exc:  # reported to the parent, which decides what the job's failure means
        emit("error", rank=args.rank, message=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
