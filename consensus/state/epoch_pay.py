"""Escrow released epoch by epoch (docs/adr/0230): a task's pay is cut per epoch, and each epoch's part
is paid out once that epoch's audit slots are resolved, while the crew trains on.

Epoch e of a task cut into E epochs holds 1/E of each seat's share and of the verifier pool (the
integer parts ``share x (e+1) // E - share x e // E``, so the parts add up to the whole). When every
audit slot of epoch e is resolved (consensus/state/audits.py opens them when the epoch closes), the
ledger pays each worker held to that epoch's work (``epochs.trained``) its part for the ``ok`` slots (ADR
0188), slashes a worker found guilty once (``slash_mismatch_bps``; it is unpaid from then on and out of
the crew), slashes each contradicted or withheld verifier answer, and pays the verifiers whose answers
agree with the verdicts. The task's ``payouts`` accumulate; what is never earned stays in the escrow for
the owner at finalize. A task without epochs is one epoch, released at finalize. No I/O.
"""
from __future__ import annotations

from consensus.genesis import Params
from consensus.state import audits, epochs
from consensus.state.records import SlotOutcome, Task
from consensus.state.staking import slash
from consensus.state.store import TASK, LedgerState

RELEASED, SLASHED, EARNED = "released", "slashed", "earned"   # task.epochs keys: epochs paid out, workers
                                                              # slashed, each worker's pay so far


def part(total: int, epoch: int, epoch_count: int) -> int:
    """Epoch ``epoch``'s integer part of ``total`` (the parts of all epochs add up to ``total``)."""
    return total * (epoch + 1) // epoch_count - total * epoch // epoch_count


def released(task: Task) -> list[int]:
    return list(task.epochs.get(RELEASED, []))


def slashed(task: Task) -> list[str]:
    return list(task.epochs.get(SLASHED, []))


def earned(task: Task) -> dict[str, int]:
    """What each worker of a task cut into epochs has been paid for its work so far."""
    return dict(task.epochs.get(EARNED, {}))


def epoch_slots(task: Task, epoch: int) -> list[dict]:
    return [slot for slot in task.slots if audits.slot_epoch(slot) == epoch]


def releasable(task: Task, epoch: int) -> bool:
    """Whether a progress epoch can be paid out now: it closed, every earlier one was paid out (in order,
    so a verdict in an earlier epoch counts before a later one pays), and its slots are resolved."""
    return (epoch < epochs.closed(task) and released(task) == list(range(epoch))
            and all(slot["outcome"] != SlotOutcome.PENDING for slot in epoch_slots(task, epoch)))


def release(state: LedgerState, params: Params, task_id: bytes, task: Task, epoch: int, share: int,
            verifier_pool: int) -> tuple[audits.Settlement, dict[str, int]]:
    """Pay out ``epoch`` (its slots resolved): the workers held to its work, its verifiers; slash who the
    verdicts convict. ``share`` and ``verifier_pool`` are the task's per seat and in all. The payouts are
    credited, added to ``task.payouts`` and taken from the escrow; returns what the slots decided (the
    caller adjusts reputations) and what each worker earned."""
    count = epochs.count(task)
    slots = epoch_slots(task, epoch)
    settlement = audits.settle(slots, part(verifier_pool, epoch, count))
    guilty = audits.guilty_workers(task)   # found guilty in any epoch so far: unpaid from then on
    payouts: dict[str, int] = {}
    for worker in sorted(epochs.trained(task, epoch)):
        if worker in guilty:
            continue
        amount = settlement.paid_share(slots, worker, part(share, epoch, count))
        if amount:
            payouts[worker] = amount
    wages = dict(payouts)
    for worker in sorted(settlement.guilty - set(slashed(task))):
        slash(state, worker, params.slash_mismatch_bps)
        if count > 1:
            task.epochs.setdefault(SLASHED, []).append(worker)
    for verifier in settlement.false_answers:
        slash(state, verifier, params.slash_false_audit_bps)
    for peer_id, amount in settlement.shares.items():
        if amount:
            payouts[peer_id] = payouts.get(peer_id, 0) + amount
    for peer_id, amount in sorted(payouts.items()):
        state.credit(peer_id, amount)
        task.payouts[peer_id] = task.payouts.get(peer_id, 0) + amount
    task.escrow -= sum(payouts.values())
    if count > 1:   # a task without epochs is released once, at finalize
        task.epochs.setdefault(RELEASED, []).append(epoch)
        so_far = task.epochs.setdefault(EARNED, {})
        for worker, amount in wages.items():
            so_far[worker] = so_far.get(worker, 0) + amount
        state.events.append({"type": "epoch_paid", "task_id": task_id, "epoch": epoch, "payouts": payouts,
                             "slashed": sorted(settlement.guilty | set(settlement.false_answers))})
    state.touch(TASK, task_id)
    return settlement, wages
