"""A joiner catching up on a crew's state over home links (issue 23: "a joiner catches up on a 100 MB
state at 100 Mbit/s in <= 30 s", docs/adr/0226), in the netlab: four real dekube Nodes, each in its own
home behind a NAT router (homes 1, 2, 4 endpoint-independent, home 3 symmetric: its links stay relayed),
each home's uplink and downlink capped by ``tc tbf`` (``--mbit``, 100 by default). Three members hold the
same trainer state file (model weights and Adam moments, ``--mib`` MiB); the fourth fetches it the way a
joiner does (ml/compute/crew_changes.py): from every holder at once over the node's artifact protocol,
then checks its sha256 and reads it with the bounded state-file reader. A second state is then fetched
from one holder alone, for comparison.

Prints one JSON object: ``catch_up_s`` (fetch + check + load from three holders), its parts, the bytes
each holder served, and the same for one holder.

    sudo python bench/state_catch_up.py                    # 100 MiB at 100 Mbit/s
    sudo python bench/state_catch_up.py --mib 20 --mbit 25
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.netlab.lab import unavailable  # noqa: E402
from devtools.netlab.train_net import HOME_NATS, settle, start_crew  # noqa: E402


def catch_up(joiner, holders, circuits, mib: int, seed: int, timeout: float) -> dict:
    states = [holder.call("add_state", mib=mib, seed=seed, timeout=timeout) for holder in holders]
    if len({s["artifact"] for s in states}) != 1:
        raise RuntimeError("the holders' state files differ")
    state = states[0]
    got = joiner.call("catch_up", artifact=state["artifact"], sha256=state["sha256"],
                      holders={h.peer_id: circuits[h.peer_id] for h in holders}, timeout=timeout)
    names = {h.peer_id: h.name for h in holders}
    return {"holders": len(holders), "state_mb": round(state["bytes"] / 1e6, 1),
            "catch_up_s": round(got["total_s"], 2), "fetch_s": round(got["fetch_s"], 2),
            "check_s": round(got["check_s"], 2), "load_s": round(got["load_s"], 2),
            "fetch_mbit_s": round(state["bytes"] * 8 / 1e6 / got["fetch_s"], 1),
            "bytes_by_holder": {names.get(p, p[:12]): n for p, n in got["per_holder"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="size of the state file")
    parser.add_argument("--mbit", type=float, default=100.0, help="each home's uplink and downlink (tc tbf)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"the netlab cannot be built here: {why}")
    started = time.monotonic()
    net, crew = start_crew(4, args.mbit)
    try:
        circuits, paths = settle(crew)
        *holders, joiner = crew
        three = catch_up(joiner, holders, circuits, args.mib, 1, args.timeout)
        one = catch_up(joiner, holders[:1], circuits, args.mib, 2, args.timeout)
    finally:
        net.close()
    print(json.dumps({"mbit": args.mbit, "nats": HOME_NATS, "paths": paths, **three, "one_holder": one,
                      "target_s": 30, "transport": "dekube artifact protocol over the node's TCP connections "
                                                   "(direct where punched, relayed for the symmetric home)",
                      "bench_seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()
