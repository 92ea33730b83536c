"""Connectivity over the netlab's NAT zoo (ADR 0194): for every unordered pair of NAT kinds (both
homes behind their own NAT, one relay on the backbone), the product's TCP hole punch (DCUtR over
our circuit relay) ends direct or stays relayed. Needs root, iproute2 and nftables.

Prints one JSON object as the last line: ``{"pairs", "direct", "direct_fraction",
"median_time_to_direct_s", "by_pair": {"kind/kind": {"direct", "seconds"}}, "seconds"}``
(``seconds`` per pair: from the relayed dial to the end of the punch attempt, direct or not).
``python bench/nat_matrix.py [--kinds full-cone,symmetric]``.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default=",".join(MATRIX_KINDS), help="comma-separated NAT kinds")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(json.dumps({"skipped": why}))
        return
    started = time.monotonic()
    out = run_matrix(tuple(args.kinds.split(",")))
    out["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
