"""Relay benchmark, netlab part: direct vs relayed rate between NAT'd homes on 1 Gbit/s tbf links,
and relay failover time. Needs root, iproute2, nftables and tc (see devtools/netlab/lab.py).

  netlab_figures(mib, rate_mbit) -> {
    netlab_direct_Mbps:   home A -> home B on the hole-punched direct connection,
    netlab_relayed_Mbps:  home A -> relay -> home B on a relayed bulk connection,
    netlab_relayed_vs_direct, netlab_link_Mbit,
    netlab_punch_s:       relayed dial + DCUtR until the direct connection is up (independent-mapping NATs),
    netlab_*_cpu_bound_Mbps: bits over the CPU seconds of the busiest process on the path (sender,
                          relay, receiver): the rate with a core per process, as on real hosts
    failover_s:           a 256 MiB transfer over two relays, the carrying relay SIGKILLed after
                          32 MiB: seconds from the kill until the receiver gets bytes again,
    failover_silent_s:    the same (128 MiB, after 16 MiB) when the relay's link is cut instead, so
                          nothing signals the death: the sender's default (adaptive) stall timer
                          plus at most the relay client's dial stagger }
Both failover figures use the default settings (``send_resumable`` without ``stall_timeout``).
Every rate counts ``mib`` MiB (10^6 bits per Mbit) until the receiver acknowledged the last byte,
data checked by SHA-256. ``bench/relay.py`` merges these keys into its JSON line; run alone this
prints its own JSON object as the last line: ``python bench/relay_netlab.py [--mib 256]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.netlab.lab import BACKBONE_NET, run, unavailable  # noqa: E402
from devtools.netlab.net import PORT, Net  # noqa: E402
from devtools.netlab.scenarios import circuits_via, failover, measure, punch  # noqa: E402


def cut_link(node) -> None:
    run("ip", "link", "set", "eth0", "down", ns=node.ns)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def netlab_figures(mib: int = 256, rate_mbit: float = 1000.0) -> dict:
    """Build a lab, measure, tear it down; {"netlab_skipped": reason} where no lab can be built."""
    why = unavailable()
    if why:
        return {"netlab_skipped": why}
    net = Net.build(home_rate_mbit=rate_mbit)
    try:
        relay1 = net.start_relay("relay1", "relay1")
        a, b = net.start_home("a", 1), net.start_home("b", 2)
        punched = punch(a, b, relay1)
        if not punched["conn"]["direct"]:
            raise RuntimeError(f"hole punch between independent-mapping NATs failed: {punched}")
        log(f"hole punch: {punched['seconds']:.2f} s from the relayed dial to a direct connection")
        direct = measure(a, b, punched["conn"]["conn"], mib)
        log(f"netlab direct: {direct['Mbps']:.0f} Mbit/s ({direct['cpu_bound_Mbps']:.0f} CPU-bound)")
        relayed_conn = a.call("connect", circuits=circuits_via(b.call("reserve", relay=relay1.addr), relay1))
        relayed = measure(a, b, relayed_conn["conn"], mib, (relay1,))
        log(f"netlab relayed: {relayed['Mbps']:.0f} Mbit/s ({relayed['cpu_bound_Mbps']:.0f} CPU-bound)")
        spare = [net.start_relay("fo1", "relay1", PORT + 10), net.start_relay("fo2", "relay2", PORT + 10)]
        out = failover(a, b, spare, mib=256, kill_after_mib=32)
        if out["received"]["sha256"] != out["sent"]["sha256"]:
            raise RuntimeError("failover transfer corrupted")
        log(f"failover: {out['failover_s']:.2f} s (resumed at {out['sent']['starts'][-1]} bytes)")
        silent = []
        for n, host in enumerate(("silent1", "silent2")):
            net.lab.add_public(host, f"{BACKBONE_NET}.{30 + n}")
            silent.append(net.start_relay(host, host))
        quiet = failover(a, b, silent, mib=128, kill_after_mib=16, kill=cut_link)
        if quiet["received"]["sha256"] != quiet["sent"]["sha256"]:
            raise RuntimeError("silent-failover transfer corrupted")
        log(f"failover, relay gone silent: {quiet['failover_s']:.2f} s")
        return {"netlab_direct_Mbps": direct["Mbps"], "netlab_relayed_Mbps": relayed["Mbps"],
                "netlab_relayed_vs_direct": relayed["Mbps"] / direct["Mbps"],
                "netlab_direct_cpu_bound_Mbps": direct["cpu_bound_Mbps"],
                "netlab_relayed_cpu_bound_Mbps": relayed["cpu_bound_Mbps"],
                "netlab_link_Mbit": rate_mbit, "netlab_punch_s": punched["seconds"], "failover_s": out["failover_s"],
                "failover_silent_s": quiet["failover_s"]}
    finally:
        net.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    args = parser.parse_args()
    result = {"mib": args.mib, **netlab_figures(args.mib, args.rate_mbit), "load_avg_1m": os.getloadavg()[0]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
