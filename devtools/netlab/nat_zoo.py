"""The netlab's NAT zoo: one nftables rule set per NAT kind, in RFC 4787's terms (ADR 0194).

Every router has a WAN port ``eth0`` and a LAN port (``lan``); one ``table ip router`` holds its
NAT and filter chains. The kinds (mapping / filtering, and how the rules get there):

``full-cone``        endpoint-independent mapping (masquerade keeps the source port where it is
                     free) and endpoint-independent filtering: each packet the home sends out adds
                     its (protocol, source port) to the dynamic set ``@mapped`` (2 min timeout,
                     refreshed by traffic); an inbound packet from *anyone* to a port in that set
                     is DNATed to the home. The set holds the home's source port, which equals the
                     public port because masquerade kept it (a clash would remap, not seen here).
``restricted``       endpoint-independent mapping, address-dependent filtering: the set
                     ``@contacted`` holds (destination address, protocol, source port); inbound
                     from an address the home has sent to, from any port, is DNATed to the home.
``port-restricted``  endpoint-independent mapping, address-and-port-dependent filtering: plain
                     masquerade and conntrack; only replies to flows the home opened pass.
``eim``              the same rules as ``port-restricted`` (the lab's historical name).
``symmetric-seq``    endpoint-dependent mapping with sequential allocation: every new flow through
                     the router gets the next port of a counter (``snat to WAN : numgen inc mod
                     4096 map { 0 : 20000, .. }``, the map turning 0.. into ports 20000..), whatever its
                     destination; conntrack filtering.
``symmetric``        endpoint-dependent mapping with random allocation (``masquerade
                     fully-random``); conntrack filtering.
``symmetric-tcp``    ``symmetric`` for TCP, ``port-restricted`` for UDP: a router whose UDP mappings
                     are endpoint-independent (RFC 4787's REQ-1) while its TCP ones are random, so a
                     TCP punch with another such home fails and a QUIC one works (ADR 0228).
``udp-blocked``      ``port-restricted`` for TCP, and every UDP datagram through the router dropped, both
                     ways (networks that let only TCP out: no QUIC, no UDP punch; TCP punches as
                     with ``port-restricted``).
``upnp``             ``port-restricted`` rules plus a port-mapping router: miniupnpd (``upnp.py``)
                     answers PCP, NAT-PMP and UPnP-IGD on the LAN and adds the DNAT rules of the
                     mappings a home asks for to its own ``inet filter`` table (ADR 0221).
``cgnat``            two layers: the home router (``port-restricted`` rules, WAN in 100.64.<i>.0/24)
                     behind a carrier NAT (its own namespace, ``port-restricted`` rules too: RFC
                     6888 requires endpoint-independent mapping of a CGN) that holds the public
                     address.

No kind hairpins (a packet from the home to its own public address is not looped back).

A home with IPv6 (the lab's ``+v6`` kinds) is not NATed on it: ``IPV6_FIREWALL`` is its router's
stateful filter (RFC 6092's recommended home router: what the home sends goes out, replies and related
ICMPv6 come back, unsolicited inbound is dropped; ICMPv6 neighbour discovery to the router passes).
"""
from __future__ import annotations

from . import upnp

KINDS = ("full-cone", "restricted", "port-restricted", "eim", "symmetric-seq", "symmetric", "symmetric-tcp", "cgnat",
         "udp-blocked", "upnp")
SET_TIMEOUT = "120s"
SEQ_BASE, SEQ_SPAN = 20000, 4096
IPV6_FIREWALL = """table ip6 firewall {
    chain forward {
        type filter hook forward priority 0; policy drop;
        ct state established,related accept
        iifname "lan" accept
        icmpv6 type { destination-unreachable, packet-too-big, time-exceeded, parameter-problem } accept
    }
}
"""


def home_rules(kind: str, wan_ip: str, home_ip: str, lan: str = "lan") -> str:
    """The nftables script for a router of ``kind`` (for ``cgnat``: the home router's rules; the
    carrier's are ``home_rules("port-restricted", ...)`` with its own ports)."""
    if kind not in KINDS:
        raise ValueError(f"unknown NAT flavour {kind!r} (known: {', '.join(KINDS)})")
    if kind == "upnp":
        return home_rules("port-restricted", wan_ip, home_ip, lan) + upnp.RULES
    l4 = "meta l4proto { tcp, udp }"
    sets, prerouting, forward_track = "", "", ""
    if kind == "udp-blocked":   # first in the forward chain: no UDP flow gets through, either way
        forward_track = "meta l4proto udp drop;"
    if kind == "full-cone":
        sets = f"set mapped {{ type inet_proto . inet_service; flags timeout; timeout {SET_TIMEOUT}; }}"
        prerouting = f'iifname "eth0" {l4} meta l4proto . th dport @mapped dnat to {home_ip};'
        forward_track = f'iifname "{lan}" oifname "eth0" {l4} update @mapped {{ meta l4proto . th sport }};'
    elif kind == "restricted":
        sets = (f"set contacted {{ type ipv4_addr . inet_proto . inet_service; flags timeout; "
                f"timeout {SET_TIMEOUT}; }}")
        prerouting = f'iifname "eth0" {l4} ip saddr . meta l4proto . th dport @contacted dnat to {home_ip};'
        forward_track = (f'iifname "{lan}" oifname "eth0" {l4} '
                         f'update @contacted {{ ip daddr . meta l4proto . th sport }};')
    if kind == "symmetric-seq":  # a map, as numgen's value would reach the port in host byte order
        ports = ", ".join(f"{n} : {SEQ_BASE + n}" for n in range(SEQ_SPAN))
        mapping = f"{l4} snat to {wan_ip} : numgen inc mod {SEQ_SPAN} map {{ {ports} }}; oifname \"eth0\" masquerade"
    elif kind == "symmetric":
        mapping = "masquerade fully-random"
    elif kind == "symmetric-tcp":
        mapping = 'meta l4proto tcp masquerade fully-random; oifname "eth0" masquerade'
    else:
        mapping = "masquerade"
    return f"""
table ip router {{
  {sets}
  chain prerouting {{ type nat hook prerouting priority dstnat; {prerouting} }}
  chain postrouting {{ type nat hook postrouting priority srcnat; oifname "eth0" {mapping}; }}
  chain input {{ type filter hook input priority filter; policy drop;
    ct state established,related accept; iifname {{ "lo", "{lan}" }} accept; }}
  chain forward {{ type filter hook forward priority filter; policy drop;
    {forward_track} ct state established,related accept; ct status dnat accept;
    iifname "{lan}" oifname "eth0" accept; }}
}}
"""
