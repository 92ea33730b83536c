"""The host's own global IPv6 addresses, which a hole punch offers beside its observed IPv4 address
(docs/adr/0224).

A home with IPv6 has no NAT on it: its addresses are the ones a peer dials, behind the router's
stateful firewall (RFC 6092: replies to what the home sent pass, unsolicited inbound does not), which
the same simultaneous open that punches a port-restricted IPv4 NAT passes. ``global_ipv6`` reads the
kernel's address list (``/proc/net/if_inet6``) and keeps global-scope unicast addresses that are usable
(not tentative, deprecated or failed duplicate detection), leaving out unique local (fc00::/7),
link-local, loopback and IPv4-mapped ones. Bounded: at most ``MAX_ADDRESSES``, from a bounded read.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path

IF_INET6 = Path("/proc/net/if_inet6")
MAX_ADDRESSES = 4
MAX_READ_BYTES = 64 * 1024
SCOPE_GLOBAL = 0x00
UNUSABLE_FLAGS = 0x08 | 0x20 | 0x40     # IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE
UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")


def parse_if_inet6(text: str) -> list[str]:
    """The usable global IPv6 addresses in the text of ``/proc/net/if_inet6`` (junk lines skipped)."""
    out: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or len(fields[0]) != 32:
            continue
        try:
            addr = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            scope, flags = int(fields[3], 16), int(fields[4], 16)
        except ValueError:
            continue
        if scope != SCOPE_GLOBAL or flags & UNUSABLE_FLAGS or addr in UNIQUE_LOCAL or addr.is_loopback \
                or addr.is_link_local or addr.is_multicast or addr.ipv4_mapped is not None:
            continue
        if str(addr) not in out:
            out.append(str(addr))
        if len(out) >= MAX_ADDRESSES:
            break
    return out


def global_ipv6(path: Path = IF_INET6) -> list[str]:
    """This host's usable global IPv6 addresses (none where IPv6 is off or the file is unreadable)."""
    try:
        with path.open("rb") as f:
            return parse_if_inet6(f.read(MAX_READ_BYTES).decode("ascii", "replace"))
    except OSError:
        return []
