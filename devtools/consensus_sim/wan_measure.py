"""Finality of a fault-free committee over the WAN latency table (``wan.py``), measured in the simulator.

One run: ``validators`` honest validators (all in the committee, equal stake), round-robin over the
regions, production consensus timeouts and empty-block wait unless told otherwise, a trickle of transfers; the run ends
when every replica has stored ``heights`` blocks. Finality of a commit: virtual seconds from the
height's first proposal being built to a replica storing the block (every replica's commit counts);
block rate: heights over the virtual time until the last one's first commit; rounds: the round each
height was committed in (0 = the first); stored bytes per height: the logical bytes (keys and values,
before the database's compression and overhead) replica 0 holds beyond a fresh genesis store, per
height (``tx_rate`` 0: an idle chain; ``retain_blocks``: the replicas prune, so the total stays
bounded). Everything comes from the seed, so a seed replays exactly.
"""
from __future__ import annotations

import statistics
import time

from consensus.tendermint import TimeoutConfig
from consensus.validator.memkv import MemoryKV
from consensus.validator.storage import Storage
from devtools.consensus_sim.scenario import SimConfig, Simulation
from devtools.consensus_sim.wan import WanConfig

# The node's defaults ([consensus] timeout_propose = 1.0, timeout_vote = 0.5; validator/role.py's mapping).
PRODUCTION_TIMEOUTS = TimeoutConfig(propose=1.0, propose_delta=0.5, prevote=0.5, prevote_delta=0.25,
                                    precommit=0.5, precommit_delta=0.25)


EMPTY_BLOCK_WAIT = 0.3   # [consensus] empty_block_wait's default


def timeouts_for(propose: float, vote: float) -> TimeoutConfig:
    """The node's mapping of ``timeout_propose``/``timeout_vote`` to the core's timeouts."""
    return TimeoutConfig(propose=propose, propose_delta=propose / 2, prevote=vote, prevote_delta=vote / 2,
                         precommit=vote, precommit_delta=vote / 2)


def wan_sim_config(validators: int, heights: int, seed: int = 1, wan: WanConfig | None = None,
                   timeouts: TimeoutConfig = PRODUCTION_TIMEOUTS, tx_rate: float = 2.0,
                   bound: float = 600.0, empty_block_wait: float | None = EMPTY_BLOCK_WAIT,
                   retain_blocks: int = 0) -> SimConfig:
    return SimConfig(seed=seed, validators=validators, fault_time=0.001, drop=0.0, duplicate=0.0, max_delay=0.02,
                     partitions=False, crashes=False, torn_crashes=False, byzantine=False, tx_rate=tx_rate,
                     epoch_length=max(8, heights + 1), liveness_heights=heights, liveness_bound=bound,
                     wan=wan or WanConfig(), timeouts=timeouts, empty_block_wait=empty_block_wait,
                     retain_blocks=retain_blocks)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _logical_bytes(kv: MemoryKV) -> int:
    return sum(len(key) + len(value) for key, value in kv.scan(b""))


def measure(validators: int, heights: int, seed: int = 1, wan: WanConfig | None = None,
            timeouts: TimeoutConfig = PRODUCTION_TIMEOUTS, empty_block_wait: float | None = EMPTY_BLOCK_WAIT,
            tx_rate: float = 2.0, retain_blocks: int = 0) -> dict:
    """Run once and return the figures (and ``violations``, empty when safety and liveness held)."""
    started = time.perf_counter()
    sim = Simulation(wan_sim_config(validators, heights, seed, wan, timeouts, tx_rate,
                                    empty_block_wait=empty_block_wait, retain_blocks=retain_blocks))
    result = sim.run()
    checker = sim.checker
    rounds = [checker.rounds[h] for h in sorted(checker.rounds)]
    last = max(checker.first_commit) if checker.first_commit else 0
    span = checker.first_commit.get(last, 0.0)
    fresh = MemoryKV()
    Storage.create("genesis-only", fresh, sim.genesis)
    stored = _logical_bytes(sim.replicas[0].kv) - _logical_bytes(fresh)
    return {
        "validators": validators,
        "heights": min(result.heights),
        "finality_p50_ms": round(1000 * statistics.median(checker.finality), 1) if checker.finality else None,
        "finality_p95_ms": round(1000 * percentile(checker.finality, 0.95), 1) if checker.finality else None,
        "finality_p99_ms": round(1000 * percentile(checker.finality, 0.99), 1) if checker.finality else None,
        "blocks_per_min": round(60 * last / span, 1) if span else 0.0,
        "rounds_mean": round(1 + statistics.fmean(rounds), 3) if rounds else None,
        "rounds_max": 1 + max(rounds) if rounds else None,
        "virtual_s": result.virtual_time,
        "wall_s": round(time.perf_counter() - started, 2),
        "messages": result.network["sent"],
        "stored_bytes_per_height": round(stored / max(1, sim.replicas[0].height)),
        "stored_bytes": stored,
        "trace": result.trace,
        "violations": result.violations,
    }
