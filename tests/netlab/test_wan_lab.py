"""The WAN lab: a delay switch gives every pair of namespaced hosts its own one-way delay, and real
validator processes commit over it no faster than the delays allow (the process cross-check of the
consensus simulator, bench/wan_processes.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.wan_lab import WanLab

pytestmark = pytest.mark.skipif(unavailable(nat=False) is not None, reason=str(unavailable(nat=False)))

ECHO_SERVER = ("import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "s.bind(('0.0.0.0', 5001))\ns.listen()\nprint('up', flush=True)\nc, _ = s.accept()\nn = 0\n"
               "while True:\n    d = c.recv(65536)\n    if not d:\n        break\n    n += len(d)\n"
               "    if n == 4:\n        c.sendall(b'pong')\nprint(n, flush=True)\n")
PINGER = ("import socket, sys, time\ns = socket.create_connection((sys.argv[1], 5001), timeout=10)\n"
          "t = time.monotonic()\ns.sendall(b'ping')\nassert s.recv(4) == b'pong'\nrtt = time.monotonic() - t\n"
          "s.sendall(b'x' * 1_000_000)\ns.close()\nprint(round(rtt * 1000, 1))\n")


def rtt_and_bytes(lab: WanLab, src: int, dst: int) -> tuple[float, int]:
    server = subprocess.Popen(["ip", "netns", "exec", lab.ns(dst), sys.executable, "-c", ECHO_SERVER],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        ping = subprocess.run(["ip", "netns", "exec", lab.ns(src), sys.executable, "-c", PINGER, lab.hosts[dst]],
                              capture_output=True, text=True, timeout=60)
        assert ping.returncode == 0, ping.stderr
        received = int(server.communicate(timeout=60)[0].strip())
        return float(ping.stdout.strip()), received
    finally:
        server.kill()
        server.wait()


def test_each_pair_of_hosts_gets_its_own_delay_and_tcp_arrives_whole():
    lab = WanLab().build_wan([[0, 30, 80], [30, 0, 5], [80, 5, 0]])
    try:
        for (src, dst), one_way in {(0, 1): 30, (0, 2): 80, (2, 1): 5}.items():
            rtt, received = rtt_and_bytes(lab, src, dst)
            assert 2 * one_way <= rtt < 2 * one_way + 150, (src, dst, rtt)
            assert received == 4 + 1_000_000     # in order and complete through the switch
    finally:
        lab.teardown()
    assert not any(name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                   for name in (lab.ns(0), lab.ns_of("sw")))


def test_a_bad_delay_matrix_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="N x N"):
        WanLab().build_wan([[0, 10], [10]])
    with pytest.raises(ValueError, match=">= 0"):
        WanLab().build_wan([[0, -1], [1, 0]])


@pytest.mark.skipif(os.environ.get("DEKUBE_SLOW") != "1",
                    reason="real validator processes over the WAN lab: DEKUBE_SLOW=1")
def test_real_validators_commit_over_the_wan_no_faster_than_its_delays():
    from devtools.netlab.wan_validators import delay_matrix, run_processes

    matrix = delay_matrix(3)      # us-east-1, us-west-1, eu-west-1: one-way 32.5, 35 and 65 ms
    figures = run_processes(3, seconds=10, warmup=2, tx_rate=2)
    assert figures["heights"] >= 5 and figures["commits"] >= 3 * 5 - 3
    assert figures["transfers_sent"] >= 10
    # all three must precommit (> 2/3 of three equal stakes): a block cannot be stored before its
    # proposal reached the others and their precommits came back over at least the shortest link
    shortest = min(matrix[i][j] for i in range(3) for j in range(3) if i != j)
    assert figures["finality_p50_ms"] >= 2 * shortest
    assert figures["finality_p50_ms"] < 3000 and figures["rounds_mean"] is not None
