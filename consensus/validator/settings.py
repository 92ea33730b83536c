"""The validator role's config section, ``[consensus]``, with its defaults (ADR 0201: each role owns its
section; cli/assembly.py hands it to the node's config)."""
from __future__ import annotations

from node.config import Key, check_choice, check_positive


def check_retain_blocks(value: int) -> None:
    if value != 0 and value < 100:
        raise ValueError("must be 0 (keep every block) or at least 100")


SECTIONS: dict[str, dict[str, Key]] = {
    "consensus": {
        "chain_id": Key(str, "dekube-local", "identifier of the chain; signatures cover it"),
        "genesis_file": Key(str, "genesis.json", "genesis document, relative to the node home"),
        "timeout_propose": Key(float, 1.0,
                               "seconds to wait for a proposal in round 0 (+50% per round)", check_positive),
        "timeout_vote": Key(float, 0.5,
                            "seconds to wait for more prevotes/precommits in round 0 (+50% per round)", check_positive),
        "empty_block_wait": Key(float, 0.3,
                                "seconds a proposer waits for transactions before an empty block while a task or "
                                "serving dispute is in flight (its deadlines and draws need blocks)", check_positive),
        "idle_block_wait": Key(float, 2.0,
                               "seconds a proposer waits for transactions before an empty block while nothing is in "
                               "flight (an idle chain: fewer blocks to store); a transaction still goes in the next "
                               "block at once; docs/adr/0213", check_positive),
        "max_block_txs": Key(int, 5000, "most transactions this node puts in a block it proposes", check_positive),
        "mempool_max_txs": Key(int, 50000, "most transactions held in the mempool", check_positive),
        "retain_blocks": Key(int, 100_000,
                             "blocks (with their certificates) kept; older ones are pruned and the RPC answers "
                             "'pruned' for them; a node away longer rejoins from a state snapshot (docs/adr/0214); "
                             "0 keeps every block (an archive node); at least 100 otherwise; docs/adr/0199",
                             check_retain_blocks),
        "state_sync": Key(bool, True,
                          "a node outside the committee with an empty chain database starts from the committee's "
                          "latest state snapshot (checked against the genesis committee) instead of block 1; "
                          "docs/adr/0199"),
        "verify_db": Key(str, "auto",
                         "start-up check of the chain database: full (read every block), recent (state and the "
                         "last 1000 blocks), auto (full up to 512 MiB, else recent); docs/adr/0142",
                         check_choice(("auto", "full", "recent"))),
    },
}
