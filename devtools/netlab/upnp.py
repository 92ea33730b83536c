"""The ``upnp`` router of the NAT zoo (ADR 0221): Debian's miniupnpd (nftables build) in the router's
namespace, speaking PCP, NAT-PMP and UPnP-IGD on the LAN port, in secure mode (a client maps only
its own address) and allowing ports 1024-65535 to the home's subnet only.

miniupnpd refuses to forward when its WAN address is private (10.99.0.0/24, the lab's backbone),
so an ``upnp`` router's WAN address is in ``PUBLIC_NET`` (11.99.0.0/24, same bridge; every host on
the backbone has an on-link route to the other subnet, see lab.py). Its tables: `RULES` (an
``inet filter`` table with the chains miniupnpd fills, as Debian's nft_init.sh makes them),
alongside the router's own ``ip router`` table, whose forward chain already accepts DNATed flows.
Each instance has its own config, pid and lease files in a temporary directory."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

PUBLIC_NET = "11.99.0"
HTTP_PORT = 5000
RULES = """
table inet filter {
  chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }
  chain miniupnpd { }
  chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }
  chain postrouting { type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd; }
  chain prerouting_miniupnpd { }
  chain postrouting_miniupnpd { }
}
"""


def unavailable() -> str | None:
    """None if miniupnpd is installed, else why an ``upnp`` router cannot be built."""
    if shutil.which("miniupnpd") is None and not Path("/usr/sbin/miniupnpd").exists():
        return "the upnp router needs miniupnpd (apt-get install -y miniupnpd)"
    return None


def config(lan_net: str, workdir: Path) -> str:
    return "\n".join([
        "ext_ifname=eth0", "listening_ip=lan", f"http_port={HTTP_PORT}", "enable_natpmp=yes", "enable_upnp=yes",
        "secure_mode=yes", "system_uptime=yes", f"lease_file={workdir / 'leases'}", f"uuid={uuid.uuid4()}",
        "min_lifetime=120", "max_lifetime=86400",
        f"allow 1024-65535 {lan_net}.0/24 1024-65535", "deny 0-65535 0.0.0.0/0 0-65535", ""])


def start(router_ns: str, lan_net: str) -> tuple[subprocess.Popen, Path]:
    """miniupnpd in ``router_ns`` (its rules table is loaded by the caller), once it listens on
    the UPnP HTTP port; returns the process and its work directory."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{router_ns}-upnp-"))
    (workdir / "miniupnpd.conf").write_text(config(lan_net, workdir))
    proc = subprocess.Popen(["ip", "netns", "exec", router_ns, shutil.which("miniupnpd") or "/usr/sbin/miniupnpd",
                             "-d", "-f", str(workdir / "miniupnpd.conf"), "-P", str(workdir / "pid")],
                            stdout=subprocess.DEVNULL, stderr=(workdir / "log").open("w"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listening = subprocess.run(["ip", "netns", "exec", router_ns, "ss", "-Hltn", f"sport = :{HTTP_PORT}"],
                                   capture_output=True, text=True).stdout
        if listening.strip():
            return proc, workdir
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"miniupnpd in {router_ns} did not start: {(workdir / 'log').read_text()[-800:]}")
