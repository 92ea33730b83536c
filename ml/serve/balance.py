"""Which blocks a new server should hold, and when a server should move (Petals' load balancing).

Coverage is a list of (start, end, throughput) for the other servers of a model. A block's
throughput is the sum over the servers holding it; the swarm is as fast as its weakest block.
`choose_blocks` puts `count` blocks where the weakest blocks are (the window whose sorted block
throughputs are lexicographically smallest, earliest on ties): gaps first. `should_move` tells a
serving node to move when another start would raise the swarm's weakest block by more than
1 / `quality` (hysteresis, so servers do not chase each other). Pure functions; the coverage itself
comes from the caller (a list of known servers now, the ledger's records later).
"""
from __future__ import annotations

Coverage = list[tuple[int, int, float]]


def block_throughput(layers: int, coverage: Coverage) -> list[float]:
    per_block = [0.0] * layers
    for start, end, throughput in coverage:
        if not 0 <= start < end <= layers or throughput < 0:
            raise ValueError(f"bad coverage entry {(start, end, throughput)} for {layers} blocks")
        for block in range(start, end):
            per_block[block] += throughput
    return per_block


def choose_blocks(layers: int, count: int, coverage: Coverage) -> tuple[int, int]:
    """The range of `count` blocks a new server should take."""
    if not 1 <= count <= layers:
        raise ValueError(f"a server holds 1..{layers} blocks, not {count}")
    per_block = block_throughput(layers, coverage)
    start = min(range(layers - count + 1), key=lambda s: (sorted(per_block[s:s + count]), s))
    return start, start + count


def swarm_throughput(layers: int, coverage: Coverage) -> float:
    return min(block_throughput(layers, coverage))


def should_move(layers: int, current: tuple[int, int], throughput: float, others: Coverage,
                quality: float = 0.75) -> tuple[int, int] | None:
    """The range to move to, or None to stay: moving must lift the swarm's weakest block (with this
    server counted at `throughput`) from below `quality` times what it would be after the move."""
    count = current[1] - current[0]
    best = choose_blocks(layers, count, others)
    if best == current:
        return None
    now = swarm_throughput(layers, others + [(current[0], current[1], throughput)])
    after = swarm_throughput(layers, others + [(best[0], best[1], throughput)])
    return best if now < quality * after else None
