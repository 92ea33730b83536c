"""The gateway this host's default route goes through (``/proc/net/route``), the only device a
node asks for a port mapping, and the local address a packet to it leaves from."""
from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

ROUTES = Path("/proc/net/route")
MAX_ROUTES = 64 * 1024


def default_gateway(table: str | None = None) -> str | None:
    """The IPv4 gateway of the default route in ``table`` (the text of /proc/net/route; read when
    None), or None when there is none."""
    if table is None:
        try:
            with ROUTES.open() as f:
                table = f.read(MAX_ROUTES)
        except OSError:
            return None
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[1] != "00000000":
            continue
        try:
            flags, raw = int(fields[3], 16), int(fields[2], 16)
        except ValueError:
            continue
        if flags & 0x2 and raw:  # RTF_GATEWAY
            return str(ipaddress.IPv4Address(struct.pack("<I", raw)))
    return None


def local_address(gateway: str) -> str:
    """The address this host sends to ``gateway`` from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((gateway, 9))
        return sock.getsockname()[0]
