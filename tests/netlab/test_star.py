"""The benchmarks' shaped star (devtools/netlab/star.py): peers reach each other on the backbone,
each link is capped by tbf, tx_bytes counts what a peer sent, and teardown removes every namespace.
Skipped without root and namespaces."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.star import Star

pytestmark = pytest.mark.netlab

PAYLOAD = 2 * 1024 * 1024
RATE_MBIT = 20.0
SINK = """
import socket, sys
server = socket.create_server((sys.argv[1], 5301))
print("READY", flush=True)
conn, _ = server.accept()
got = 0
while chunk := conn.recv(1 << 16):
    got += len(chunk)
print(got, flush=True)
"""
SOURCE = """
import socket, sys
with socket.create_connection((sys.argv[1], 5301), timeout=30) as conn:
    conn.sendall(bytes(int(sys.argv[2])))
"""


def test_star_links_are_shaped_and_counted():
    why = unavailable(nat=False)
    if why:
        pytest.skip(why)
    with Star(2, RATE_MBIT) as star:
        namespaces = set(star.lab._namespaces)
        sink = subprocess.Popen([*star.exec_prefix(1), sys.executable, "-c", SINK, star.address(1)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert sink.stdout.readline().strip() == "READY"
            before = star.tx_bytes(0)
            started = time.monotonic()
            subprocess.run([*star.exec_prefix(0), sys.executable, "-c", SOURCE, star.address(1), str(PAYLOAD)],
                           check=True, timeout=60)
            received = int(sink.stdout.readline())
            elapsed = time.monotonic() - started
        finally:
            sink.kill()
            sink.wait(10)
        assert received == PAYLOAD
        assert star.tx_bytes(0) - before >= PAYLOAD
        # 2 MiB at 20 Mbit/s takes ~0.84 s; unshaped veths move it in milliseconds
        assert elapsed >= 0.6 * PAYLOAD * 8 / (RATE_MBIT * 1e6)
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not namespaces & {line.split()[0] for line in listing.splitlines() if line.split()}
