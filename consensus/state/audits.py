"""Audit slots (docs/adr/0168): drawn verifiers, answers with evidence, disputes, referees, verdicts.

When an epoch of a task closes (a task without epochs is one epoch, closed with its commit phase; ADR 0230),
each worker held to its work gets ``audits_per_worker`` slots (``open_slots``, one ``Target`` each: the
commitment covering the epoch); ``beacon_delay`` blocks later (ADR 0202) a slot gets one segment of that epoch
(drawn uniformly, with replacement, among the epoch's segments of the worker's commitment), a 32-byte salt and
one verifier drawn stake-weighted among the eligible ones (``eligible_verifiers``), plus a second verifier
with probability ``audit_double_bps``. Every draw is a sha256 of the task's audit seed and the random beacon
(consensus/beacon.py) of the block that runs it, which is always ``beacon_delay`` blocks after the act that
called for it: nobody knew it when that act became final, and every replica draws the same.

A slot moves: answering (its verifiers commit to their answers with ``audit_commit`` by their deadlines; a
verifier silent at its deadline is redrawn, up to ``audit_redraws`` times a seat; then every committed answer
is revealed with ``audit_result``, consensus/state/answers.py) -> all answers equal and ``match`` -> ``ok``;
all equal and a mismatch -> the worker may ``dispute`` for ``dispute_s`` (no dispute -> ``guilty``; unless the
worker left the crew of a task cut into epochs and every answer says it is unreachable: ``unaudited``,
consensus/state/epochs.py); answers that differ, or a dispute -> ``referees`` drawn, each commits its vote
with ``referee_commit`` by its deadline and reveals it with ``referee_vote`` once the votes open (ADR 0210,
consensus/state/answers.py); the (match, evidence) most votes agree on, leading every other value strictly and
cast by a majority of a full panel, is the verdict (``guilty`` iff its match is false); a tie, or too few
votes, draws a larger panel (``referee_rounds`` panels at most, ADR 0188), after which the slot is
``undecided``. No answer after every redraw -> ``unaudited``. A worker is paid only for its slots that ended
``ok`` (ADR 0188: never paid unaudited or undecided); ``settle`` turns the resolved slots into who is guilty,
who is paid from the verifier pool and whose answer or referee vote the verdict contradicts (slashed at
finalize). Deadlines are block times (ms) from consensus/state/deadlines.py (docs/adr/0187).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from consensus.genesis import Params
from consensus.state import availability, deadlines, epochs
from consensus.state.context import BlockContext
from consensus.state.records import SlotOutcome, Task, TaskStatus
from consensus.state.retention import missing_task
from consensus.state.store import TASK, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError

PENDING, OK, GUILTY, UNAUDITED, UNDECIDED = (SlotOutcome.PENDING, SlotOutcome.OK, SlotOutcome.GUILTY,
                                             SlotOutcome.UNAUDITED, SlotOutcome.UNDECIDED)
OPEN, REDRAW, REFEREE = "open", "redraw", "referee"    # what a scheduled draw picks (ADR 0202)
VERIFIER_ROLES = frozenset({"compute", "verifier"})

Slot = dict[str, Any]


# ---- who may verify, and stake-weighted draws ------------------------------------------------

def runs_profile(hardware: dict[str, Any], profile: str) -> bool:
    """Whether a node with ``hardware`` runs ``profile``: it lists it. Nobody runs "" (a task from
    before ADR 0188 without a profile), and a node that lists no profile runs none: it neither works
    nor judges (ADR 0188)."""
    return bool(profile) and profile in hardware.get("profiles", ())


def eligible_verifiers(state: LedgerState, params: Params, profile: str,
                       excluded: set[str] | frozenset[str]) -> list[tuple[str, int]]:
    """``(peer_id, bonded)`` of the nodes that may verify a task of ``profile``, by peer ID: a compute
    (or verifier) role, at least ``min_verifier_stake`` bonded, the profile in ``hardware.profiles``."""
    out = []
    for peer_id in sorted(state.nodes):
        if peer_id in excluded:
            continue
        node = state.nodes[peer_id]
        stake = state.stakes.get(peer_id)
        if (stake is not None and stake.bonded >= params.min_verifier_stake
                and VERIFIER_ROLES.intersection(node.roles) and runs_profile(node.hardware, profile)):
            out.append((peer_id, stake.bonded))
    return out


def draw_number(material: bytes, modulus: int) -> int:
    """A number in [0, modulus) from sha256(material) (bias below 2**-200 for any stake total)."""
    return int.from_bytes(hashlib.sha256(material).digest(), "big") % modulus


def draw_weighted(material: bytes, weighted: list[tuple[str, int]]) -> str | None:
    """One peer of ``weighted``, each with probability proportional to its weight; None if empty."""
    total = sum(weight for _, weight in weighted)
    if total <= 0:
        return None
    point = draw_number(material, total)
    for peer_id, weight in weighted:
        if point < weight:
            return peer_id
        point -= weight
    raise AssertionError("unreachable: the point lies below the total")


def draw_distinct(material: bytes, weighted: list[tuple[str, int]], count: int) -> list[str]:
    """Up to ``count`` distinct peers drawn stake-weighted without replacement."""
    pool = list(weighted)
    chosen: list[str] = []
    while pool and len(chosen) < count:
        peer_id = draw_weighted(material + len(chosen).to_bytes(2, "big"), pool)
        if peer_id is None:
            break
        chosen.append(peer_id)
        pool = [entry for entry in pool if entry[0] != peer_id]
    return chosen


def _material(task: Task, label: bytes, index: int, extra: bytes = b"") -> bytes:
    return b"dekube/audit-draw\x00" + task.audit_seed + extra + label + index.to_bytes(4, "big")


def _verifier_entry(peer_id: str, deadline: int, redraw: bool = False) -> dict[str, Any]:
    return {"verifier": peer_id, "deadline": deadline, "commitment": None, "answer": None, "redraw": redraw}


def can_audit_every_worker(state: LedgerState, params: Params, profile: str, owner: str,
                           workers: list[str]) -> bool:
    """Whether each of ``workers`` would have at least one eligible verifier (the rule assignment
    applies when ``audits_per_worker`` > 0, ADR 0168)."""
    if params.audits_per_worker == 0:
        return True
    verifiers = [peer_id for peer_id, _ in eligible_verifiers(state, params, profile, {owner})]
    return all(any(v != worker for v in verifiers) for worker in workers)


# ---- slots open when an epoch closes (or the commit phase); every draw waits for a later beacon ---

@dataclass(frozen=True)
class Target:
    """One commitment to audit: ``worker``'s ``segments_root`` over its segments ``first`` (0, or a
    joiner's first) up to ``segments``; the slots draw among segments ``low`` .. ``segments`` - 1 (the
    epoch's, docs/adr/0230)."""

    worker: str
    segments_root: bytes
    segments: int
    first: int
    low: int


def open_slots(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task, epoch: int,
               targets: list[Target]) -> None:
    """Open ``audits_per_worker`` slots of ``epoch`` for each target (in worker order), after the task's
    earlier slots; their segment, salt and verifiers are drawn ``beacon_delay`` blocks later, from a beacon
    nobody knew when the commitments became final (ADR 0202)."""
    at = ctx.height + params.beacon_delay
    opened = 0
    for target in sorted(targets, key=lambda t: t.worker):
        for _ in range(params.audits_per_worker):
            task.slots.append({
                "slot": len(task.slots), "worker": target.worker, "segment": 0, "salt": b"", "verifiers": [],
                "dispute_deadline": 0, "dispute": None, "referees": [], "referee_deadline": 0, "verdict": None,
                "outcome": PENDING, "reveal_deadline": 0, "draw": {"kind": OPEN, "at": at, "count": 0},
                "epoch": epoch, "commit": {"root": target.segments_root, "segments": target.segments,
                                           "first": target.first, "low": target.low},
            })
            opened += 1
    if opened:
        state.events.append({"type": "audit_draw_scheduled", "task_id": task_id, "height": at, "epoch": epoch})
    refresh_status(task)
    state.touch(TASK, task_id)


def slot_epoch(slot: Slot) -> int:
    """The epoch whose work ``slot`` audits (0 for a task without epochs)."""
    return int(slot.get("epoch", 0))


def _schedule(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot, kind: str,
              count: int) -> None:
    """Draw ``count`` parties of ``kind`` (redraw, referee) for ``slot`` at the end of the block
    ``beacon_delay`` blocks from now."""
    slot["draw"] = {"kind": kind, "at": ctx.height + params.beacon_delay, "count": count}
    state.events.append({"type": "audit_draw_scheduled", "task_id": task_id, "slot": slot["slot"], "kind": kind,
                         "height": slot["draw"]["at"]})


def _run_draw(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task, slot: Slot) -> bool:
    """The slot's scheduled draw, from this block's beacon."""
    draw = slot.pop("draw")
    if draw["kind"] == OPEN:
        _draw_open(state, params, ctx, task_id, task, slot)
    elif draw["kind"] == REDRAW:
        _draw_replacements(state, params, ctx, task_id, task, slot, draw["count"])
    elif not _add_referees(state, params, ctx, task_id, task, slot, draw["count"]):
        verdict = referee_verdict(params, slot) if slot["referees"] else None
        if verdict is not None:   # nobody left to grow a split panel: its majority decides
            _decide(state, task_id, slot, verdict)
        else:
            slot["outcome"] = UNDECIDED
            _resolved(state, task_id, slot)
    return True


def _draw_open(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task, slot: Slot) -> None:
    """A slot's segment (uniform), salt and verifier (stake-weighted), plus a second verifier with
    probability ``audit_double_bps``; ``unaudited`` at once without any eligible verifier."""
    if not task.audit_seed:
        task.audit_seed = hashlib.sha256(b"dekube/audit-seed\x00" + ctx.beacon + task_id).digest()
    index, worker = slot["slot"], slot["worker"]
    segments, start = slot["commit"]["segments"], slot["commit"]["low"]   # the epoch's segments (ADR 0230)
    deadline = deadlines.answer_deadline(params, ctx, task)
    pool = eligible_verifiers(state, params, task.profile, {task.owner, worker})
    first = draw_weighted(_material(task, b"verifier", index), pool)
    verifiers = []
    if first is not None:
        verifiers.append(_verifier_entry(first, deadline))
        if draw_number(_material(task, b"double", index), 10_000) < params.audit_double_bps:
            second = draw_weighted(_material(task, b"second", index), [entry for entry in pool if entry[0] != first])
            if second is not None:
                verifiers.append(_verifier_entry(second, deadline))
    slot["segment"] = start + draw_number(_material(task, b"segment", index), segments - start)
    slot["salt"] = hashlib.sha256(_material(task, b"salt", index)).digest()
    slot["verifiers"] = verifiers
    state.events.append({"type": "audit_assigned", "task_id": task_id, "slot": index, "worker": worker,
                         "segment": slot["segment"], "verifiers": [v["verifier"] for v in verifiers],
                         "salt": slot["salt"], "deadline": deadline})
    if not verifiers:
        slot["outcome"] = UNAUDITED
        _resolved(state, task_id, slot)


# ---- moving slots along -----------------------------------------------------------------------

def advance_task(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task,
                 closing: bool) -> None:
    """Advance every pending slot; ``closing``: at the end of the block (deadlines at this block's time
    have passed, scheduled draws run)."""
    changed = False
    for slot in task.slots:
        if slot["outcome"] == PENDING:
            changed |= _advance(state, params, ctx, task_id, task, slot, closing)
    if changed:
        refresh_status(task)
        state.touch(TASK, task_id)


def _expired(deadline: int, ctx: BlockContext, closing: bool) -> bool:
    return deadlines.passed(deadline, ctx, closing)


def _advance(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task, slot: Slot,
             closing: bool) -> bool:
    """One step of ``slot``'s state machine; True when it changed."""
    if slot.get("draw"):
        return closing and ctx.height >= slot["draw"]["at"] and _run_draw(state, params, ctx, task_id, task, slot)
    if slot["referees"]:
        return _advance_referees(state, params, ctx, task_id, slot, closing)
    if availability.challenge_open(slot):
        if not _expired(slot["challenge"]["deadline"], ctx, closing) or epochs.presence_unknown(task, slot):
            return False   # an epoch's worker that went silent: wait until it commits again or leaves (ADR 0230)
        if epochs.left_crew(task, slot["worker"]):   # it crashed or left: its slot ends unaudited (ADR 0203)
            availability.close_challenge(state, task_id, slot)
            slot["outcome"] = UNAUDITED
        else:
            availability.expire_challenge(state, task_id, slot)
        _resolved(state, task_id, slot)
        return True
    if slot["dispute_deadline"]:
        if _expired(slot["dispute_deadline"], ctx, closing):
            slot["outcome"] = GUILTY
            _resolved(state, task_id, slot)
            return True
        return False
    if not slot.get("reveal_deadline"):
        return _close_commitments(state, params, ctx, task_id, slot, closing)
    return _close_reveals(state, params, ctx, task_id, task, slot, closing)


def sealed(entry: dict[str, Any]) -> bool:
    """Whether a verifier (or referee) entry committed to an answer (a vote) it may still reveal."""
    return entry.get("commitment") is not None and not entry.get("unrevealed")


def _advance_referees(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot,
                      closing: bool) -> bool:
    """The referees' votes, committed then revealed (ADR 0210): once no referee may still commit (all
    committed or the referee deadline passed) the reveals open for ``audit_reveal_s``; once every sealed
    vote is revealed or that window closed, a vote never revealed is marked ``unrevealed`` (slashed at
    finalize, and no vote) and the revealed votes decide."""
    referees = slot["referees"]
    if not slot.get("referee_reveal_deadline"):
        if any(r.get("commitment") is None and r["vote"] is None and not r.get("unrevealed") for r in referees) \
                and not _expired(slot["referee_deadline"], ctx, closing):
            return False
        if any(sealed(r) and r["vote"] is None for r in referees):
            slot["referee_reveal_deadline"] = deadlines.reveal_deadline(params, ctx)
            state.events.append({"type": "referee_reveal_open", "task_id": task_id, "slot": slot["slot"],
                                 "deadline": slot["referee_reveal_deadline"]})
            return True
    else:
        waiting = [r for r in referees if sealed(r) and r["vote"] is None]
        if waiting and not _expired(slot["referee_reveal_deadline"], ctx, closing):
            return False
        for r in waiting:
            r["unrevealed"] = True
            state.events.append({"type": "referee_unrevealed", "task_id": task_id, "slot": slot["slot"],
                                 "referee": r["referee"]})
        slot["referee_reveal_deadline"] = 0
    _decide_by_referees(state, params, ctx, task_id, slot)
    return True


def _close_commitments(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot,
                       closing: bool) -> bool:
    """Once no verifier may still commit: redraw the silent ones (while ``redraws_left``), else open the
    reveals (nobody has revealed anything before every seat is committed or given up, so nobody can
    copy), else, without any commitment, ``unaudited``."""
    verifiers = slot["verifiers"]
    if any(v.get("commitment") is None and not _expired(v["deadline"], ctx, closing) for v in verifiers):
        return False
    silent = [v for v in verifiers if v.get("commitment") is None and not v.get("replaced")]
    if silent and redraws_left(params, slot) > 0:
        _replace(state, params, ctx, task_id, slot, silent)
    elif any(sealed(v) for v in verifiers):
        slot["reveal_deadline"] = deadlines.reveal_deadline(params, ctx)
        state.events.append({"type": "audit_reveal_open", "task_id": task_id, "slot": slot["slot"],
                             "deadline": slot["reveal_deadline"]})
    else:
        slot["outcome"] = UNAUDITED
        _resolved(state, task_id, slot)
    return True


def _close_reveals(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task,
                   slot: Slot, closing: bool) -> bool:
    """Once every committed verifier revealed, or the reveal deadline passed: a commitment never revealed
    is marked (slashed at finalize like a false answer); the revealed answers decide as before; with
    none revealed the withholders are replaced like silent verifiers (ADR 0202)."""
    committed = [v for v in slot["verifiers"] if sealed(v)]
    if any(v["answer"] is None for v in committed) and not _expired(slot["reveal_deadline"], ctx, closing):
        return False
    withheld = [v for v in committed if v["answer"] is None]
    for v in withheld:
        v["unrevealed"] = True
        state.events.append({"type": "audit_unrevealed", "task_id": task_id, "slot": slot["slot"],
                             "verifier": v["verifier"]})
    slot["reveal_deadline"] = 0
    answers = {(v["answer"]["match"], v["answer"]["evidence"]) for v in slot["verifiers"] if v["answer"]}
    if not answers:
        if withheld and redraws_left(params, slot) > 0:
            _replace(state, params, ctx, task_id, slot, withheld)
        else:
            slot["outcome"] = UNAUDITED
            _resolved(state, task_id, slot)
    elif len(answers) > 1:
        slot["verdict"] = None
        _schedule(state, params, ctx, task_id, slot, REFEREE, params.referees)
    elif _all_unavailable(slot, answers) and not epochs.left_unreachable(task, slot, *next(iter(answers))):
        slot["verdict"] = None
        if not availability.open_challenge(state, params, ctx, task_id, slot):
            _schedule(state, params, ctx, task_id, slot, REFEREE, params.referees)
    else:
        match, evidence = next(iter(answers))
        slot["verdict"] = {"match": match, "evidence": evidence}
        if match:
            slot["outcome"] = OK
            _resolved(state, task_id, slot)
        elif epochs.left_unreachable(task, slot, match, evidence):
            slot["outcome"] = UNAUDITED
            _resolved(state, task_id, slot)
        else:
            slot["dispute_deadline"] = deadlines.dispute_deadline(params, ctx)
    return True


def _all_unavailable(slot: Slot, answers: set[tuple[bool, bytes]]) -> bool:
    """Whether the revealed answers all say the worker's data could not be had (ADR 0207)."""
    return all(availability.is_unavailable(slot, {"match": m, "evidence": e}) for m, e in answers)


def redraws_left(params: Params, slot: Slot) -> int:
    """How many silent verifiers of ``slot`` may still be replaced: ``audit_redraws`` per seat drawn
    when the slot opened (ADR 0188: silence is escalated, never left unaudited after one try)."""
    seats = sum(1 for v in slot["verifiers"] if not v["redraw"])
    return seats * params.audit_redraws - sum(1 for v in slot["verifiers"] if v["redraw"])


def _replace(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot,
             gone: list[dict[str, Any]]) -> None:
    """Schedule replacements for the verifiers in ``gone`` (silent, or never revealed), while
    ``redraws_left``."""
    count = min(len(gone), redraws_left(params, slot))
    for v in gone[:count]:
        v["replaced"] = True
    _schedule(state, params, ctx, task_id, slot, REDRAW, count)


def _draw_replacements(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task,
                       slot: Slot, count: int) -> None:
    excluded = {task.owner, slot["worker"], *(v["verifier"] for v in slot["verifiers"])}
    pool = eligible_verifiers(state, params, task.profile, excluded)
    deadline = deadlines.answer_deadline(params, ctx, task)
    drawn = draw_distinct(_material(task, b"redraw", slot["slot"], ctx.beacon), pool, count)
    for peer_id in drawn:
        slot["verifiers"].append(_verifier_entry(peer_id, deadline, redraw=True))
    if drawn:
        state.events.append({"type": "audit_assigned", "task_id": task_id, "slot": slot["slot"],
                             "worker": slot["worker"], "segment": slot["segment"], "verifiers": drawn,
                             "salt": slot["salt"], "deadline": deadline, "redraw": True})


def _add_referees(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task, slot: Slot,
                  count: int) -> bool:
    """Draw up to ``count`` referees for ``slot`` besides its parties and earlier referees, all with a
    new deadline; False when nobody could be drawn."""
    excluded = {task.owner, slot["worker"], *(v["verifier"] for v in slot["verifiers"]),
                *(r["referee"] for r in slot["referees"])}
    pool = eligible_verifiers(state, params, task.profile, excluded)
    panel = referee_panels(slot)
    label = b"referee" if not panel else b"referee" + panel.to_bytes(1, "big")
    chosen = draw_distinct(_material(task, label, slot["slot"], ctx.beacon), pool, count)
    if not chosen:
        return False
    slot["referees"] += [{"referee": peer_id, "vote": None, "panel": panel} for peer_id in chosen]
    slot["referee_deadline"] = deadlines.answer_deadline(params, ctx, task)
    state.events.append({"type": "referees_drawn", "task_id": task_id, "slot": slot["slot"], "referees": chosen,
                         "deadline": slot["referee_deadline"], "panel": panel})
    return True


def referee_panels(slot: Slot) -> int:
    """How many referee panels ``slot`` has drawn (entries from before ADR 0188 count as panel 0)."""
    return 1 + max((r.get("panel", 0) for r in slot["referees"]), default=-1)


def referee_verdict(params: Params, slot: Slot) -> tuple[bool, bytes] | None:
    """The (match, evidence) that decides ``slot``: the value most referee votes agree on, when it leads
    every other value strictly and is cast by a majority of the panel (at least ``referees`` // 2 + 1
    votes, more once the panel grew); else None. Honest referees all report the same evidence, so
    only colluding referees agreeing on one fake value can outvote them (ADR 0168, 0188)."""
    tally: dict[tuple[bool, bytes], int] = {}
    for entry in slot["referees"]:
        vote = entry["vote"]
        if vote is not None:
            key = (vote["match"], vote["evidence"])
            tally[key] = tally.get(key, 0) + 1
    ranked = sorted(tally.items(), key=lambda item: -item[1])
    quorum = max(params.referees, len(slot["referees"])) // 2 + 1
    if ranked and ranked[0][1] >= quorum and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0]
    return None


def _decide_by_referees(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot) -> None:
    """The referee verdict decides the slot when no revealed vote dissents from it; without one (a tie, too
    few votes, a short panel), or against a dissent (ADR 0210), a larger panel joins (the panel so far
    plus one more referee each time) until ``referee_rounds`` panels were drawn or nobody is left to
    draw; then the majority verdict decides, and without one the slot is ``undecided``: nobody slashed
    and the worker not paid for it (ADR 0188: a judge's default never pays)."""
    verdict = referee_verdict(params, slot)
    last_panel = referee_panels(slot) >= params.referee_rounds
    if verdict is not None and (last_panel or not dissent(slot, verdict)):
        _decide(state, task_id, slot, verdict)
    elif not last_panel:
        _schedule(state, params, ctx, task_id, slot, REFEREE, len(slot["referees"]) + 1)
    else:
        slot["outcome"] = UNDECIDED
        _resolved(state, task_id, slot)


def dissent(slot: Slot, verdict: tuple[bool, bytes]) -> bool:
    """Whether a revealed referee vote differs from ``verdict`` (ADR 0210). Honest referees replay the
    same segment bit for bit, so a split panel holds an adversary; it is not decided by its majority,
    which a coalition drawn twice onto a small panel could hold, but grows (until ``referee_rounds``)."""
    return any(r["vote"] is not None and (r["vote"]["match"], r["vote"]["evidence"]) != verdict
               for r in slot["referees"])


def _decide(state: LedgerState, task_id: bytes, slot: Slot, verdict: tuple[bool, bytes]) -> None:
    match, evidence = verdict
    slot["verdict"] = {"match": match, "evidence": evidence}
    slot["outcome"] = OK if match else GUILTY
    _resolved(state, task_id, slot)


def _resolved(state: LedgerState, task_id: bytes, slot: Slot) -> None:
    state.events.append({"type": "slot_resolved", "task_id": task_id, "slot": slot["slot"],
                         "worker": slot["worker"], "outcome": slot["outcome"], "verdict": slot["verdict"]})


def refresh_status(task: Task) -> None:
    """committed while slots are open without a mismatch; disputed once a slot mismatched, is
    disputed, challenged (ADR 0207), refereed, undecided or guilty; verified once every slot resolved
    without any of that."""
    if not task.slots or task.status in TaskStatus.OPEN_FOR_COMMITS:
        return   # no audits (audits_per_worker 0), or an epoch's audits while the crew trains on (ADR 0230)
    contested = any(slot["outcome"] in (GUILTY, UNDECIDED) or slot["dispute_deadline"] or slot["referees"]
                    or referees_pending(slot) or availability.challenge_open(slot) for slot in task.slots)
    if contested:
        task.status = TaskStatus.DISPUTED
    elif all(slot["outcome"] != PENDING for slot in task.slots):
        task.status = TaskStatus.VERIFIED
    else:
        task.status = TaskStatus.COMMITTED


def referees_pending(slot: Slot) -> bool:
    """Whether ``slot`` waits for its (next) referee panel to be drawn."""
    return (slot.get("draw") or {}).get("kind") == REFEREE


def pending_slots(task: Task) -> list[int]:
    return [slot["slot"] for slot in task.slots if slot["outcome"] == PENDING]


def guilty_workers(task: Task) -> set[str]:
    return {slot["worker"] for slot in task.slots if slot["outcome"] == GUILTY}


# ---- transactions ----------------------------------------------------------------------------

def slot_of(state: LedgerState, tx: Tx) -> tuple[Task, Slot]:
    """The task and the pending audit slot a transaction names; else TxError."""
    p = tx.payload
    task = state.tasks.get(p["task_id"])
    if task is None:
        raise TxError(TxCode.NOT_FOUND, missing_task(state, p["task_id"]))
    if task.status not in TaskStatus.ACTIVE or (task.status in TaskStatus.OPEN_FOR_COMMITS and not task.slots):
        # (an epoch's slots open while the crew trains on, docs/adr/0230)
        raise TxError(TxCode.BAD_STATE, f"the task is {task.status}: it has no open audit slots")
    if p["slot"] >= len(task.slots):
        raise TxError(TxCode.BAD_PAYLOAD, f"slot {p['slot']} out of range (the task has {len(task.slots)})")
    slot: Slot = task.slots[p["slot"]]
    if slot["outcome"] != PENDING:
        raise TxError(TxCode.BAD_STATE, f"slot {p['slot']} is resolved ({slot['outcome']})")
    return task, slot


def apply_dispute(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """The audited worker contests a mismatch within ``dispute_s``: referees are drawn."""
    p = tx.payload
    task, slot = slot_of(state, tx)
    if tx.sender != slot["worker"]:
        raise TxError(TxCode.UNAUTHORIZED, "only the audited worker can dispute its slot")
    if slot["dispute"] is not None or slot["referees"] or referees_pending(slot):
        raise TxError(TxCode.ALREADY_KNOWN, "this slot is already before referees")
    if not slot["dispute_deadline"]:
        raise TxError(TxCode.BAD_STATE, "a worker can dispute only a mismatch its verifiers agreed on")
    if _expired(slot["dispute_deadline"], ctx, False):
        raise TxError(TxCode.BAD_STATE, f"the dispute deadline (block time {slot['dispute_deadline']} ms) has passed")
    slot["dispute"] = {"height": ctx.height}
    slot["verdict"] = None
    state.events.append({"type": "slot_disputed", "task_id": p["task_id"], "slot": p["slot"], "worker": tx.sender})
    _schedule(state, params, ctx, p["task_id"], slot, REFEREE, params.referees)
    refresh_status(task)
    state.touch(TASK, p["task_id"])


# ---- settlement at finalize ------------------------------------------------------------------

@dataclass
class Settlement:
    """What the resolved slots decide: guilty workers, verifier-pool shares, contradicted answers."""

    guilty: set[str] = field(default_factory=set)
    shares: dict[str, int] = field(default_factory=dict)
    false_answers: list[str] = field(default_factory=list)   # per contradicted answer or vote, or withheld reveal
    unsettled: dict[str, int] = field(default_factory=dict)   # worker -> its slots not ended ok or guilty

    def paid_share(self, slots: list[Slot], worker: str, share: int) -> int:
        """What an innocent ``worker`` is paid of ``share`` for the work ``slots`` audit: the part its ``ok``
        slots cover (ADR 0188: a slot left unaudited or undecided pays its worker nothing; no slots at
        all, the whole share)."""
        mine = sum(1 for slot in slots if slot["worker"] == worker)
        if not mine:
            return share
        return share * (mine - self.unsettled.get(worker, 0)) // mine


def settle(slots: list[Slot], verifier_pool: int) -> Settlement:
    """What resolved ``slots`` (a task's, or one epoch's, docs/adr/0230) decide: guilty workers; each
    worker's slots that ended unaudited or undecided; ``verifier_pool`` split equally over the slots with
    at least one answer that agrees with the verdict, each slot's share equally among those verifiers and
    majority referees (remainders stay in the escrow, for the owner); every verifier answer and every
    referee vote unequal to the verdict."""
    out = Settlement(guilty={slot["worker"] for slot in slots if slot["outcome"] == GUILTY})
    for slot in slots:
        if slot["outcome"] in (UNAUDITED, UNDECIDED):
            out.unsettled[slot["worker"]] = out.unsettled.get(slot["worker"], 0) + 1
        # committed, then withheld (ADR 0202, 0210): slashed whatever the slot's outcome
        out.false_answers += [v["verifier"] for v in slot["verifiers"] if v.get("unrevealed")]
        out.false_answers += [r["referee"] for r in slot["referees"] if r.get("unrevealed")]
    payees_by_slot: list[list[str]] = []
    for slot in slots:
        verdict = slot["verdict"]
        if slot["outcome"] not in (OK, GUILTY) or verdict is None:
            continue
        key = (verdict["match"], verdict["evidence"])
        payees = []
        for v in slot["verifiers"]:
            answer = v["answer"]
            if answer is None:
                continue
            if (answer["match"], answer["evidence"]) == key:
                payees.append(v["verifier"])
            elif not availability.is_unavailable(slot, answer):   # "I could not fetch" is never slashed
                out.false_answers.append(v["verifier"])
        for r in slot["referees"]:
            if r["vote"] is None:
                continue
            if (r["vote"]["match"], r["vote"]["evidence"]) == key:
                payees.append(r["referee"])
            elif not availability.is_unavailable(slot, r["vote"]):
                out.false_answers.append(r["referee"])
        if payees:
            payees_by_slot.append(payees)
    if payees_by_slot:
        per_slot = verifier_pool // len(payees_by_slot)
        for payees in payees_by_slot:
            for peer_id in payees:
                out.shares[peer_id] = out.shares.get(peer_id, 0) + per_slot // len(payees)
    return out
