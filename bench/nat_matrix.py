"""Connectivity over the netlab's NAT zoo (ADR 0194): for every unordered pair of NAT kinds (both
homes behind their own NAT, one relay on the backbone), the product's TCP hole punch (DCUtR over
our circuit relay) ends direct or stays relayed. Needs root, iproute2 and nftables.

Prints one JSON object as the last line: ``{"pairs", "direct", "direct_fraction",
"median_time_to_direct_s", "relayed_bytes_fraction", "by_pair": {"kind/kind": {"direct", "seconds",
"moved_bytes", "relayed_bytes", ..}}, "seconds"}`` (``seconds`` per pair: from the relayed dial to the
end of the punch attempt, direct or not; after it each pair moves 1 MiB on the connection it kept and
the relay's counters give the bytes it carried: ``relayed_bytes_fraction`` is relayed over moved), plus
``direct_fraction_weighted`` and ``relayed_bytes_fraction_weighted`` (each kind weighted by its share in
the wild, ADR 0223: devtools/netlab/nat_weights.py), ``weights`` and ``shortfall`` (the pairs that keep
the direct figure below 1).
``python bench/nat_matrix.py [--kinds full-cone,symmetric] [--save run.json]``; ``--from-json
run1.json [run2.json ...]`` computes the weighted and unweighted figures of saved runs (P(direct) of
a pair: the fraction of the runs it ended direct) without running the lab; ``--weights
kind=share,...`` replaces the stated shares; ``--quic``: the relay and the homes listen on QUIC too
and DCUtR punches over QUIC beside TCP (ADR 0228); ``--both-directions``: each pair of different kinds
is punched from each side too ("b/a" names the dialling kind first).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.netlab.lab import unavailable  # noqa: E402
from devtools.netlab.nat_matrix import MATRIX_KINDS, run_matrix  # noqa: E402
from devtools.netlab.nat_weights import SHARES, load_runs, parse_shares, summary  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default=",".join(MATRIX_KINDS), help="comma-separated NAT kinds")
    parser.add_argument("--from-json", nargs="+", metavar="RUN", help="saved runs to weigh (no lab is run)")
    parser.add_argument("--save", metavar="FILE", help="also write the run's JSON object to FILE")
    parser.add_argument("--weights", type=parse_shares, default=SHARES, metavar="KIND=SHARE,...",
                        help="the share of each NAT kind (default: the sourced shares, ADR 0223)")
    parser.add_argument("--quic", action="store_true", help="punch over QUIC beside TCP (ADR 0228)")
    parser.add_argument("--both-directions", action="store_true",
                        help="each pair of different kinds punched from each side (by_pair key: dialler/dialled)")
    args = parser.parse_args()
    if args.from_json:
        print(json.dumps(summary(load_runs(args.from_json), args.weights), sort_keys=True))
        return
    why = unavailable()
    if why:
        print(json.dumps({"skipped": why}))
        return
    started = time.monotonic()
    out = run_matrix(tuple(args.kinds.split(",")), quic=args.quic, both_directions=args.both_directions)
    out["seconds"] = round(time.monotonic() - started, 1)
    if set(k for k, share in args.weights.items() if share > 0) <= set(args.kinds.split(",")):
        weighed = summary([out], args.weights)
        out.update({k: weighed[k] for k in ("direct_fraction_weighted", "relayed_bytes_fraction_weighted",
                                            "weights", "shortfall")})
    line = json.dumps(out, sort_keys=True)
    if args.save:
        Path(args.save).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
