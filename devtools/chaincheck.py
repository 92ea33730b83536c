"""Chain invariants checked over JSON-RPC on every node (the CometBFT e2e invariants).

``check_chain(urls, genesis, confirmed)`` returns a list of violations (empty when all hold):
- every node has the same block hash and app hash at every height up to the lowest node's height;
- every transaction in ``confirmed`` (hashes a client got a successful receipt for) is on chain
  exactly once, and no transaction appears twice anywhere;
- per sender, the nonces of the transactions on chain run 0, 1, 2, ... without gap or repeat and
  end at the account's nonce;
- supply is conserved: the node's breakdown sums to the genesis supply, and the balances and
  stakes of every account seen (genesis accounts, senders, recipients) add up to it as well;
- no validator signed two different votes for one (height, round, type): every certificate any
  node stored or put in a block is compared.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from consensus.genesis import Genesis
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable

BATCH = 50


def fetch_blocks(url: str, first: int, last: int) -> list[dict]:
    """Blocks ``first..last`` of the node at ``url`` with their transactions, fetched in batches."""
    out = []
    for start in range(first, last + 1, BATCH):
        calls = [("dkb_getBlockByNumber", [h, True]) for h in range(start, min(last, start + BATCH - 1) + 1)]
        for result in jsonrpc.batch(url, calls, timeout=60):
            if isinstance(result, Exception) or result is None:
                raise LedgerUnavailable(f"{url}: block fetch failed: {result}")
            out.append(result)
    return out


def check_chain(urls: list[str], genesis: Genesis, confirmed: set[str] | frozenset = frozenset()) -> list[str]:
    violations: list[str] = []
    heights = {url: jsonrpc.call(url, "dkb_blockNumber") for url in urls}
    top = min(heights.values())
    chains = {url: fetch_blocks(url, 1, heights[url]) for url in urls}
    reference = chains[urls[0]][:top]

    for url in urls[1:]:
        for ref, other in zip(reference, chains[url][:top]):
            if (ref["hash"], ref["app_hash"]) != (other["hash"], other["app_hash"]):
                violations.append(f"height {ref['height']}: {urls[0]} has block {ref['hash'][:16]} app "
                                  f"{ref['app_hash'][:16]}, {url} has {other['hash'][:16]} app "
                                  f"{other['app_hash'][:16]}")
                break

    longest = max(chains.values(), key=len)
    counts = Counter(tx["hash"] for block in longest for tx in block["transactions"])
    violations += [f"tx {h} is on chain {n} times" for h, n in counts.items() if n > 1]
    violations += [f"confirmed tx {h} is not on chain" for h in sorted(confirmed) if counts[h] == 0]

    nonces: dict[str, list[int]] = defaultdict(list)
    accounts = set(genesis.balances) | {v.peer_id for v in genesis.validators}
    for block in longest:
        for tx in block["transactions"]:
            if "error" in tx:
                continue
            nonces[tx["from"]].append(tx["nonce"])
            accounts.add(tx["from"])
            if tx["type"] == "transfer":
                accounts.add(tx["payload"]["to"])
    url = max(heights, key=heights.get)
    for sender, seen in nonces.items():
        if seen != list(range(len(seen))):
            violations.append(f"{sender}: nonces on chain are not 0..{len(seen) - 1} in order: {seen[:20]}")
        account_nonce = jsonrpc.call(url, "dkb_getTransactionCount", sender, "latest")
        if account_nonce != len(seen):
            violations.append(f"{sender}: account nonce {account_nonce} but {len(seen)} txs on chain")

    supply = jsonrpc.call(url, "dkb_getSupply")
    if supply["total"] != genesis.total_supply:
        violations.append(f"supply {supply} != genesis supply {genesis.total_supply}")
    held = 0
    sorted_accounts = sorted(accounts)
    for start in range(0, len(sorted_accounts), BATCH):
        chunk = sorted_accounts[start:start + BATCH]
        calls = [c for a in chunk for c in (("dkb_getBalance", [a]), ("dkb_getStake", [a]))]
        results = jsonrpc.batch(url, calls, timeout=60)
        for balance, stake in zip(results[::2], results[1::2]):
            held += balance + stake["bonded"] + sum(amount for _, amount in stake["unbonding"])
    if held + supply["burned"] + supply["escrow"] != genesis.total_supply:
        violations.append(f"accounts hold {held} (+burned {supply['burned']}, escrow {supply['escrow']}), "
                          f"genesis supply is {genesis.total_supply}")

    signed: dict[tuple, set[str]] = defaultdict(set)
    for blocks in chains.values():
        for block in blocks:
            for vote in block["last_commit"] + block["commit"]:
                if "error" in vote:
                    violations.append(f"block {block['height']} has an undecodable certificate")
                    continue
                signed[(vote["validator"], vote["height"], vote["round"], vote["type"])].add(vote["value_id"])
    violations += [f"{v} signed {len(ids)} different {t}s at height {h} round {r}"
                   for (v, h, r, t), ids in signed.items() if len(ids) > 1]
    return violations
