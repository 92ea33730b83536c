"""Chain invariants checked incrementally over JSON-RPC while the network runs (the full scan of
``devtools.chaincheck`` at the end covers the same ground once more).

``ChainWatcher.step(confirmed)`` fetches the blocks every validator committed since the last step
and reports: a block or app hash differing between validators at a common height; a transaction
twice on chain; a sender's nonces not running 0, 1, 2, ...; a validator signing two different votes
for one (height, round, type) in any certificate any node stored; a transaction a client had a
receipt for at the previous step that is still not on chain; a supply total differing from
genesis. ``balances()`` (with the load drained, the chain quiet) adds: the balances and stakes of
every account seen plus burned and escrow equal the genesis supply, and each sender's account nonce
equals its transactions on chain.
"""
from __future__ import annotations

from collections import defaultdict

from consensus.genesis import Genesis
from devtools.chaincheck import BATCH, fetch_blocks
from node.ledger import jsonrpc


class ChainWatcher:
    def __init__(self, urls: list[str], genesis: Genesis):
        self.urls = list(urls)
        self.genesis = genesis
        self.checked = 0                               # every height <= this is verified on every validator
        self.seen: set[str] = set()                    # tx hashes on chain
        self.next_nonce: dict[str, int] = defaultdict(int)
        self.accounts = set(genesis.balances) | {v.peer_id for v in genesis.validators}
        self.votes: dict[tuple, str] = {}              # (validator, height, round, type) -> value id
        self.pending_confirmed: set[str] = set()
        self.txs = 0

    def step(self, confirmed: set[str]) -> list[str]:
        violations: list[str] = []
        heights = {url: jsonrpc.call(url, "dkb_blockNumber", timeout=10) for url in self.urls}
        top = min(heights.values())
        if top > self.checked:
            chains = {url: fetch_blocks(url, self.checked + 1, top) for url in self.urls}
            violations += self._compare(chains)
            violations += self._transactions(chains[self.urls[0]])
            violations += self._certificates(chains)
            self.checked = top
        missing = sorted(h for h in self.pending_confirmed if h not in self.seen)
        violations += [f"confirmed tx {h} is not on chain at height {top}" for h in missing]
        self.pending_confirmed = {h for h in confirmed if h not in self.seen}
        supply = jsonrpc.call(self.urls[0], "dkb_getSupply", timeout=30)
        if supply["total"] != self.genesis.total_supply:
            violations.append(f"supply {supply} != genesis supply {self.genesis.total_supply}")
        return violations

    def _compare(self, chains: dict[str, list[dict]]) -> list[str]:
        reference = chains[self.urls[0]]
        out = []
        for url in self.urls[1:]:
            for ref, other in zip(reference, chains[url]):
                if (ref["hash"], ref["app_hash"]) != (other["hash"], other["app_hash"]):
                    out.append(f"height {ref['height']}: {self.urls[0]} has block {ref['hash'][:16]} app "
                               f"{ref['app_hash'][:16]}, {url} has {other['hash'][:16]} app {other['app_hash'][:16]}")
                    break
        return out

    def _transactions(self, blocks: list[dict]) -> list[str]:
        out = []
        for block in blocks:
            for tx in block["transactions"]:
                if tx["hash"] in self.seen:
                    out.append(f"tx {tx['hash']} is on chain twice (again at height {block['height']})")
                self.seen.add(tx["hash"])
                self.txs += 1
                if "error" in tx:
                    out.append(f"height {block['height']}: undecodable tx {tx['hash']}")
                    continue
                sender = tx["from"]
                self.accounts.add(sender)
                if tx["type"] == "transfer":
                    self.accounts.add(tx["payload"]["to"])
                if tx["nonce"] != self.next_nonce[sender]:
                    out.append(f"{sender}: nonce {tx['nonce']} at height {block['height']}, "
                               f"expected {self.next_nonce[sender]}")
                self.next_nonce[sender] = tx["nonce"] + 1
        return out

    def _certificates(self, chains: dict[str, list[dict]]) -> list[str]:
        out = []
        for blocks in chains.values():
            for block in blocks:
                for vote in block["last_commit"] + block["commit"]:
                    if "error" in vote:
                        out.append(f"block {block['height']} has an undecodable certificate")
                        continue
                    key = (vote["validator"], vote["height"], vote["round"], vote["type"])
                    known = self.votes.setdefault(key, vote["value_id"])
                    if known != vote["value_id"]:
                        out.append(f"{key[0]} signed two different {key[3]}s at height {key[1]} round {key[2]}")
        return out

    def balances(self) -> list[str]:
        """Account sums and nonces; call with no transaction in flight and every validator at one height."""
        url = self.urls[0]
        out = []
        supply = jsonrpc.call(url, "dkb_getSupply", timeout=30)
        accounts = sorted(self.accounts)
        held = 0
        for start in range(0, len(accounts), BATCH // 2):   # 3 calls per account, a batch holds 100
            chunk = accounts[start:start + BATCH // 2]
            calls = [c for a in chunk for c in (("dkb_getBalance", [a]), ("dkb_getStake", [a]),
                                                ("dkb_getTransactionCount", [a, "latest"]))]
            results = jsonrpc.batch(url, calls, timeout=60)
            for account, balance, stake, nonce in zip(chunk, results[::3], results[1::3], results[2::3]):
                held += balance + stake["bonded"] + sum(amount for _, amount in stake["unbonding"])
                if nonce != self.next_nonce.get(account, 0):
                    out.append(f"{account}: account nonce {nonce} but {self.next_nonce.get(account, 0)} txs on chain")
        if held + supply["burned"] + supply["escrow"] != self.genesis.total_supply:
            out.append(f"accounts hold {held} (+burned {supply['burned']}, escrow {supply['escrow']}), "
                       f"genesis supply is {self.genesis.total_supply}")
        return out
