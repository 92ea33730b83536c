"""The payouts of an ended task, labelled by what each was for: worker, verifier, referee, relay,
refund (the owner's unspent escrow: relay budget not claimed, pool remainders, shares of unpaid
workers) and reject fee. The ledger keeps one total per peer (``payouts``); the parts are derived from
the task record the way the ledger paid them (consensus/state/tasks.py ``apply_finalize`` and
``_end_rejected``, consensus/state/audits.py ``settle``) with the genesis defaults of the shares.
A peer whose parts do not add up to what the ledger paid it (a chain with other shares) is shown with
its total and role only, so a line never claims a split the chain did not make."""
from __future__ import annotations

from consensus.genesis import Params
from consensus.state.epoch_pay import part
from consensus.task_info import AuditSlot, SlotOutcome, TaskInfo, TaskStatus


def _payees(slot: AuditSlot) -> list[tuple[str, str]]:
    """(peer, "verifier"|"referee") of a decided slot whose answer or vote agrees with its verdict."""
    if slot.outcome not in SlotOutcome.PAID or slot.verdict is None:
        return []
    key = slot.verdict.key
    payees = [(v.verifier, "verifier") for v in slot.verifiers if v.answer and v.answer.key == key]
    return payees + [(r.referee, "referee") for r in slot.referees if r.vote and r.vote.key == key]


def _pool_shares(task: TaskInfo, pool: int) -> list[tuple[str, str, int]]:
    """(peer, "verifier"|"referee", amount): each epoch's part of the verifier pool over its decided slots, as
    consensus/state/epoch_pay.py pays it (a task without epochs is one)."""
    count = task.spec_field("epochs", 1)
    count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
    out = []
    for epoch in range(count):
        by_slot = [payees for payees in map(_payees, [s for s in task.slots if s.epoch == epoch]) if payees]
        for payees in by_slot:
            per_slot = part(pool, epoch, count) // len(by_slot)
            out += [(peer, kind, per_slot // len(payees)) for peer, kind in payees]
    return out


def payout_parts(task: TaskInfo, params: Params | None = None) -> dict[str, list[tuple[str, int]]]:
    """peer -> [(kind, amount), ...] adding up to ``task.payouts[peer]``; a peer the derivation does
    not explain gets [(its role, total)]."""
    params = params or Params()
    price, workers = task.price, task.workers
    parts: dict[str, list[tuple[str, int]]] = {}

    def add(peer: str, kind: str, amount: int) -> None:
        if amount:
            parts.setdefault(peer, []).append((kind, amount))

    pool = price * params.verifier_share_bps // 10_000
    if task.epochs is not None and task.status in (TaskStatus.PAID, TaskStatus.STOPPED):   # paid per epoch (0230)
        for worker, amount in sorted(task.epochs.earned.items()):
            add(worker, "worker", amount)
        for peer, kind, amount in _pool_shares(task, pool):
            add(peer, kind, amount)
    elif task.status == TaskStatus.PAID and workers:
        relay_budget = price * params.relay_share_bps // 10_000
        share = (price - pool - relay_budget) // len(workers)
        guilty = {s.worker for s in task.slots if s.outcome == SlotOutcome.GUILTY}
        for worker in workers:
            if worker in task.commits and worker not in guilty:
                add(worker, "worker", share)
        for peer, kind, amount in _pool_shares(task, pool):
            add(peer, kind, amount)
    elif task.status == TaskStatus.REJECTED:
        rejecters = sorted(task.rejections)
        claims = sum(task.relay_claims.values())
        fee = min(params.reject_fee, max(0, price - claims))
        for worker in rejecters:
            add(worker, "reject fee", fee // len(rejecters))
    for relay, amount in sorted(task.relay_claims.items()):
        if task.status in (TaskStatus.PAID, TaskStatus.STOPPED, TaskStatus.REJECTED):
            add(relay, "relay", amount)
    explained = {}
    for peer, total in task.payouts.items():
        mine = parts.get(peer, [])
        if peer == task.owner:
            rest = total - sum(a for _, a in mine)
            mine = mine + [("refund", rest)] if rest > 0 else mine
        explained[peer] = mine if sum(a for _, a in mine) == total else [(role_of(task, peer), total)]
    return explained


def role_of(task: TaskInfo, peer: str) -> str:
    """What `peer` is to `task` (owner, worker, verifier, referee, else relay)."""
    if peer == task.owner:
        return "owner"
    if peer in task.workers:
        return "worker"
    if any(v.verifier == peer for slot in task.slots for v in slot.verifiers):
        return "verifier"
    if any(r.referee == peer for slot in task.slots for r in slot.referees):
        return "referee"
    return "relay"


def payout_lines(task: TaskInfo, params: Params | None = None) -> list[str]:
    """One line per peer and kind, largest totals first, e.g. ``  12D3..  verifier  45``."""
    parts = payout_parts(task, params)
    totals = task.payouts
    lines = []
    for peer in sorted(parts, key=lambda p: -totals[p]):
        for kind, amount in parts[peer]:
            lines.append(f"  {peer}  {kind:10} {amount}")
    return lines
