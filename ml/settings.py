"""The config sections the ml layer owns (ADR 0201): ``[compute]`` (the compute role, with its testing-only
fault modes) and ``[serve]`` (the serving service), with their defaults; cli/assembly.py hands them to the
node's config."""
from __future__ import annotations

import re

from node.config import Key, check_choice, check_non_negative, check_non_negative_float, check_positive, check_rpc_url

FAULT_MODES = ("", "wrong_segments", "lazy", "poison_zero", "poison_noise", "poison_stealth", "copycat",
               "false_accuser", "rubber_stamp")


def check_fault_mode(value: str) -> None:
    if value in FAULT_MODES or re.fullmatch(r"partial:(0(\.\d+)?|1(\.0+)?)", value):
        return
    raise ValueError(f"{value!r} is not one of {', '.join(FAULT_MODES[1:])} or partial:<q> (0 <= q <= 1)")


def check_blocks(value: str) -> None:
    """A:B (0 <= A < B) or auto:N (N >= 1); the model's block count is checked when serving starts."""
    kind, _, rest = value.partition(":")
    if kind == "auto":
        if not rest.isdigit() or int(rest) < 1:
            raise ValueError("auto:N needs N >= 1")
    elif not (kind.isdigit() and rest.isdigit() and int(kind) < int(rest)):
        raise ValueError("blocks are A:B with A < B, or auto:N")


SECTIONS: dict[str, dict[str, Key]] = {
    "compute": {
        "rpc_url": Key(str, "",
                       "legacy: a validator JSON-RPC URL for the node's ledger gateway (see [ledger] rpc_urls)",
                       check_rpc_url),
        "stake": Key(int, 1_000, "stake the compute node keeps bonded (bonds the difference at start)"),
        "bandwidth_mbps": Key(int, 100, "upload bandwidth declared in the node registration (Mbit/s)"),
        "poll_interval": Key(float, 0.5,
                             "seconds before retrying after the ledger failed a look at the tasks (task changes arrive"
                             " on the tasks subscription)", check_positive),
        "audit": Key(bool, True, "replay and audit other workers' results (as a verifier) when idle"),
        "hours": Key(str, "", "local hours when new tasks are taken, e.g. 22-7; empty: any (ADR 0198)"),
        "max_task_s": Key(int, 0, "the longest task taken, by its declared duration in seconds; 0: any",
                          check_non_negative),
        "cuda_devices": Key(int, -1, "CUDA devices lent: -1 all, 0 none (CPU tasks only)"),
        "cpu_cores": Key(int, 0, "CPU cores (torch threads) the node's training uses; 0: all (ADR 0220)",
                         check_non_negative),
        "memory_mb": Key(int, 0, "the largest training state (weights, gradients, optimizer moments) a task "
                                 "may need, in MB; 0: any (ADR 0220)", check_non_negative),
        "portable_cpu": Key(bool, True,
                            "train on CPU under the portable CPU profile (ADR 0166: AVX2 kernels, bitwise identical "
                            "on every x86-64 CPU with AVX2); false: the machine's fastest kernels, and the node "
                            "offers no CPU profile"),
        "allreduce_mode": Key(str, "butterfly",
                              "all-reduce algorithm: butterfly or ring", check_choice(("butterfly", "ring"))),
        "fault_inject": Key(str, "",
                            "TESTING ONLY: an adversary mode (docs/adr/0167): worker lazy | partial:<q> | poison_zero"
                            " | poison_noise | poison_stealth | copycat | wrong_segments,"
                            " verifier false_accuser | rubber_stamp",
                            check_fault_mode),
    },
    "serve": {
        "model": Key(str, "",
                     "with the compute role: serve this model's blocks (random:<L>x<W>[:heads][@seed] or a "
                     "char-transformer .safetensors path; ADRs 0171-0177); empty: no serving"),
        "blocks": Key(str, "auto:1",
                      "blocks to serve: A:B, or auto:N (the N thinnest blocks in the ledger's coverage)",
                      check_blocks),
        "price": Key(int, 0, "price per GFLOP billed with co-signed receipts (0: free)", check_non_negative),
        "credit_tokens": Key(int, 1024, "tokens served ahead of a client's receipt", check_positive),
        "max_sessions": Key(int, 64, "inference sessions held at once", check_positive),
        "device": Key(str, "auto", "where the served blocks compute: auto (CUDA when torch sees it, else CPU), cpu or "
                      "cuda (ADR 0179; cuda without a CUDA device stops the node at start)",
                      check_choice(("auto", "cpu", "cuda"))),
        "claim_every": Key(float, 30.0,
                           "seconds between receipt claims, referee duty and announcement refresh", check_positive),
        "rebalance_every": Key(float, 0.0,
                               "seconds between coverage checks moving an idle server to thinner blocks (0: never)",
                               check_non_negative_float),
    },
}
