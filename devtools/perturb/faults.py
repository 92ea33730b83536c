"""The perturbations: each takes the network, a victim and a duration, does its harm, undoes it, and
returns a note (None when nothing unusual happened; the runner counts notes per kind).

kill: SIGKILL, down ``seconds``, start. pause: SIGSTOP for ``seconds``, SIGCONT. restart: SIGTERM
(a node that does not exit within 30 s is SIGKILLed and noted), down ``seconds``, start.
disconnect: the node's links cut for ``seconds`` (namespace link down, or the loopback firewall on
its p2p port). disk_full: the victim's tmpfs data dir filled to the last byte for ``seconds`` and
freed; a node that exited meanwhile is noted with its exit code and started again (it must then
recover like any other victim: a node that corrupted its store does not).
"""
from __future__ import annotations

import errno
import os
import signal
import time

from devtools.perturb.network import Member, PerturbNet

STOP_TIMEOUT = 30.0
FILLER = "perturb-filler.bin"


def kill(net: PerturbNet, victim: Member, seconds: float) -> str | None:
    net.kill(victim)
    time.sleep(seconds)
    net.start(victim)
    return None


def pause(net: PerturbNet, victim: Member, seconds: float) -> str | None:
    net.signal(victim, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        net.signal(victim, signal.SIGCONT)
    return None


def restart(net: PerturbNet, victim: Member, seconds: float) -> str | None:
    started = time.monotonic()
    clean = net.stop(victim, STOP_TIMEOUT)
    took = time.monotonic() - started
    time.sleep(seconds)
    net.start(victim)
    if not clean:
        return f"did not exit within {STOP_TIMEOUT:g} s of SIGTERM"
    code = net.exit_code(victim)
    if code not in (0, None):
        return f"exited with status {code} on SIGTERM"
    return "slow shutdown (>10 s)" if took > 10 else None


def disconnect(net: PerturbNet, victim: Member, seconds: float) -> str | None:
    if net.lab is not None:
        net.lab.cut(victim.name)
        try:
            time.sleep(seconds)
        finally:
            net.lab.restore(victim.name)
    elif net.firewall is not None:
        net.firewall.cut(victim.spec.p2p_port)
        try:
            time.sleep(seconds)
        finally:
            net.firewall.restore()
    else:
        raise RuntimeError("disconnect needs network namespaces or nftables")
    return None


def fill(directory: os.PathLike, chunk: int = 1 << 20) -> int:
    """Write zeros into ``directory``/FILLER until the file system is full; returns bytes written."""
    written = 0
    block = bytes(chunk)
    fd = os.open(os.path.join(directory, FILLER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                n = os.write(fd, block[:chunk])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if chunk == 1:
                    return written
                chunk //= 16
                continue
            written += n
    finally:
        os.close(fd)


def disk_full(net: PerturbNet, victim: Member, seconds: float) -> str | None:
    assert victim.disk is not None
    fill(victim.disk)
    try:
        time.sleep(seconds)
    finally:
        os.unlink(victim.disk / FILLER)
    if net.running(victim):
        return None
    code = net.exit_code(victim)
    net.start(victim)
    return f"exited with status {code} while the disk was full"


FAULTS = {"kill": kill, "pause": pause, "restart": restart, "disconnect": disconnect, "disk_full": disk_full}
