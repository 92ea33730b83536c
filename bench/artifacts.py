"""Artifact download benchmark in the netlab: one artifact from 1 and from 3 holders.

Network namespaces (devtools/netlab/lab.py): three holders on public hosts whose uplinks are capped
at ``--link-mbit`` (``tc tbf`` on their egress), and a downloader whose own link is not capped (so
the holders' uplinks are the bottleneck). Each holder is a real Node (devtools/netlab/artifact_agent.py)
holding the same ``--size-mb`` artifact (hard links of one seeded store); a fresh downloader Node
fetches it first from one holder, then (a new downloader, empty store) from all three at once.
Rates count the artifact's bytes over the fetch's wall time (manifest, verification and the final
fsync included), 10^6 bits per Mbit. Needs root, iproute2, nftables and tc.

  python bench/artifacts.py [--size-mb 1024] [--link-mbit 100]

Last line: {"link_mbit", "size_mb", "one_holder_Mbps", "three_holders_Mbps", "one_holder_link_fraction",
"three_vs_one", ...}; {"skipped": reason} where no lab can be built.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.netlab.artifact_net import link_into, seed_store, start_agent  # noqa: E402
from devtools.netlab.lab import Lab, shape, unavailable  # noqa: E402

HOLDERS = ("h1", "h2", "h3")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fetch(lab: Lab, work: Path, name: str, port: int, artifact: str, holders: list, timeout: float) -> dict:
    downloader = start_agent(name, lab.ns_of("dl"), f"/ip4/{lab.public['dl']}/tcp/{port}", work / name)
    try:
        report = downloader.call("fetch", timeout=timeout, artifact=artifact,
                                 holders={h.peer_id: h.addrs for h in holders})
    finally:
        downloader.stop()
    if report["received_bytes"] != report["size"] or report["bad_holders"]:
        raise RuntimeError(f"download incomplete or with bad holders: {report}")
    return report


def measure(size_mb: int, link_mbit: float) -> dict:
    why = unavailable()
    if why:
        return {"skipped": why}
    work = Path(tempfile.mkdtemp(prefix="dekube-bench-artifacts-"))
    lab = Lab().build([*HOLDERS, "dl"], [])
    holders = []
    try:
        for host in HOLDERS:
            shape(lab.ns_of(host), "eth0", link_mbit)
        started = time.monotonic()
        store = work / "seed" / "artifacts"
        artifact = seed_store(store, size_mb)
        log(f"seeded a {size_mb} MiB artifact in {time.monotonic() - started:.1f} s: {artifact}")
        for host in HOLDERS:
            link_into(store, work / host, artifact)
            holders.append(start_agent(host, lab.ns_of(host), f"/ip4/{lab.public[host]}/tcp/4001", work / host))
        timeout = 60 + size_mb * 8 / link_mbit * 3
        one = fetch(lab, work, "dl1", 4001, artifact, holders[:1], timeout)
        log(f"one holder: {one['Mbps']:.1f} Mbit/s ({one['seconds']:.1f} s)")
        three = fetch(lab, work, "dl3", 4002, artifact, holders, timeout)
        log(f"three holders: {three['Mbps']:.1f} Mbit/s ({three['seconds']:.1f} s), per holder "
            f"{[round(b / 2**20) for b in three['per_holder'].values()]} MiB")
        return {"link_mbit": link_mbit, "size_mb": size_mb, "one_holder_Mbps": round(one["Mbps"], 2),
                "three_holders_Mbps": round(three["Mbps"], 2),
                "one_holder_link_fraction": round(one["Mbps"] / link_mbit, 4),
                "three_vs_one": round(three["Mbps"] / one["Mbps"], 3),
                "one_holder_s": round(one["seconds"], 2), "three_holders_s": round(three["seconds"], 2),
                "three_holders_MiB_each": [round(b / 2**20, 1) for b in three["per_holder"].values()]}
    finally:
        for holder in holders:
            holder.stop()
        lab.teardown()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="artifact size in MiB")
    parser.add_argument("--link-mbit", type=float, default=100.0, help="each holder's uplink")
    args = parser.parse_args()
    result = measure(args.size_mb, args.link_mbit)
    result["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
