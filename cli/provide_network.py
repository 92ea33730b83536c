"""Before ``dekube-node provide`` starts the node (docs/adr/0198): this machine's bandwidth to a bootstrap
peer over the product transport (the node's bandwidth probe, node/bandwidth.py: 2 MiB up, 2 MiB down)
and whether it is publicly reachable (AutoNAT dial-back, relay/reachability.py, through the bootstrap
peers that serve it). A throwaway identity asks, from the p2p listen address the node will use, so
that the dial-back tests the right port; everything is bounded by ``timeout_s``. A machine found
public also runs the relay role, so that nodes behind NAT can reach each other through it.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from node.bandwidth import BandwidthMeter, ProbeError, probe
from node.identity import Identity
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr, MultiaddrError
from relay import reachability

TIMEOUT_S = 20.0


@dataclass
class Measured:
    peer: str = ""                 # the bootstrap peer measured against
    upload_mbps: float | None = None
    download_mbps: float | None = None
    reachability: str = "unknown"  # public, private or unknown (no bootstrap peer answers AutoNAT)
    error: str = ""

    def describe(self) -> str:
        if self.upload_mbps is None:
            speed = f"bandwidth not measured ({self.error or 'no bootstrap peer answered'})"
        else:
            speed = (f"bandwidth to {self.peer[:16]}...: {self.upload_mbps:.0f} Mbit/s up, "
                     f"{self.download_mbps:.0f} Mbit/s down")
        reach = {"public": "reachable from the internet: this node also relays for others",
                 "private": "not reachable from the internet (behind NAT or a firewall): other nodes reach it "
                            "through relays; forward the p2p port on your router to help",
                 "unknown": "reachability unknown (no bootstrap peer could dial back): no relay role"}
        return f"{speed}; {reach[self.reachability]}"


def dialable(addrs: list[str]) -> list[str]:
    """The bootstrap addresses that name their peer (``.../p2p/<id>``), the only ones a probe can use."""
    out = []
    for addr in addrs:
        with contextlib.suppress(MultiaddrError, ValueError):
            if Multiaddr.parse(addr).peer_id is not None:
                out.append(addr)
    return out


async def measure(bootstrap: list[str], listen: str, timeout_s: float = TIMEOUT_S) -> Measured:
    """Probe the first bootstrap peer that answers, and ask them all for a dial-back, within ``timeout_s``."""
    out = Measured()
    addrs = dialable(bootstrap)
    if not addrs:
        out.error = "no bootstrap address names its peer"
        return out
    host = Host(Identity.generate(), [listen])
    try:
        async with asyncio.timeout(timeout_s):
            await host.start()
            for addr in addrs:
                try:
                    peer = await host.connect(addr)
                    rates = await probe(host, peer, BandwidthMeter())
                except (ProbeError, OSError, ConnectionError, TimeoutError, ValueError) as exc:
                    out.error = f"{addr}: {exc}"[:300]
                    continue
                out.peer, out.upload_mbps, out.download_mbps = peer, rates["upload_mbps"], rates["download_mbps"]
                break
            out.reachability = (await reachability.assess(host, addrs)).value
    except TimeoutError:
        out.error = out.error or f"no answer within {timeout_s:g} s"
    except OSError as exc:
        out.error = f"cannot listen on {listen}: {exc.strerror}"
    finally:
        with contextlib.suppress(Exception):
            await host.stop()
    return out


def measure_now(bootstrap: list[str], listen: str, timeout_s: float = TIMEOUT_S) -> Measured:
    return asyncio.run(measure(bootstrap, listen, timeout_s))


def probe_targets(bootstrap: list[str], validators: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The network's bootstrap addresses, or the genesis validators' listen addresses with their peer ids."""
    if bootstrap:
        return list(bootstrap)
    return [addr if "/p2p/" in addr else f"{addr}/p2p/{peer}" for peer, addrs in validators for addr in addrs]
