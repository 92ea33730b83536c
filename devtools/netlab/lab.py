"""An emulated internet in network namespaces: a backbone, public hosts, and homes behind NAT routers.

Layout (every namespace name starts with the lab's unique prefix, ``dk<pid>n`` by default):
  ``<p>bb``        the backbone: a bridge ``br0``; public subnet 10.99.0.0/24 lives on it
  ``<p><name>``    a public host (relays, a public peer): ``eth0`` on the bridge, 10.99.0.<n>
  ``<p>r<i>``      home i's NAT router: ``eth0`` on the bridge (10.99.0.<100+i>), ``lan`` to the home
  ``<p>h<i>``      home i: ``eth0`` = 192.168.<i>.2/24, default route via the router's 192.168.<i>.1
  ``<p>w<port>``   a delay line between a host (or router) and its bridge port, where asked for
  ``<p>r<i>`` of an ``upnp`` home: WAN address 11.99.0.<100+i> (miniupnpd forwards only from a
                   public-looking address; every backbone host has an on-link route to 11.99.0.0/24)
  ``<p>c<i>``      home i's carrier NAT, for the ``cgnat`` kind only: ``eth0`` on the bridge
                   (10.99.0.<100+i>), ``sub`` to the home router, whose WAN is then 100.64.<i>.2/24
Routers NAT the home's traffic with nftables; which inbound packets pass depends on the NAT kind
(``nat_zoo.py``: full cone, restricted, port restricted (alias ``eim``), symmetric with
sequential or random ports, CGNAT, UDP blocked, ...). A kind with the suffix ``+v6`` (``symmetric+v6``) also gives
the home a global IPv6 address beside its NATed IPv4 (ADR 0224): the backbone carries
2001:db8:ff::/64 (public hosts ``::<n>``, routers ``::<100+i>``), home i has 2001:db8:<i>::2/64,
routed (not NATed) by its router behind a stateful firewall (``nat_zoo.IPV6_FIREWALL``: replies to
what the home sent pass, unsolicited inbound does not, as RFC 6092 asks of home routers).
``eim`` maps each home port to the same public port for every
destination so hole punching works; ``symmetric`` draws a random public port per connection
(``masquerade fully-random``) so it does not. Home links get ``tc tbf`` caps in both directions
(upload on the router's WAN port, download on the router's LAN port). A home's WAN link or a
public host's link can pass a userspace delay line (``delay.py``) for latency.

Veth pairs are created from inside the lab's namespaces (never in the host's namespace); teardown
deletes every namespace made (also at interpreter exit and on SIGTERM); a new lab first deletes
namespaces of earlier labs whose process is gone (SIGKILLed runs). ``unavailable()`` says why a
lab cannot be built here (not root, no ip/nft/tc, no namespaces), for a clean skip.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import upnp
from .nat_zoo import IPV6_FIREWALL, KINDS, home_rules

BACKBONE_NET = "10.99.0"
BACKBONE_V6 = "2001:db8:ff:"
V6_SUFFIX = "+v6"
DELAY_LINE = Path(__file__).resolve().parent / "delay.py"
TBF_BURST = "256kb"       # at least one GSO segment (64 KiB) per token refill
TBF_LATENCY = "50ms"


class LabError(RuntimeError):
    """A lab command failed (the message holds the command and its stderr)."""


def unavailable(nat: bool = True) -> str | None:
    """None if namespaces (with NAT routers, unless ``nat`` is false) can be built here, else the
    reason (also when root lacks the capabilities, as in an unprivileged container: a probe
    namespace is made and deleted)."""
    if os.geteuid() != 0:
        return "netlab needs root (network namespaces)"
    for tool in ("ip", "nft", "tc") if nat else ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"netlab needs `{tool}` (apt-get install -y nftables iproute2)"
    probe = f"dk{os.getpid() % 100000}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create network namespaces here: {made.stderr.strip()}"
    try:
        rules = subprocess.run(["ip", "netns", "exec", probe, "nft", "add", "table", "ip", "probe"],
                               capture_output=True, text=True) if nat else None
        if rules is not None and rules.returncode != 0:
            return f"nftables does not work in a namespace here: {rules.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def run(*cmd: str, ns: str | None = None, stdin: str | None = None) -> str:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True, input=stdin, timeout=30)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(full)}: {proc.stderr.strip()}")
    return proc.stdout


def shape(ns: str, dev: str, mbit: float, latency: str = TBF_LATENCY) -> None:
    """Cap what ``dev`` in ``ns`` sends at ``mbit`` Mbit/s with ``tc tbf`` (replacing any cap)."""
    run("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit:g}mbit", "burst", TBF_BURST,
        "latency", latency, ns=ns)


def _route_other_subnet(ns: str, ip: str) -> None:
    """An on-link route from a backbone host to the backbone's other subnet (10.99.0.0/24 and the
    ``upnp`` routers' 11.99.0.0/24 share the bridge)."""
    other = BACKBONE_NET if ip.startswith(upnp.PUBLIC_NET + ".") else upnp.PUBLIC_NET
    run("ip", "route", "add", f"{other}.0/24", "dev", "eth0", ns=ns)


STALE_LAB = re.compile(r"^dk(\d+)n[a-z]")


def sweep_stale_labs() -> None:
    """Delete namespaces left by labs whose process is gone (killed before its teardown ran)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = STALE_LAB.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _exit_on_sigterm() -> None:
    """Turn the first SIGTERM into KeyboardInterrupt (where nobody else handles it), which stops a
    pytest session or a script with its finalizers and atexit hooks run; later ones are ignored so
    they cannot cut the teardown short."""
    def on_sigterm(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt("SIGTERM")

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)


@dataclass
class Home:
    index: int
    nat: str            # one of nat_zoo.KINDS
    router_ns: str
    ns: str
    wan_ip: str         # the router's public address
    ip: str             # the home host's private address
    carrier_ns: str | None = None   # the carrier NAT's namespace (``cgnat`` only)
    ip6: str | None = None          # the home host's global IPv6 address (kinds ``...+v6`` only)


@dataclass
class Lab:
    prefix: str = field(default_factory=lambda: f"dk{os.getpid()}n")
    home_rate_mbit: float = 1000.0
    public: dict[str, str] = field(default_factory=dict)     # name -> address
    homes: list[Home] = field(default_factory=list)
    ipv6: bool = False       # the backbone carries IPv6 (set by build when a home kind ends in +v6)
    _namespaces: list[str] = field(default_factory=list)
    _processes: list[subprocess.Popen] = field(default_factory=list)
    _workdirs: list[Path] = field(default_factory=list)

    @property
    def backbone(self) -> str:
        return f"{self.prefix}bb"

    def ns_of(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def _add_ns(self, name: str) -> str:
        run("ip", "netns", "add", name)
        self._namespaces.append(name)
        run("ip", "link", "set", "lo", "up", ns=name)
        if self.ipv6:   # no duplicate address detection: a fresh veth's link-local address is usable at once
            for scope in ("all", "default"):
                run("sysctl", "-qw", f"net.ipv6.conf.{scope}.accept_dad=0", ns=name)
        return name

    def build(self, public_hosts: list[str], home_nats: list[str], delays_ms: list[float] | None = None) -> Lab:
        """Create the backbone, one namespace per public host and one router + home per NAT flavour
        (home i's WAN link delayed by ``delays_ms[i-1]`` ms one way, where given)."""
        why = unavailable(nat=bool(home_nats))
        if why:
            raise LabError(why)
        sweep_stale_labs()
        self.ipv6 = self.ipv6 or any(nat.endswith(V6_SUFFIX) for nat in home_nats)
        atexit.register(self.teardown)
        _exit_on_sigterm()
        try:
            self._add_ns(self.backbone)
            run("ip", "link", "add", "br0", "type", "bridge", ns=self.backbone)
            run("ip", "link", "set", "br0", "up", ns=self.backbone)
            for n, name in enumerate(public_hosts, start=10):
                self.add_public(name, f"{BACKBONE_NET}.{n}")
            delays = list(delays_ms or []) + [0.0] * len(home_nats)
            for i, nat in enumerate(home_nats, start=1):
                self.add_home(i, nat, delays[i - 1])
        except BaseException:
            self.teardown()
            raise
        return self

    def _attach(self, ns: str, port: str, ip: str) -> None:
        """A veth from the bridge (``port``) to ``eth0`` in ``ns`` with ``ip``/24."""
        run("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns, ns=self.backbone)
        run("ip", "link", "set", port, "master", "br0", ns=self.backbone)
        run("ip", "link", "set", port, "up", ns=self.backbone)
        run("ip", "addr", "add", f"{ip}/24", "dev", "eth0", ns=ns)
        run("ip", "link", "set", "eth0", "up", ns=ns)
        _route_other_subnet(ns, ip)

    def _attach_delayed(self, ns: str, port: str, ip: str, delay_ms: float) -> None:
        """``eth0`` in ``ns`` -> a wire namespace (a delay.py process between two veths) -> the bridge."""
        wire = self._add_ns(self.ns_of(f"w{port}"))
        run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "in0", "netns", wire, ns=ns)
        run("ip", "link", "add", port, "type", "veth", "peer", "name", "out0", "netns", wire, ns=self.backbone)
        run("ip", "link", "set", port, "master", "br0", ns=self.backbone)
        # frames entering the wire must fit the MTU: segment GSO packets before they get there
        run("ip", "link", "set", port, "gso_max_segs", "1", "up", ns=self.backbone)
        run("ip", "link", "set", "eth0", "gso_max_segs", "1", ns=ns)
        for dev in ("in0", "out0"):
            run("ip", "link", "set", dev, "up", ns=wire)
        run("ip", "addr", "add", f"{ip}/24", "dev", "eth0", ns=ns)
        run("ip", "link", "set", "eth0", "up", ns=ns)
        _route_other_subnet(ns, ip)
        proc = subprocess.Popen(["ip", "netns", "exec", wire, sys.executable, str(DELAY_LINE), "in0", "out0",
                                 f"{delay_ms:g}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._processes.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "READY":
            raise LabError(f"the delay line in {wire} did not start (rc={proc.poll()})")

    def add_public(self, name: str, ip: str, delay_ms: float = 0.0) -> str:
        """A public host on the backbone; with ``delay_ms``, its link passes a delay line. Returns
        the name of its port on the backbone's bridge."""
        ns = self._add_ns(self.ns_of(name))
        port = f"p{len(self.public)}"
        if delay_ms:
            self._attach_delayed(ns, port, ip, delay_ms)
        else:
            self._attach(ns, port, ip)
        self.public[name] = ip
        if self.ipv6:
            run("ip", "-6", "addr", "add", f"{BACKBONE_V6}:{ip.rsplit('.', 1)[1]}/64", "dev", "eth0", "nodad", ns=ns)
            for home in self.homes:
                if home.ip6 is not None:
                    self._route_v6(ns, home.index)
        return port

    @staticmethod
    def _route_v6(ns: str, i: int) -> None:
        """In ``ns`` (on the backbone): home i's IPv6 prefix is reached through its router."""
        run("ip", "-6", "route", "add", f"2001:db8:{i}::/64", "via", f"{BACKBONE_V6}:{100 + i}", ns=ns)

    def _add_ipv6(self, router: str, home: str, i: int) -> str:
        """Give home i a global IPv6 address, routed by its router behind a stateful firewall; the
        backbone's hosts and the other IPv6 routers route its prefix to this router."""
        address = f"2001:db8:{i}::2"
        run("ip", "-6", "addr", "add", f"{BACKBONE_V6}:{100 + i}/64", "dev", "eth0", "nodad", ns=router)
        run("ip", "-6", "addr", "add", f"2001:db8:{i}::1/64", "dev", "lan", "nodad", ns=router)
        run("ip", "-6", "addr", "add", f"{address}/64", "dev", "eth0", "nodad", ns=home)
        run("ip", "-6", "route", "add", "default", "via", f"2001:db8:{i}::1", ns=home)
        run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", ns=router)
        run("nft", "-f", "-", ns=router, stdin=IPV6_FIREWALL)
        for name in self.public:
            self._route_v6(self.ns_of(name), i)
        for other in self.homes:
            if other.ip6 is not None:
                self._route_v6(other.router_ns, i)
                self._route_v6(router, other.index)
        return address

    def add_home(self, i: int, nat: str, delay_ms: float = 0.0) -> Home:
        """Home ``i`` behind a ``nat`` router; with ``delay_ms``, its WAN link passes a delay line
        that adds that much one-way latency in each direction."""
        flavour = nat.removesuffix(V6_SUFFIX)
        if flavour not in KINDS:
            raise ValueError(f"unknown NAT flavour {nat!r}")
        if flavour == "upnp" and (why := upnp.unavailable()):
            raise LabError(why)
        router, home = self._add_ns(self.ns_of(f"r{i}")), self._add_ns(self.ns_of(f"h{i}"))
        wan_ip = f"{upnp.PUBLIC_NET if flavour == 'upnp' else BACKBONE_NET}.{100 + i}"
        lan_net = f"192.168.{i}"
        carrier = self._add_ns(self.ns_of(f"c{i}")) if flavour == "cgnat" else None
        edge = carrier or router    # the namespace holding the public address
        if delay_ms:
            self._attach_delayed(edge, f"r{i}", wan_ip, delay_ms)
        else:
            self._attach(edge, f"r{i}", wan_ip)
        router_wan = wan_ip
        if carrier is not None:
            router_wan = f"100.64.{i}.2"
            self._link(carrier, "sub", f"100.64.{i}.1", router, "eth0", router_wan)
            run("ip", "route", "add", "default", "via", f"100.64.{i}.1", ns=router)
            run("ip", "route", "add", f"{lan_net}.0/24", "via", router_wan, ns=carrier)
            run("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=carrier)
            run("nft", "-f", "-", ns=carrier, stdin=home_rules("port-restricted", wan_ip, router_wan, lan="sub"))
        self._link(router, "lan", f"{lan_net}.1", home, "eth0", f"{lan_net}.2")
        run("ip", "route", "add", "default", "via", f"{lan_net}.1", ns=home)
        run("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=router)
        kind = "port-restricted" if flavour == "cgnat" else flavour
        run("nft", "-f", "-", ns=router, stdin=home_rules(kind, router_wan, f"{lan_net}.2"))
        for dev in ("eth0", "lan"):
            shape(router, dev, self.home_rate_mbit)
        if flavour == "upnp":
            proc, workdir = upnp.start(router, lan_net)
            self._processes.append(proc)
            self._workdirs.append(workdir)
        ip6 = None
        if nat.endswith(V6_SUFFIX):
            if carrier is not None or delay_ms:
                raise ValueError(f"{nat!r}: IPv6 is built for a home router on the backbone (no CGNAT, no delay)")
            self.ipv6 = True
            ip6 = self._add_ipv6(router, home, i)
        record = Home(i, nat, router, home, wan_ip, f"{lan_net}.2", carrier, ip6)
        self.homes.append(record)
        return record

    @staticmethod
    def _link(ns_a: str, dev_a: str, ip_a: str, ns_b: str, dev_b: str, ip_b: str) -> None:
        """A veth from ``dev_a`` in ``ns_a`` to ``dev_b`` in ``ns_b``, /24 addresses, both up."""
        run("ip", "link", "add", dev_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b, ns=ns_a)
        for ns, dev, ip in ((ns_a, dev_a, ip_a), (ns_b, dev_b, ip_b)):
            run("ip", "addr", "add", f"{ip}/24", "dev", dev, ns=ns)
            run("ip", "link", "set", dev, "up", ns=ns)

    def teardown(self) -> None:
        """Stop the delay lines and delete every namespace this lab made (veths, bridge and rules go
        with them)."""
        try:
            while self._processes:
                proc = self._processes.pop()
                proc.kill()
                proc.wait(10)
        finally:
            self._delete_namespaces()
            while self._workdirs:
                shutil.rmtree(self._workdirs.pop(), ignore_errors=True)

    def _delete_namespaces(self) -> None:
        while self._namespaces:
            subprocess.run(["ip", "netns", "del", self._namespaces.pop()], capture_output=True)
