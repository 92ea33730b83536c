"""The fault model: one seed gives one group, one network and one set of faults.

Per seed: 3-6 members, 3-6 rounds, contribution and chunk sizes, link jitter (per-link FIFO is
kept whatever the jitter), and up to members-2 faulty members, each one of: killed at some time
(SIGKILL: gone mid-round or between rounds), crashed right after sending its N-th RESULT frame (a
reducer dying mid-broadcast: some members got its result, some did not), frozen for 0.2-12 s
(SIGSTOP), or a garbage sender from some round on (NaN or truncated payloads, wrong-shape meta,
unparsable frames).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .member import GARBAGE_MODES


@dataclass(frozen=True)
class Fault:
    member: str
    kind: str          # "kill", "crash", "stall", "garbage" or "outage"
    at: float = 0.0    # kill / stall / outage: simulated time it starts
    seconds: float = 0.0  # stall / outage: how long
    mode: str = ""     # garbage: how its PART frames are corrupted
    from_round: int = 0   # garbage: first round it corrupts
    after_frames: int = 0  # crash: dies right after sending this many RESULT frames

    def describe(self) -> str:
        if self.kind == "kill":
            return f"kill {self.member} at {self.at:.3f}s"
        if self.kind == "crash":
            return f"crash {self.member} after {self.after_frames} results sent"
        if self.kind == "stall":
            return f"stall {self.member} at {self.at:.3f}s for {self.seconds:.2f}s"
        if self.kind == "outage":
            return f"outage {self.member} at {self.at:.3f}s for {self.seconds:.2f}s"
        return f"garbage {self.member} ({self.mode}) from round {self.from_round}"


@dataclass(frozen=True)
class Scenario:
    seed: int
    members: tuple[str, ...]
    rounds: int
    numel: int
    chunk: int
    max_jitter_s: float
    faults: tuple[Fault, ...]


def scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    members = tuple(f"m{i}" for i in range(n))
    rounds = rng.randint(3, 6)
    numel = rng.choice([1, 300, 1000, 2600])
    chunk = rng.choice([128, 256, 512])
    jitter = rng.choice([0.0, 0.002, 0.05, 0.4])
    faulty = rng.sample(members, rng.randint(0, n - 2))
    span = rounds * 0.25  # about how long the rounds take without faults
    faults = []
    for member in sorted(faulty):
        kind = rng.choice(["kill", "crash", "stall", "stall", "garbage"])
        if kind == "crash":
            faults.append(Fault(member, "crash", after_frames=rng.randint(1, 3 * n)))
        elif kind == "kill":
            faults.append(Fault(member, "kill", at=rng.uniform(0.0, span)))
        elif kind == "stall":
            faults.append(Fault(member, "stall", at=rng.uniform(0.0, span), seconds=rng.uniform(0.2, 12.0)))
        else:
            faults.append(Fault(member, "garbage", mode=rng.choice(GARBAGE_MODES),
                                from_round=rng.randrange(rounds)))
    return Scenario(seed, members, rounds, numel, chunk, jitter, tuple(faults))


def outage_scenario(seed: int) -> Scenario:
    """Seed ``seed``'s group and network (as ``scenario``), with home links dropping instead: one or two
    members each lose their links for 0.1-8 s at some time, running on meanwhile (docs/adr/0244)."""
    base = scenario(seed)
    rng = random.Random(f"outage-{seed}")
    span = base.rounds * 0.25
    down = rng.sample(base.members, rng.randint(1, min(2, len(base.members) - 2)))
    faults = tuple(Fault(member, "outage", at=rng.uniform(0.0, span), seconds=rng.uniform(0.1, 8.0))
                   for member in sorted(down))
    return Scenario(seed, base.members, base.rounds, base.numel, base.chunk, base.max_jitter_s, faults)
