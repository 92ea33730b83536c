"""Classify a netlab home's NAT the way RFC 4787 defines it, with UDP probes (ADR 0194).

``probe(lab, home, (a, b, c))``: reflectors on public hosts ``a`` (ports 3478 and 3479) and ``b``
(3478) answer each datagram with the address they saw it from; the home sends from one local port
to a:3478 and b:3478 and learns both mappings (equal: endpoint-independent mapping). Then, with
the home still listening on that port, a:3478 (contacted address and port), a:3479 (contacted
address, other port) and ``c`` (never contacted) each send to the mapping seen by a; which of
them reach the home gives the filtering. ``tcp_mappings(lab, home, (a, b))`` is the TCP side of the
mapping test: the home connects from one local port to TCP reflectors on ``a`` and ``b`` and learns
the two mappings (None where a connection failed). Run as a script, this module is the probe's
namespace side: ``reflect PORT..``, ``home PORT HOST:PORT.. WAIT_S``, ``send FROM_PORT HOST PORT``,
``tcp-reflect PORT`` and ``tcp-home PORT HOST:PORT..``. Every wait is bounded.
"""
from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lab import Home, Lab

SCRIPT = Path(__file__).resolve()
STUN_PORT, OTHER_PORT, HOME_PORT = 3478, 3479, 40000
LISTEN_S = 2.0


def _socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("0.0.0.0", port))
    return sock


def reflect(ports: list[int]) -> None:
    socks = [_socket(p) for p in ports]
    print("READY", flush=True)
    while True:
        readable, _, _ = select.select(socks, [], [], 30.0)
        if not readable:
            return
        for sock in readable:
            _, (ip, port) = sock.recvfrom(2048)
            sock.sendto(f"{ip}:{port}".encode(), (ip, port))


def home(port: int, servers: list[str], wait_s: float) -> None:
    sock = _socket(port)
    mappings = []
    for server in servers:
        host, sport = server.rsplit(":", 1)
        seen = None
        for _ in range(5):
            sock.sendto(b"map", (host, int(sport)))
            if select.select([sock], [], [], 0.3)[0]:
                seen = sock.recvfrom(2048)[0].decode()
                break
        mappings.append(seen)
    print(json.dumps({"mappings": mappings}), flush=True)
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            data, (ip, sport) = sock.recvfrom(2048)
            if data.startswith(b"knock"):
                print(json.dumps({"from": f"{ip}:{sport}"}), flush=True)


def send(from_port: int, host: str, port: int) -> None:
    sock = _socket(from_port)
    for _ in range(3):
        sock.sendto(b"knock", (host, port))
        time.sleep(0.05)


def tcp_reflect(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(16)
    print("READY", flush=True)
    while select.select([listener], [], [], 30.0)[0]:
        conn, (ip, sport) = listener.accept()
        with conn:
            conn.sendall(f"{ip}:{sport}".encode())


def tcp_home(port: int, servers: list[str]) -> None:
    """Connect to each server from local ``port`` (all kept open: one port, distinct flows)."""
    mappings, socks = [], []
    for server in servers:
        host, sport = server.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("0.0.0.0", port))
        sock.settimeout(3.0)
        socks.append(sock)
        try:
            sock.connect((host, int(sport)))
            mappings.append(sock.recv(64).decode() or None)
        except OSError:
            mappings.append(None)
    for sock in socks:
        sock.close()
    print(json.dumps({"mappings": mappings}), flush=True)


def _exec(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, str(SCRIPT), *args]


def probe(lab: Lab, record: Home, publics: tuple[str, str, str]) -> dict:
    """The home's two mappings and which knocks came through (see the module docstring)."""
    a, b, c = publics
    reflectors = [subprocess.Popen(_exec(lab.ns_of(a), "reflect", str(STUN_PORT), str(OTHER_PORT)),
                                   stdout=subprocess.PIPE, text=True),
                  subprocess.Popen(_exec(lab.ns_of(b), "reflect", str(STUN_PORT)), stdout=subprocess.PIPE, text=True)]
    try:
        for proc in reflectors:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("a reflector did not start")
        servers = [f"{lab.public[a]}:{STUN_PORT}", f"{lab.public[b]}:{STUN_PORT}"]
        homep = subprocess.Popen(_exec(record.ns, "home", str(HOME_PORT), *servers, str(LISTEN_S)),
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert homep.stdout is not None
            mappings = json.loads(homep.stdout.readline())["mappings"]
            if mappings[0] is not None:
                ip, port = mappings[0].rsplit(":", 1)
                for ns, from_port in ((a, STUN_PORT), (a, OTHER_PORT), (c, 5000)):
                    subprocess.run(_exec(lab.ns_of(ns), "send", str(from_port), ip, port), timeout=10, check=True)
            out, _ = homep.communicate(timeout=LISTEN_S + 10)
        finally:
            homep.kill()
            homep.wait(5)
    finally:
        for proc in reflectors:
            proc.kill()
            proc.wait(5)
    knocks = {json.loads(line)["from"] for line in out.splitlines() if line.strip()}
    return {"mappings": mappings,
            "from_contacted": f"{lab.public[a]}:{STUN_PORT}" in knocks,
            "from_other_port": f"{lab.public[a]}:{OTHER_PORT}" in knocks,
            "from_third_party": f"{lab.public[c]}:5000" in knocks}


def tcp_mappings(lab: Lab, record: Home, publics: tuple[str, str]) -> list[str | None]:
    """The home's TCP mappings towards two public hosts, seen from one local port (see the docstring)."""
    reflectors = [subprocess.Popen(_exec(lab.ns_of(host), "tcp-reflect", str(STUN_PORT)), stdout=subprocess.PIPE,
                                   text=True) for host in publics]
    try:
        for proc in reflectors:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("a TCP reflector did not start")
        servers = [f"{lab.public[host]}:{STUN_PORT}" for host in publics]
        out = subprocess.run(_exec(record.ns, "tcp-home", str(HOME_PORT), *servers), capture_output=True, text=True,
                             timeout=20, check=True).stdout
    finally:
        for proc in reflectors:
            proc.kill()
            proc.wait(5)
    return json.loads(out.splitlines()[-1])["mappings"]


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "reflect":
        reflect([int(p) for p in args])
    elif mode == "home":
        home(int(args[0]), args[1:-1], float(args[-1]))
    elif mode == "send":
        send(int(args[0]), args[1], int(args[2]))
    elif mode == "tcp-reflect":
        tcp_reflect(int(args[0]))
    elif mode == "tcp-home":
        tcp_home(int(args[0]), args[1:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
