"""Run one seed: build its scenario, run every member's real round core over the simulated
network until all survivors finished all rounds (or the time limit), then check the invariants."""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np

from ml.allreduce.round_core import RoundCore

from .faults import Scenario, outage_scenario, scenario
from .invariants import check
from .member import RoundRecord, SimMember
from .network import Network, Scheduler

TIME_LIMIT_PER_ROUND_S = 200.0  # far above the worst legitimate round (attempts x ceiling deadlines)


@dataclass
class Report:
    seed: int
    scenario: Scenario
    trace: list[str]
    violations: list[str]
    honest_left_out: list[str]
    records: list[RoundRecord]
    frames: int

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def trace_digest(self) -> str:
        return hashlib.blake2b("\n".join(self.trace).encode(), digest_size=8).hexdigest()

    def summary(self) -> str:
        faults = "; ".join(f.describe() for f in self.scenario.faults) or "no faults"
        status = "ok" if self.ok else f"{len(self.violations)} VIOLATIONS"
        if self.honest_left_out:
            status += f", {len(self.honest_left_out)} never-faulty member(s) left out after a fault"
        return (f"seed {self.seed}: {len(self.scenario.members)} members, {self.scenario.rounds} rounds, "
                f"{faults}: {status} (trace {self.trace_digest}, {self.frames} frames)")


def contribution(seed: int, numel: int):
    def values(member: str, round_id: int) -> np.ndarray:
        rng = np.random.default_rng([seed, int(member[1:]), round_id])
        return (rng.standard_normal(numel) * 10).astype(np.float32)
    return values


def run_seed(seed: int, core_factory=RoundCore, flow: str = "butterfly", outages: bool = False,
             breaks: bool = False) -> Report:
    """Run seed `seed` with members whose round core is `core_factory` and data flow `flow` (with
    `outages`, its faults are home links dropping for a while: faults.outage_scenario)."""
    sc = outage_scenario(seed) if outages else scenario(seed)
    rng = random.Random(f"run-{seed}")
    scheduler = Scheduler()
    net = Network(scheduler, rng, list(sc.members), sc.max_jitter_s)
    net.outage_breaks = breaks
    trace: list[str] = []
    records: list[RoundRecord] = []

    def log(line: str) -> None:
        trace.append(f"{scheduler.now:10.6f} {line}")

    garbage = {f.member: (f.mode, f.from_round) for f in sc.faults if f.kind == "garbage"}
    values = contribution(seed, sc.numel)
    for member in sc.members:
        net.attach(member, SimMember(member, list(sc.members), net, rounds=sc.rounds, numel=sc.numel,
                                     chunk=sc.chunk, contribution=values, trace=log, on_round=records.append,
                                     rng=rng, core_factory=core_factory, garbage=garbage.get(member),
                                     flow=flow))
    net.on_crash = lambda member: log(f"FAULT {member} crashes")
    for fault in sc.faults:
        if fault.kind == "crash":
            net.crash_after[fault.member] = fault.after_frames
        elif fault.kind == "kill":
            scheduler.at(fault.at, lambda f=fault: (log(f"FAULT {f.describe()}"), net.kill(f.member)))
        elif fault.kind == "stall":
            scheduler.at(fault.at, lambda f=fault: (log(f"FAULT {f.describe()}"), net.freeze(f.member, f.seconds)))
        elif fault.kind == "outage":
            net.outages[fault.member] = (fault.at, fault.at + fault.seconds)
            scheduler.at(fault.at, lambda f=fault: log(f"FAULT {f.describe()}"))
    for member in sc.members:
        net.timer(member, 0.0, lambda m: m.start_round(0))
    scheduler.run(until=sc.rounds * TIME_LIMIT_PER_ROUND_S)
    outcome = check(sc, records, values, net.killed_at)
    return Report(seed, sc, trace, outcome.violations, outcome.honest_left_out, records, net.frames_sent)
