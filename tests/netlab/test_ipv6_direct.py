"""IPv6 beside NATed IPv4 (ADR 0224): two homes whose IPv4 NATs map every flow to a random port stay
relayed over IPv4 (no punch meets both), but each also has a global IPv6 address behind its router's
stateful firewall; the hole punch offers those too and the simultaneous open over IPv6 goes direct."""
from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.netlab.lab import Lab, run, unavailable
from devtools.netlab.nat_matrix import run_matrix

pytestmark = pytest.mark.netlab


def test_two_random_symmetric_nats_with_ipv6_end_direct_over_ipv6():
    why = unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(("symmetric+v6",))
    result = out["by_pair"]["symmetric+v6/symmetric+v6"]
    assert result["direct"], out
    assert result["remote"].startswith("2001:db8:"), out     # the path is IPv6, not a lucky IPv4 punch


LISTEN = ("import socket,time\ns=socket.socket(socket.AF_INET6)\n"
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('::', 9))\ns.listen(4)\nprint('up', flush=True)\ntime.sleep(20)\n")


def connect(ns: str, address: str) -> str:
    probe = ("import socket\ns=socket.socket(socket.AF_INET6)\ns.settimeout(5)\n"
             f"try:\n    s.connect(({address!r}, 9))\n    print('open')\n"
             "except ConnectionRefusedError:\n    print('refused')\nexcept OSError:\n    print('dropped')\n")
    return run("python3", "-c", probe, ns=ns).strip()


def test_the_ipv6_firewall_drops_what_the_home_did_not_ask_for():
    """A backbone host cannot open a connection to a home's IPv6 address (the router drops it), while
    the home opens one to the backbone host: the firewall is stateful, not open and not closed."""
    why = unavailable()
    if why:
        pytest.skip(why)
    lab = Lab().build(["pub"], ["port-restricted+v6"])
    listeners = []
    try:
        home, pub = lab.homes[0], lab.ns_of("pub")
        assert home.ip6 == "2001:db8:1::2"
        for ns in (home.ns, pub):
            proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", LISTEN],
                                    stdout=subprocess.PIPE, text=True)
            listeners.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert connect(home.ns, "2001:db8:ff::10") == "open"      # out: allowed
        assert connect(pub, home.ip6) == "dropped"                # in, unsolicited: filtered
    finally:
        for proc in listeners:
            proc.kill()
            proc.wait()
        lab.teardown()
