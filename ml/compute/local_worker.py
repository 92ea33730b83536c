"""One process of a local job: `python -m ml.compute.local_worker --rank R --world N [--transport
p2p|tcp]` with the TrainSpec as JSON on the first stdin line (driven by `ml.compute.local_job`).

Over `p2p` (what `dekube-node task run` runs) the worker is a p2p Host on 127.0.0.1 with a fresh
identity, named by its peer ID, and its group runs over bulk Host connections behind the task-ready
barrier. Over `tcp` (tests and simulations, whose records name workers "worker-<rank>" as the
simulator does) it is a plain all-reduce TCP endpoint whose group is up before anyone learns its
address. Either way the group and the trainer are the compute node's (`ml.compute.executor`).

Protocol, one JSON object per line: the worker prints {"event": "listening", "rank", "peer", "pid",
"addrs"}; reads {"peers": {peer: addrs}} (every worker, itself included); prints {"event":
"progress", ...} per report and {"event": "done", "peer", ...summary}, then keeps serving until
{"shutdown": true} (so a peer still finishing the last round never finds it gone). Errors print
{"event": "error", "message"} (exit 1).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from ml.allreduce import AllReduceGroup, TcpTransport
from ml.compute import ready_protocol
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.compute.local_job import TRANSPORTS
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


def tcp_name(rank: int) -> str:
    return f"worker-{rank}"


async def work(rank: int, world: int, mode: str, transport_name: str) -> None:
    spec = TrainSpec.from_dict(await read_message())
    host: Host | None = None
    group: AllReduceGroup | None = None
    transport: TcpTransport | HostTransport
    if transport_name == "tcp":
        me = tcp_name(rank)
        transport = TcpTransport(me)
        addrs: list = list(await transport.start())
        # up before anyone learns our address: a stream for an unset protocol is reset
        group = make_group(spec, transport, me, [tcp_name(r) for r in range(world)], LOCAL_TASK_ID, mode)
        await group.start()
    else:
        host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
        await host.start()
        me, addrs, transport = host.peer_id, host.listen_addrs, HostTransport(host)
    ready: set[bytes] = set()
    try:
        if host is not None:
            host.set_handler(ready_protocol.PROTOCOL, ready_protocol.make_handler(ready.__contains__))
        emit("listening", rank=rank, peer=me, pid=os.getpid(), addrs=addrs)
        peers = (await read_message())["peers"]
        for peer, peer_addrs in peers.items():
            if peer == me:
                continue
            if isinstance(transport, TcpTransport):
                transport.addresses[peer] = tuple(peer_addrs)
            elif host is not None:
                host.peerbook.add_addrs(peer, peer_addrs)
        workers = sorted(peers)
        if group is None:
            group = make_group(spec, transport, me, workers, LOCAL_TASK_ID, mode)
            await group.start()
        feed = ProgressFeed()
        feed.subscribe(lambda progress: emit("progress", **progress.to_dict()))
        trainer = await asyncio.to_thread(prepare_trainer, spec, group, workers.index(me), len(workers), feed)
        if host is not None:
            ready.add(LOCAL_TASK_ID)
            await ready_protocol.wait_until_ready(host, [p for p in workers if p != me], LOCAL_TASK_ID,
                                                  READY_TIMEOUT_S)
        emit("done", peer=me, **await train_to_end(trainer))
        await read_message()  # shutdown: every worker is done
    finally:
        if group is not None:
            await group.close()
        await transport.close()
        if host is not None:
            await host.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="one worker of a local training job")
    parser.add_argument("--rank", type=int, required=True, help="index of this process (for messages)")
    parser.add_argument("--world", type=int, required=True, help="how many workers the job has")
    parser.add_argument("--mode", default="butterfly", choices=("butterfly", "ring"))
    parser.add_argument("--transport", default="p2p", choices=TRANSPORTS)
    args = parser.parse_args()
    try:
        asyncio.run(work(args.rank, args.world, args.mode, args.transport))
    except Exception as exc:  # reported to the parent, which decides what the job's failure means
        emit("error", rank=args.rank, message=f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
