"""Run this thread (and the subprocesses it starts) in a fresh network namespace whose loopback
also carries a globally routable-looking address, for peers that refuse private addresses.

js-libp2p's DCUtR drops every private address (127.0.0.0/8 included, @libp2p/utils isPrivate), so
a hole punch between peers on 127.0.0.1 never dials; inside the namespace all peers share
``PUBLIC_IP`` on its loopback, which nothing outside can reach. Needs root and iproute2."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator

PUBLIC_IP = "7.7.7.1"  # only inside the namespace
_CLONE_NEWNET = 0x40000000


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    return None


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def public_loopback_netns() -> Iterator[str]:
    """Inside: this thread's sockets live in a new namespace (``lo`` up, ``PUBLIC_IP`` on it)."""
    name = f"dkjsi{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{PUBLIC_IP}/32", "dev", "lo"], check=True)
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield PUBLIC_IP
        finally:
            _setns(home)
    finally:
        os.close(home)
        subprocess.run(["ip", "netns", "delete", name], check=False)
