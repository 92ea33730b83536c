"""A userspace Ethernet switch with a delay per pair of ports, for WAN emulation (netem does not exist here).

``python delay_switch.py MATRIX_JSON IF0 IF1 ...`` runs inside a "wire" namespace holding one veth end
per host and forwards every frame that arrives on port i out of the port that owns its destination MAC
``matrix[i][j]`` milliseconds later (one-way delay of the pair, as CometBFT's QA sets per-link ``tc``
delays from an inter-region table). The switch learns MAC -> port from source addresses; broadcast,
multicast and not-yet-learned frames (ARP) go to every other port at once. Per-pair queues keep each
link's frames in order; a queue over ``MAX_QUEUED`` drops like a full one. Like ``delay.py`` it fills
in IPv4 TCP checksums that veth offload left to "hardware", and the hosts cap GSO (``gso_max_segs 1``)
so frames fit the MTU. For control traffic (consensus), not bulk: a Python forwarder moves tens of
thousands of frames a second. Prints ``READY`` once every socket is bound; exits when stdin closes.
"""
from __future__ import annotations

import contextlib
import heapq
import json
import os
import select
import sys
import time

from delay import MAX_FRAME, PACKET_OUTGOING, open_raw, with_tcp_checksum  # type: ignore[import-not-found]

MAX_QUEUED = 100_000   # frames in flight in the whole switch (beyond: dropped, as a full queue)


def run(matrix: list[list[float]], ifnames: list[str]) -> None:
    if len(matrix) != len(ifnames) or any(len(row) != len(ifnames) for row in matrix):
        raise SystemExit("the delay matrix must be N x N for N interfaces")
    socks = [open_raw(name) for name in ifnames]
    port_of = {sock.fileno(): i for i, sock in enumerate(socks)}
    macs: dict[bytes, int] = {}
    due: list[tuple[float, int, int, bytes]] = []   # (when, sequence, out port, frame): a heap
    sequence = 0
    stdin = sys.stdin.fileno()
    print("READY", flush=True)
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _when, _seq, out, frame = heapq.heappop(due)
            with contextlib.suppress(BlockingIOError, OSError):   # a full device queue drops it, as a link would
                socks[out].send(frame)
        timeout = max(0.0, due[0][0] - time.monotonic()) if due else None
        readable, _, _ = select.select([*socks, stdin], [], [], timeout)
        if stdin in readable and not os.read(stdin, 4096):
            return
        for sock in readable:
            if sock == stdin:
                continue
            src = port_of[sock.fileno()]
            while True:
                try:
                    frame, addr = sock.recvfrom(MAX_FRAME)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING or len(frame) < 14:
                    continue   # our own transmissions, seen on the way out; runts
                macs[frame[6:12]] = src
                dst = macs.get(frame[0:6])
                outs = [dst] if dst is not None and not frame[0] & 1 else \
                    [p for p in range(len(socks)) if p != src]
                arrived = time.monotonic()
                frame = with_tcp_checksum(frame)
                for out in outs:
                    if out == src or len(due) >= MAX_QUEUED:
                        continue
                    delay = matrix[src][out] / 1000.0 if len(outs) == 1 else 0.0
                    sequence += 1
                    heapq.heappush(due, (arrived + delay, sequence, out, frame))


if __name__ == "__main__":
    run(json.loads(sys.argv[1]), sys.argv[2:])
