"""A wide-area network for the consensus simulator: an inter-region latency table and per-link bandwidth.

Source of the table: AWS inter-region round-trip times as published by CloudPing
(https://www.cloudping.co/grid, median "p50" view over the trailing year), the kind of table
CometBFT's v1 QA emulated with ``tc`` and commonware-estimator simulates over. The ten regions are
the ones commonware-estimator's examples span (North America, South America, Europe, Asia, Oceania).
The figures are round-trip milliseconds rounded to 5 ms and transcribed by hand (this repository
reads nothing from the network at run time); refresh them from the grid when precision matters.
Same-region pairs use ``INTRA_REGION_RTT_MS``.

``WanLatency`` assigns validator i to ``REGIONS[i % len(REGIONS)]`` (round-robin) and gives each
payload a one-way delay of RTT/2 plus a seeded jitter (uniform in [0, ``jitter`` x RTT/2]), plus,
when ``bandwidth`` (bytes/s per link) is set, the payload's size over the bandwidth, queued behind
what the link is still sending: a 1 MB block over a 100 Mbit/s link takes ~84 ms on the wire.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

REGIONS: tuple[str, ...] = (
    "us-east-1", "us-west-1", "eu-west-1", "eu-central-1", "eu-north-1",
    "ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-2", "sa-east-1",
)

INTRA_REGION_RTT_MS = 2.0

# Upper triangle of the round-trip table, in milliseconds (see the module docstring for the source).
_RTT_ROWS: dict[str, dict[str, float]] = {
    "us-east-1": {"us-west-1": 65, "eu-west-1": 70, "eu-central-1": 90, "eu-north-1": 110,
                  "ap-northeast-1": 145, "ap-northeast-2": 175, "ap-south-1": 185, "ap-southeast-2": 200,
                  "sa-east-1": 115},
    "us-west-1": {"eu-west-1": 130, "eu-central-1": 150, "eu-north-1": 170, "ap-northeast-1": 110,
                  "ap-northeast-2": 130, "ap-south-1": 230, "ap-southeast-2": 140, "sa-east-1": 175},
    "eu-west-1": {"eu-central-1": 25, "eu-north-1": 40, "ap-northeast-1": 200, "ap-northeast-2": 235,
                  "ap-south-1": 125, "ap-southeast-2": 255, "sa-east-1": 180},
    "eu-central-1": {"eu-north-1": 25, "ap-northeast-1": 225, "ap-northeast-2": 230, "ap-south-1": 115,
                     "ap-southeast-2": 250, "sa-east-1": 205},
    "eu-north-1": {"ap-northeast-1": 240, "ap-northeast-2": 250, "ap-south-1": 135, "ap-southeast-2": 270,
                   "sa-east-1": 215},
    "ap-northeast-1": {"ap-northeast-2": 35, "ap-south-1": 130, "ap-southeast-2": 105, "sa-east-1": 255},
    "ap-northeast-2": {"ap-south-1": 140, "ap-southeast-2": 140, "sa-east-1": 285},
    "ap-south-1": {"ap-southeast-2": 150, "sa-east-1": 300},
    "ap-southeast-2": {"sa-east-1": 310},
}


def rtt_ms(a: str, b: str) -> float:
    """Round-trip time between two regions of ``REGIONS``, in milliseconds."""
    if a == b:
        return INTRA_REGION_RTT_MS
    row = _RTT_ROWS.get(a, {})
    return float(row[b]) if b in row else float(_RTT_ROWS[b][a])


@dataclass(frozen=True)
class WanConfig:
    jitter: float = 0.1               # jitter's ceiling, as a fraction of the one-way delay
    bandwidth: float | None = None    # bytes per second per directed link; None: no transmission time


class WanLatency:
    """Delays for payloads between validators placed round-robin over ``REGIONS``."""

    def __init__(self, validators: int, config: WanConfig, rng: random.Random) -> None:
        if config.jitter < 0 or (config.bandwidth is not None and config.bandwidth <= 0):
            raise ValueError("jitter must be >= 0 and bandwidth > 0")
        self.config = config
        self.rng = rng
        self.regions = [REGIONS[i % len(REGIONS)] for i in range(validators)]
        self._one_way = {(a, b): rtt_ms(a, b) / 2000.0 for a in REGIONS for b in REGIONS}
        self._busy: dict[tuple[int, int], float] = {}   # (src, dst) -> when the link is free to send again

    def one_way(self, src: int, dst: int) -> float:
        """Propagation delay without jitter, in seconds."""
        return self._one_way[(self.regions[src], self.regions[dst])]

    def arrival(self, now: float, src: int, dst: int, size: int) -> float:
        """When a payload of ``size`` bytes handed to link (src, dst) at ``now`` arrives."""
        base = self.one_way(src, dst)
        sent = now
        if self.config.bandwidth is not None:
            sent = max(now, self._busy.get((src, dst), 0.0)) + size / self.config.bandwidth
            self._busy[(src, dst)] = sent
        return sent + base + self.rng.uniform(0.0, self.config.jitter * base)
