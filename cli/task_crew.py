"""The execution profile of a cuda or any task whose owner names none (issue 24, docs/adr/0196).

Every task names the one profile its whole crew runs (ADR 0188). ``task submit --device cpu`` names the
portable CPU profile; for ``--device cuda`` or ``--device any`` the command reads the compute nodes the
ledger lists (``dkb_listNodes``) and names the profile the most of them run -- for cuda among GPU
nodes' ``cuda-...`` profiles, for any among every profile (a cuda one counting only GPU nodes, as the
ledger's assignment does), ties to the lower id -- and says which before anything is paid. Too few
nodes for the workers asked is one line, also before payment.
"""
from __future__ import annotations

from collections import Counter

from cli.errors import CliError
from cli.rpc_call import rpc_call

LIST_LIMIT = 1000   # the ledger's bound on dkb_listNodes


def profile_counts(nodes: list[dict], device: str) -> Counter[str]:
    """How many compute nodes of ``nodes`` (dkb_listNodes records) run each profile a ``device`` task
    could name; a cuda profile counts only nodes that registered a GPU."""
    counts: Counter[str] = Counter()
    for node in nodes:
        hardware = node.get("hardware") if isinstance(node, dict) else None
        if not isinstance(hardware, dict) or "compute" not in (node.get("roles") or ()):
            continue
        profiles = hardware.get("profiles")
        for profile in set(profiles) if isinstance(profiles, list) else ():
            if not isinstance(profile, str) or not profile:
                continue
            cuda = profile.startswith("cuda-")
            if (device == "cuda" and not cuda) or (cuda and not hardware.get("gpu")):
                continue
            counts[profile] += 1
    return counts


def crew_profile(nodes: list[dict], device: str, workers: int) -> tuple[str, int]:
    """(profile, nodes running it): the profile the most compute nodes run for a ``device`` task;
    CliError when none does or fewer than ``workers``."""
    counts = profile_counts(nodes, device)
    if not counts:
        kind = "a cuda" if device == "cuda" else "any"
        raise CliError(f"no compute node on the ledger runs {kind} execution profile: name one with --profile ID "
                       "or submit with --device cpu")
    profile, found = min(counts.items(), key=lambda item: (-item[1], item[0]))
    if found < workers:
        raise CliError(f"the ledger lists {found} compute node(s) running {profile} (the most any profile has for "
                       f"--device {device}), fewer than --workers {workers}")
    return profile, found


def ledger_profile(rpc_url: str, device: str, workers: int) -> tuple[str, int]:
    """``crew_profile`` of the compute nodes the ledger at ``rpc_url`` lists."""
    nodes = rpc_call(rpc_url, "dkb_listNodes", "compute", None, LIST_LIMIT)
    if not isinstance(nodes, list):
        raise CliError("dkb_listNodes: the node answered something other than a list of nodes")
    return crew_profile(nodes, device, workers)
