"""The pairs-direct matrix weighted by how common each NAT kind is in the wild (docs/adr/0223,
issue 25's benchmark: "direct_fraction >= 0.95 weighted").

``weighted_direct(by_pair, shares)`` is P(a pair of homes ends direct) when each home's NAT kind is
drawn independently with ``shares``: the sum over unordered kind pairs {a, b} of P(direct | a, b)
weighted s_a * s_b (a == b) or 2 * s_a * s_b (a != b: both orders), over (sum of the shares)^2.
P(direct | a, b) is the fraction of the runs given in which the pair ended direct (the matrix punches
one direction per unordered pair; the other order is taken to behave the same). Kinds with share 0
are left out; a kind with a share but a pair missing from the runs is an error, not a guess.

``SHARES``: the weights the benchmark states, from what published measurements split (see
docs/BENCHMARKS.md, "Weighted direct connections", for the quotes and sources). Ford, Srisuresh and
Kegel (USENIX ATC 2005) found about 82% of the NATs tested support UDP hole punching, i.e. map
endpoint-independently; the other 18% map per destination (symmetric). No source read splits the
endpoint-independent 82% by filtering, the symmetric 18% by port allocation, or gives the share of
homes behind a carrier NAT: those splits are even, and the carrier NAT kind (``cgnat``, whose mapping
RFC 6888 requires to be endpoint-independent) gets no share of its own (its homes are in the
endpoint-independent classes); nor does ``udp-blocked`` (no source read gives the share of homes whose
network drops UDP).

``relayed_fractions(runs)``: per pair, the relayed bytes over the bytes moved (the matrix's
``relayed_bytes`` / ``moved_bytes``, summed over the runs that have them); weighted with the same
shares as P(direct) (``weighted_direct`` is a share-weighted mean over pairs of any per-pair figure).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

EIM_SHARE = 0.82          # Ford, Srisuresh, Kegel 2005: NATs that support UDP hole punching
SHARES: dict[str, float] = {
    "full-cone": EIM_SHARE / 3, "restricted": EIM_SHARE / 3, "port-restricted": EIM_SHARE / 3,
    "symmetric-seq": (1 - EIM_SHARE) / 2, "symmetric": (1 - EIM_SHARE) / 2,
    "cgnat": 0.0, "udp-blocked": 0.0,
}


def pair_probabilities(runs: Iterable[Mapping]) -> dict[tuple[str, str], float]:
    """{(kind, kind): fraction of the runs the pair ended direct}, keys sorted, over the matrix runs'
    JSON objects (``by_pair``: {"a/b": {"direct": bool, ...}})."""
    seen: dict[tuple[str, str], list[bool]] = {}
    for run in runs:
        for name, outcome in run["by_pair"].items():
            a, b = name.split("/")
            first, second = sorted((a, b))
            seen.setdefault((first, second), []).append(bool(outcome["direct"]))
    if not seen:
        raise ValueError("no matrix pairs in the runs given")
    return {pair: sum(outcomes) / len(outcomes) for pair, outcomes in sorted(seen.items())}


def relayed_fractions(runs: Iterable[Mapping]) -> dict[tuple[str, str], float]:
    """{(kind, kind): relayed bytes / bytes moved}, keys sorted, over the runs' pairs that moved bytes
    (runs saved before the matrix moved data have none: then {})."""
    relayed: dict[tuple[str, str], list[int]] = {}
    for run in runs:
        for name, outcome in run["by_pair"].items():
            if outcome.get("moved_bytes"):
                first, second = sorted(name.split("/"))
                totals = relayed.setdefault((first, second), [0, 0])
                totals[0] += int(outcome["relayed_bytes"])
                totals[1] += int(outcome["moved_bytes"])
    return {pair: r / moved for pair, (r, moved) in sorted(relayed.items())}


def weighted_direct(probabilities: Mapping[tuple[str, str], float], shares: Mapping[str, float]) -> float:
    """P(direct) for two homes whose NAT kinds are drawn from ``shares`` (see the module docstring)."""
    kinds = sorted(kind for kind, share in shares.items() if share > 0)
    if any(share < 0 for share in shares.values()) or not kinds:
        raise ValueError("shares must be non-negative with at least one positive")
    total = sum(shares[kind] for kind in kinds)
    weighted = 0.0
    for i, a in enumerate(kinds):
        for b in kinds[i:]:
            pair = (a, b)
            if pair not in probabilities:
                raise ValueError(f"the runs have no {a}/{b} pair, which the weights need")
            weight = shares[a] * shares[b] * (1 if a == b else 2)
            weighted += weight * probabilities[pair]
    return weighted / (total * total)


def unweighted_direct(probabilities: Mapping[tuple[str, str], float]) -> float:
    """The matrix's own figure: the mean over the unordered pairs run (of P(direct), or of any per-pair
    figure)."""
    return sum(probabilities.values()) / len(probabilities)


def shortfall(probabilities: Mapping[tuple[str, str], float], shares: Mapping[str, float]) -> list[dict]:
    """The pairs that keep the weighted figure below 1: each with its weight and the share of the
    weighted total it loses, largest loss first."""
    kinds = {kind for kind, share in shares.items() if share > 0}
    total = sum(shares[kind] for kind in kinds)
    out = []
    for (a, b), p in probabilities.items():
        if a in kinds and b in kinds and p < 1:
            weight = shares[a] * shares[b] * (1 if a == b else 2) / (total * total)
            out.append({"pair": f"{a}/{b}", "p_direct": round(p, 3), "weight": round(weight, 4),
                        "lost": round(weight * (1 - p), 4)})
    return sorted(out, key=lambda row: -row["lost"])


def summary(runs: Sequence[Mapping], shares: Mapping[str, float] = SHARES) -> dict:
    """The weighted and unweighted figures of ``runs`` (one or more matrix JSON objects)."""
    probabilities = pair_probabilities(runs)
    out = {"runs": len(runs), "pairs": len(probabilities),
           "direct_fraction": round(unweighted_direct(probabilities), 3),
           "direct_fraction_weighted": round(weighted_direct(probabilities, shares), 3),
           "weights": {kind: round(share, 4) for kind, share in shares.items()},
           "shortfall": shortfall(probabilities, shares)}
    relayed = relayed_fractions(runs)
    if relayed.keys() == probabilities.keys():   # every pair moved bytes in some run
        out["relayed_bytes_fraction"] = round(unweighted_direct(relayed), 3)
        out["relayed_bytes_fraction_weighted"] = round(weighted_direct(relayed, shares), 3)
    return out


def load_runs(paths: Iterable[str | Path]) -> list[dict]:
    """Matrix runs saved by ``bench/nat_matrix.py`` (its last output line, a JSON object, per file)."""
    runs = []
    for path in paths:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"{path}: empty")
        run = json.loads(lines[-1])
        if not isinstance(run, dict) or not isinstance(run.get("by_pair"), dict):
            raise ValueError(f"{path}: not a nat_matrix run (no by_pair)")
        runs.append(run)
    return runs


def parse_shares(text: str) -> dict[str, float]:
    """``kind=share,kind=share`` (the --weights option) as a dict."""
    shares = {}
    for item in text.split(","):
        kind, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--weights wants kind=share items, got {item!r}")
        shares[kind.strip()] = float(value)
    return shares
