"""The payouts of an ended task, labelled by what each was for: worker, verifier, referee, relay,
refund (the owner's unspent escrow: relay budget not claimed, pool remainders, shares of unpaid
workers) and reject fee. The ledger keeps one total per peer (``payouts``); the parts are derived from
the task record the way the ledger paid them (consensus/state/tasks.py ``apply_finalize`` and
``_end_rejected``, consensus/state/audits.py ``settle``) with the genesis defaults of the shares.
A peer whose parts do not add up to what the ledger paid it (a chain with other shares) is shown with
its total and role only, so a line never claims a split the chain did not make."""
from __future__ import annotations

from consensus.genesis import Params

PAID_OUTCOMES = ("ok", "guilty")


def _pool_shares(task: dict, pool: int) -> list[tuple[str, str, int]]:
    """(peer, "verifier"|"referee", amount): the verifier pool over the decided slots, as audits.settle."""
    by_slot = []
    for slot in task.get("slots") or []:
        verdict = slot.get("verdict")
        if slot.get("outcome") not in PAID_OUTCOMES or not verdict:
            continue
        key = (verdict.get("match"), verdict.get("evidence"))
        payees = [(v["verifier"], "verifier") for v in slot.get("verifiers") or []
                  if v.get("answer") and (v["answer"].get("match"), v["answer"].get("evidence")) == key]
        payees += [(r["referee"], "referee") for r in slot.get("referees") or []
                   if r.get("vote") and (r["vote"].get("match"), r["vote"].get("evidence")) == key]
        if payees:
            by_slot.append(payees)
    out = []
    for payees in by_slot:
        per_slot = pool // len(by_slot)
        out += [(peer, kind, per_slot // len(payees)) for peer, kind in payees]
    return out


def payout_parts(task: dict, params: Params | None = None) -> dict[str, list[tuple[str, int]]]:
    """peer -> [(kind, amount), ...] adding up to ``task["payouts"][peer]``; a peer the derivation does
    not explain gets [(its role, total)]."""
    params = params or Params()
    payouts = task.get("payouts") or {}
    owner, price, workers = task.get("owner"), int(task.get("price") or 0), task.get("workers") or []
    parts: dict[str, list[tuple[str, int]]] = {}

    def add(peer: str, kind: str, amount: int) -> None:
        if amount:
            parts.setdefault(peer, []).append((kind, amount))

    if task.get("status") == "paid" and workers:
        pool = price * params.verifier_share_bps // 10_000
        relay_budget = price * params.relay_share_bps // 10_000
        share = (price - pool - relay_budget) // len(workers)
        guilty = {s.get("worker") for s in task.get("slots") or [] if s.get("outcome") == "guilty"}
        for worker in workers:
            if worker in (task.get("commits") or {}) and worker not in guilty:
                add(worker, "worker", share)
        for peer, kind, amount in _pool_shares(task, pool):
            add(peer, kind, amount)
    elif task.get("status") == "rejected":
        rejecters = sorted(task.get("rejections") or {})
        claims = sum((task.get("relay_claims") or {}).values())
        fee = min(params.reject_fee, max(0, price - claims))
        for worker in rejecters:
            add(worker, "reject fee", fee // len(rejecters))
    for relay, amount in sorted((task.get("relay_claims") or {}).items()):
        if task.get("status") in ("paid", "rejected"):
            add(relay, "relay", amount)
    explained = {}
    for peer, total in payouts.items():
        mine = parts.get(peer, [])
        if peer == owner:
            rest = total - sum(a for _, a in mine)
            mine = mine + [("refund", rest)] if rest > 0 else mine
        explained[peer] = mine if sum(a for _, a in mine) == total else [(role_of(task, peer), total)]
    return explained


def role_of(task: dict, peer: str) -> str:
    """What `peer` is to `task` (owner, worker, verifier, referee, else relay)."""
    if peer == task["owner"]:
        return "owner"
    if peer in task["workers"]:
        return "worker"
    slots = task.get("slots") or []
    if any(v.get("verifier") == peer for slot in slots for v in slot.get("verifiers") or []):
        return "verifier"
    if any(r.get("referee") == peer for slot in slots for r in slot.get("referees") or []):
        return "referee"
    return "relay"


def payout_lines(task: dict, params: Params | None = None) -> list[str]:
    """One line per peer and kind, largest totals first, e.g. ``  12D3..  verifier  45``."""
    parts = payout_parts(task, params)
    totals = task.get("payouts") or {}
    lines = []
    for peer in sorted(parts, key=lambda p: -totals[p]):
        for kind, amount in parts[peer]:
            lines.append(f"  {peer}  {kind:10} {amount}")
    return lines
