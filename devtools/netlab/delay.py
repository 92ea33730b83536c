"""A userspace delay line for the netlab (netem does not exist in this kernel).

``python delay.py IF_A IF_B DELAY_MS`` runs inside a "wire" namespace holding two veth ends and
forwards every Ethernet frame that arrives on one interface out of the other ``DELAY_MS`` later,
in arrival order, through AF_PACKET raw sockets. The lab caps GSO on the interfaces that feed it
(``gso_max_segs 1``) so frames never exceed the MTU. Veths leave TCP checksums to "hardware"
(checksum offload), which raw sockets do not do, so the line computes IPv4 TCP checksums itself.
It is for latency, not bulk: a Python
forwarder moves a few hundred Mbit/s at best. It prints ``READY`` once both sockets are bound and
exits when stdin closes.
"""
from __future__ import annotations

import collections
import os
import select
import socket
import sys
import time

import numpy

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
MAX_FRAME = 65535
MAX_QUEUED = 100_000  # frames in flight per direction; beyond this, drop like a full queue


def ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = int(numpy.frombuffer(data, dtype=">u2").sum(dtype=numpy.uint64))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def with_tcp_checksum(frame: bytes) -> bytes:
    """The frame with its IPv4 TCP checksum computed (other frames unchanged)."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
        return frame
    ihl = (frame[14] & 0x0F) * 4
    start, end = 14 + ihl, 14 + int.from_bytes(frame[16:18], "big")
    if end > len(frame) or end - start < 20:
        return frame
    segment = bytearray(frame[start:end])
    segment[16:18] = b"\0\0"
    pseudo = frame[26:34] + b"\x00\x06" + (end - start).to_bytes(2, "big")
    checksum = ~ones_complement_sum(pseudo + bytes(segment)) & 0xFFFF
    return frame[:start + 16] + checksum.to_bytes(2, "big") + frame[start + 18:]


def open_raw(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


def run(if_a: str, if_b: str, delay: float) -> None:
    a, b = open_raw(if_a), open_raw(if_b)
    peer = {a: b, b: a}
    queues: dict[socket.socket, collections.deque] = {a: collections.deque(), b: collections.deque()}
    stdin = sys.stdin.fileno()
    print("READY", flush=True)
    while True:
        now = time.monotonic()
        for out, queue in queues.items():
            while queue and queue[0][0] <= now:
                _due, frame = queue.popleft()
                try:
                    out.send(frame)
                except (BlockingIOError, OSError):
                    pass  # a full device queue drops the frame, as a real link would
        due = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        readable, _, _ = select.select([a, b, stdin], [], [], timeout)
        if stdin in readable and not os.read(stdin, 4096):
            return
        for sock in (a, b):
            if sock not in readable:
                continue
            while True:
                try:
                    frame, addr = sock.recvfrom(MAX_FRAME)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue  # our own transmissions, seen on the way out
                queue = queues[peer[sock]]
                if len(queue) < MAX_QUEUED:
                    queue.append((time.monotonic() + delay, with_tcp_checksum(frame)))


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1000.0)
