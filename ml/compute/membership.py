"""The compute node's place on the ledger: bond the configured stake, contribute the node record's
roles, listen addresses and hardware (the GPU `ml.hardware.detect` found, the bandwidth the node
measured, docs/adr/0158), and republish the bandwidth figure when the measurement moves. The last
published figure is kept in ``<data_dir>/compute/bandwidth.json`` across restarts."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from consensus.tx import HARDWARE, MAX_CPU_CORES
from ml import hardware
from ml.profiles import MAX_PROFILES
from node.bandwidth import worth_publishing
from node.ledger import LedgerGateway

log = logging.getLogger(__name__)

FIRST_BANDWIDTH_CHECK_S = 10.0
BANDWIDTH_CHECK_S = 15.0     # how often the measured bandwidth is compared with the published one
REPUBLISH_MIN_S = 300.0      # and at most how often a new figure is published
BANDWIDTH_FILE = "bandwidth.json"   # in <data_dir>/compute: the last measured figure published
NO_GPU = {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0}


class Membership:
    """Registration, bonding and the published hardware/bandwidth of one compute node."""

    def __init__(self, node: Any, ledger: LedgerGateway, config: Any, name: str, folder: Path | None) -> None:
        self.node = node
        self.ledger = ledger
        self.config = config
        self.name = name
        self.folder = folder                      # <data_dir>/compute, None without a data dir
        self.registered = False
        self.hardware: dict[str, Any] | None = None   # ml.hardware.detect(), measured once at join
        self.published_mbps: int | None = None   # the bandwidth figure in our ledger record

    async def join(self) -> None:
        """Bond up to the configured stake and have this node's record say compute (and verifier)."""
        me = self.node.peer_id
        bonded = await self.ledger.bonded(me)
        if bonded < self.config["stake"]:
            await self.ledger.send("bond", {"amount": self.config["stake"] - bonded})
        if self.hardware is None:
            try:
                detected: dict[str, Any] = await asyncio.to_thread(hardware.detect)
            except Exception as exc:  # a broken driver must not keep the node out: register as CPU-only
                log.warning("GPU detection failed, registering without a GPU: %s", exc)
                detected = dict(NO_GPU)
            self.hardware = detected
            log.info("hardware detected", extra={k: v for k, v in detected.items() if k != "gpu"} |
                     {"gpu_name": detected["gpu"] or "none"})
        meter = self.meter()
        measured = meter.link_mbps() if meter is not None else None
        self.contribute_record(measured or self.saved_bandwidth() or self.config["bandwidth_mbps"])
        await self.ledger.record.sync()
        self.registered = True
        log.info("compute node registered", extra={"peer_id": me, "ledger": self.ledger.describe()})

    def contribute_record(self, bandwidth_mbps: int) -> None:
        self.published_mbps = bandwidth_mbps
        self.ledger.record.contribute(
            self.name, roles={"compute", "verifier"} if self.config["audit"] else {"compute"},
            listen_addrs=self.node.host.listen_addrs,
            hardware=hardware_record(self.hardware or {}, bandwidth_mbps))

    def has_cuda(self) -> bool:
        return bool((self.hardware or {}).get("cuda_devices"))

    def gpu(self) -> str:
        return str((self.hardware or {}).get("gpu") or "")

    def bandwidth_service(self) -> Any:
        return getattr(self.node, "services", {}).get("bandwidth")

    def meter(self) -> Any:
        service = self.bandwidth_service()
        return service.meter if service is not None else None

    async def follow_bandwidth(self) -> None:
        """Have the node measure its link, and publish the measured figure in the record: the first
        one as soon as it exists (replacing the configured guess), later ones when they moved by
        more than half, at most every REPUBLISH_MIN_S (each is a register_node transaction)."""
        service = self.bandwidth_service()
        if service is None:
            return
        service.start_probing()
        measured_once, last = False, 0.0
        await asyncio.sleep(FIRST_BANDWIDTH_CHECK_S)
        while True:
            measured = service.meter.link_mbps()
            if self.registered and measured is not None and (not measured_once or (
                    time.monotonic() - last >= REPUBLISH_MIN_S and worth_publishing(self.published_mbps, measured))):
                log.info("measured bandwidth %s Mbit/s (published %s): updating the record",
                         measured, self.published_mbps)
                self.contribute_record(measured)
                await asyncio.to_thread(self.save_bandwidth, measured)
                measured_once, last = True, time.monotonic()
            await asyncio.sleep(BANDWIDTH_CHECK_S)

    def saved_bandwidth(self) -> int | None:
        """The last measured link figure this node published (kept across restarts, so a restart
        does not fall back to the configured guess until it has measured again)."""
        try:
            value = json.loads((self.folder / BANDWIDTH_FILE).read_text())["link_mbps"] if self.folder else None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 10**6 else None

    def save_bandwidth(self, link_mbps: int) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f"{BANDWIDTH_FILE}.tmp"
        tmp.write_text(json.dumps({"link_mbps": link_mbps}))
        os.replace(tmp, self.folder / BANDWIDTH_FILE)


def hardware_record(detected: dict[str, Any], bandwidth_mbps: int) -> dict[str, Any]:
    """The record's hardware map: the fields the ledger's schema has (`consensus.tx.HARDWARE`),
    from what this node detected and measured (integers: the ledger has no floats)."""
    values = {"cpu_cores": min(os.cpu_count() or 1, MAX_CPU_CORES), "ram_mb": _ram_mb(),
              "gpu": str(detected.get("gpu") or "")[:64], "gpu_mem_mb": int(detected.get("gpu_mem_mb") or 0),
              "gpu_tflops": round(float(detected.get("gpu_tflops") or 0)),
              "cuda_devices": int(detected.get("cuda_devices") or 0),
              "bandwidth_mbps": max(0, min(int(bandwidth_mbps), 10**6)),
              "profiles": [str(p) for p in detected.get("profiles") or []][:MAX_PROFILES]}   # ADR 0166
    return {name: values[name] for name in HARDWARE if name in values}   # optional fields left out


def _ram_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20))
    except (ValueError, OSError, AttributeError):
        return 0
