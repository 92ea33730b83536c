"""Task lifecycle on chain: submit, cancel, assignment, commit, reject, audit, dispute, finalize, expiry.

created --(end of block: workers assigned)--> assigned --(first commit)--> running
--(all committed, or a quorum by the commit deadline: audit slots drawn)--> committed --(slots resolve,
consensus/state/audits.py, docs/adr/0168)--> verified | disputed --(finalize)--> paid, or failed when
no worker earned its share (every committer found guilty); created --(cancel_task)--> cancelled;
created --(task_assign_timeout)--> expired; assigned --(commit deadline, nobody committed)--> expired;
assigned | running --(reject_task by a strict majority of the workers)--> rejected; a task cut into epochs
that ends at an epoch boundary before its last epoch (its crew stopped, or its owner's stop_task,
consensus/state/task_stop.py, docs/adr/0211) settles ``stopped`` instead of ``paid``. A task that ends
without paying a worker never reads ``paid``: its ``reason`` says what happened. Deadlines are block
times derived from the task's declared work (consensus/state/deadlines.py, docs/adr/0187). See
docs/adr/0023 for assignment and payout rules, docs/adr/0081 for the commit quorum (a crashed worker
does not hold a task open), 0151 for rejection and expiry, 0152 for devices, sources and the result,
0203 for a task cut into epochs (commit_epoch, per-epoch deadlines, a stop at the last closed epoch and
pay per epoch a worker covers: consensus/state/epochs.py).

Handlers check every condition before they change anything, so a failing payload leaves
the state untouched (the ante step has already taken the fee and nonce).
"""
from __future__ import annotations

import hashlib

from consensus.genesis import Params
from consensus.state import (
    audit_cost,
    audits,
    bandwidth,
    crew,
    crew_restart,
    deadlines,
    epoch_pay,
    epochs,
    rejections,
    relay_bytes,
    task_stop,
)
from consensus.state.accounts import debit
from consensus.state.context import BlockContext
from consensus.state.records import Task, TaskStatus
from consensus.state.retention import missing_task
from consensus.state.store import NODE, TASK, LedgerState
from consensus.tx import DEFAULT_DEVICE, Tx
from consensus.txcodes import TxCode, TxError

REPUTATION_PAID = 1
REPUTATION_SLASHED = -10
REPUTATION_NO_SHOW = -5
REPUTATION_BOUNDS = (-50, 100)


def commit_quorum(workers: int) -> int:
    """Commitments that let the commit phase close without the rest: a strict majority."""
    return workers // 2 + 1


def task_id_for(owner: str, nonce: int) -> bytes:
    """A task's id: sha256 of its submitter and the submitting transaction's nonce."""
    return hashlib.sha256(b"dekube/task\x00" + owner.encode() + nonce.to_bytes(8, "big")).digest()


def get_task(state: LedgerState, task_id: bytes) -> Task:
    task = state.tasks.get(task_id)
    if task is None:
        raise TxError(TxCode.NOT_FOUND, missing_task(state, task_id))
    return task


def _require_status(task: Task, allowed, action: str) -> None:
    if task.status not in allowed:
        raise TxError(TxCode.BAD_STATE, f"cannot {action} a task that is {task.status}")


def profile_device(profile: str) -> str:
    """The device class a profile computes on: "cuda" for ``cuda-...`` profiles, else "cpu" (ml/profiles.py)."""
    return "cuda" if profile.startswith("cuda-") else "cpu"


def check_task_profile(payload: dict) -> None:
    """A task's device and profile must agree: a cuda profile for device cuda, a cpu one for cpu; for
    "any" the profile decides (ADR 0188: one profile per crew, named by the owner)."""
    device = payload.get("device", DEFAULT_DEVICE)
    if device != "any" and profile_device(payload["profile"]) != device:
        raise TxError(TxCode.BAD_PAYLOAD, f"profile {payload['profile']} is not a {device} profile")


def apply_submit_task(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    p = tx.payload
    check_task_profile(p)
    epochs.check_layout(p)
    if "expected_s" in p:
        deadlines.check_expected(params, p["expected_s"])
    # too few segments for the audits of each epoch (ADR 0212, 0230)
    surcharge = audit_cost.audit_surcharge(params, p["price"], p["segments"], p.get("epochs", 1))
    debit(state, tx.sender, p["price"] + surcharge)
    task_id = task_id_for(tx.sender, tx.nonce)
    state.task_seq += 1
    state.touch_meta()
    spec = {k: p[k] for k in ("model", "dataset", "hyperparams", "workers", "sync_mode", "codec")}
    spec["device"] = p.get("device", DEFAULT_DEVICE)
    if "expected_s" in p:
        spec["expected_s"] = p["expected_s"]
    if p.get("epochs", 1) > 1:
        spec["epochs"] = p["epochs"]
    if p.get("max_workers", p["workers"]) > p["workers"]:
        spec["max_workers"] = p["max_workers"]   # the crew may grow to it (docs/adr/0234)
    if surcharge:
        spec["audit_surcharge"] = surcharge
    task = state.tasks[task_id] = Task(tx.sender, state.task_seq, spec, p["price"], ctx.height,
                                       sources=list(p.get("sources", [])), device=spec["device"])
    task.escrow += surcharge
    task.profile = p["profile"]
    task.segments = p["segments"]
    task.assign_deadline = ctx.time_ms + params.task_assign_s * 1000
    state.open_tasks[task_id] = state.task_seq
    state.touch(TASK, task_id)
    state.events.append({"type": "task_submitted", "task_id": task_id, "owner": tx.sender})


def apply_cancel_task(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    task_id = tx.payload["task_id"]
    task = get_task(state, task_id)
    if tx.sender != task.owner:
        raise TxError(TxCode.UNAUTHORIZED, "only the task owner can cancel it")
    _require_status(task, (TaskStatus.CREATED,), "cancel")
    _refund(state, task, {})
    task.status = TaskStatus.CANCELLED
    state.open_tasks.pop(task_id, None)
    state.touch(TASK, task_id)
    state.events.append({"type": "task_cancelled", "task_id": task_id})


def apply_stop_task(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """The owner ends a running task at the next epoch boundary (docs/adr/0211)."""
    task_id = tx.payload["task_id"]
    task = get_task(state, task_id)
    task_stop.check_stop(task, tx.sender)
    state.events.append({**task_stop.request(task), "task_id": task_id})
    state.touch(TASK, task_id)


# ---- end of block (run by every validator after the block's transactions) -----------------

def end_block(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """Close the commit phases whose deadline this block's time reached (or expire the tasks nobody
    committed to), assign workers to open tasks, then expire the open tasks that waited
    task_assign_timeout blocks."""
    close_commit_phases(state, params, ctx)
    advance_audits(state, params, ctx)
    assign_open_tasks(state, params, ctx)
    expire_open_tasks(state, params, ctx)


def work_in_flight(state: LedgerState) -> bool:
    """Whether anything on the ledger waits on time or on later blocks: a task not yet final (its
    deadlines, scheduled draws and answers) or an open serving dispute. An idle chain has none, and its
    proposers may make blocks at the slow idle pace (docs/adr/0213)."""
    return bool(state.open_tasks or state.open_serve_disputes
                or any(task.status in TaskStatus.ACTIVE for task in state.tasks.values()))


def advance_audits(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """Run the deadlines of every task with open audit slots (redraws, dispute windows, referees), then
    pay out each epoch of a running task whose slots are all resolved, and give the seat of a member found
    guilty to a joiner at once (docs/adr/0230; it enters one past the furthest commitment, as at a close)."""
    due = sorted((task.seq, task_id) for task_id, task in state.tasks.items()
                 if task.status in TaskStatus.ACTIVE and (task.slots or epochs.count(task) > 1))
    for _, task_id in due:
        task = state.tasks[task_id]
        if audits.pending_slots(task):
            audits.advance_task(state, params, ctx, task_id, task, closing=True)
        while epochs.count(task) > 1 and epoch_pay.releasable(task, len(epoch_pay.released(task))):
            _release_epoch(state, params, task_id, task, len(epoch_pay.released(task)))
        if epochs.count(task) > 1 and task.status in TaskStatus.OPEN_FOR_COMMITS and audits.guilty_workers(task):
            fill_vacant_seats(state, params, ctx, task_id, task)   # a guilty member's seat, without waiting


def close_commit_phases(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """Open the audit window, over the committers only, of each running task whose commit deadline
    this block's time reached and that a quorum of its workers committed to; expire each task whose
    deadline passed without any commitment (ADR 0187). A task below quorum with commitments stays
    open for commits until its deadline, then only finalize applies (ADR 0023). A task cut into epochs
    stops at its last closed epoch (ADR 0203), unless nobody committed the open one: then it restarts
    on a new crew when it may (docs/adr/0232)."""
    for task_id, task in state.tasks.items():
        if task.status not in TaskStatus.OPEN_FOR_COMMITS or not deadlines.passed(task.commit_deadline, ctx, True):
            continue
        quorum = commit_quorum(crew.seats(task))
        if epochs.before_last(task) and len(epochs.committed(task, epochs.current(task))) >= quorum:
            _close_epoch(state, params, ctx, task_id, task)
        elif not epochs.before_last(task) and task.commits and len(task.commits) >= quorum:
            _open_audit_window(state, params, ctx, task_id, task)
        elif epochs.closed(task):
            if _restart_crew(state, params, ctx, task_id, task):   # a new crew (docs/adr/0232)
                continue
            state.events.append({**epochs.stop(task), "task_id": task_id})
            _open_audit_window(state, params, ctx, task_id, task)
        elif epochs.count(task) > 1:   # no epoch closed: a lone result run ahead is not a crew's work
            task.commits = {}
            settle(state, params, task_id, task)
        elif not task.commits:
            settle(state, params, task_id, task)


def _close_epoch(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task) -> None:
    """Close the open epoch (a quorum committed it); the next opens with its own deadline, brought
    forward to the grace when a quorum already committed it (or the result), and the commit phase
    closes at once when nobody is left to wait for."""
    closing = epochs.current(task)
    state.events.append({**epochs.close(ctx, task, deadlines.task_span_ms(params, task)), "task_id": task_id})
    state.touch(TASK, task_id)
    _audit_epoch(state, params, ctx, task_id, task, closing)   # audited now, paid once audited (ADR 0230)
    fill_vacant_seats(state, params, ctx, task_id, task)
    if task_stop.due(task):   # the owner stops the task at this boundary (docs/adr/0211)
        state.events.append({**task_stop.stop(task), "task_id": task_id})
        _open_audit_window(state, params, ctx, task_id, task)
        return
    quorum = commit_quorum(crew.seats(task))
    ahead = len(epochs.committed(task, epochs.current(task))) if epochs.before_last(task) else len(task.commits)
    if ahead >= quorum:
        task.commit_deadline = min(task.commit_deadline, ctx.time_ms + deadlines.commit_grace_ms(params, task))
    if epochs.before_last(task) and epochs.all_committed(task):
        _close_epoch(state, params, ctx, task_id, task)
    else:
        _close_if_all_answered(state, params, ctx, task_id, task)


def _open_audit_window(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task) -> None:
    """The commit phase closed: the last epoch's results are audited (a task without epochs is one
    epoch; a task that stopped at an epoch boundary had every closed epoch audited as it closed)."""
    task.status = TaskStatus.COMMITTED
    task.window_end = deadlines.window_end(params, ctx)
    state.touch(TASK, task_id)
    absent = [worker for worker in task.workers if worker not in task.commits]
    epochs.include_departed(task)
    state.events.append({"type": "audit_window_opened", "task_id": task_id, "absent": absent})
    if "stopped" not in task.epochs:
        _audit_epoch(state, params, ctx, task_id, task, epochs.count(task) - 1)
    audits.refresh_status(task)


def _audit_epoch(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task,
                 epoch: int) -> None:
    """Open the audit slots of ``epoch``: for each worker held to its work, among the epoch's segments,
    under the commitment that covers them (docs/adr/0230)."""
    low, _ = epochs.epoch_range(task, epoch) if epochs.count(task) > 1 else (0, 0)
    targets = [audits.Target(worker, commit[0], commit[2], epochs.first_segment(task, worker),
                             max(low, epochs.first_segment(task, worker)))
               for worker, commit in epochs.trained(task, epoch).items()]
    audits.open_slots(state, params, ctx, task_id, task, epoch, targets)


def _release_epoch(state: LedgerState, params: Params, task_id: bytes, task: Task, epoch: int) -> dict[str, int]:
    """Pay out ``epoch`` (consensus/state/epoch_pay.py); a contradicted verifier answer costs reputation.
    Returns what each worker earned by it."""
    share = worker_share(params, task.price, crew.max_seats(task))
    settlement, wages = epoch_pay.release(state, params, task_id, task, epoch, share, verifier_pool(params, task))
    for verifier in settlement.false_answers:
        _adjust_reputation(state, verifier, REPUTATION_SLASHED)
    return wages


def verifier_pool(params: Params, task: Task) -> int:
    """What a task's verifiers are paid in all: ``verifier_share_bps`` of its price plus its audit surcharge."""
    return task.price * params.verifier_share_bps // 10_000 + task.spec.get("audit_surcharge", 0)


# ---- assignment ------------------------------------------------------------------------------

def worker_weight(state: LedgerState, peer_id: str) -> int:
    """Bonded stake x (100 + reputation) x bandwidth class (bit length of the Mbit/s placement
    counts, capped unless co-workers verified it: bandwidth.ranking_bandwidth, ADR 0192 and 0219, + 1)."""
    node = state.nodes[peer_id]
    bonded = state.stakes[peer_id].bonded
    bandwidth_mbps = bandwidth.ranking_bandwidth(node)
    return bonded * (100 + node.reputation) * (bandwidth_mbps.bit_length() + 1)


def worker_share(params: Params, price: int, workers: int) -> int:
    """What each committed, innocent worker of a task is paid: the price less the verifier pool and
    the relay budget, split equally."""
    verifier_pool = price * params.verifier_share_bps // 10_000
    relay_budget = price * params.relay_share_bps // 10_000
    return (price - verifier_pool - relay_budget) // workers


def required_worker_stake(params: Params, task: Task) -> int:
    """The bonded stake a worker of ``task`` needs (ADR 0169's arithmetic, ADR 0188): the slash of its
    m audited segments covers ``stake_cover_bps``/10^4 times its pay, sigma·S·m >= cover·w, so
    S >= cover·w / (m·sigma) (10x the pay at the defaults); never below ``min_worker_stake``. Without
    audits or slashing (a parameter at 0) only the minimum applies."""
    return stake_for_pay(params, worker_share(params, task.price, crew.max_seats(task)))


def stake_for_pay(params: Params, pay: int) -> int:
    """The bonded stake a worker paid ``pay`` by one task needs (see ``required_worker_stake``)."""
    m, sigma, cover = params.audits_per_worker, params.slash_mismatch_bps, params.stake_cover_bps
    if not (m and sigma and cover):
        return params.min_worker_stake
    return max(params.min_worker_stake, -(-cover * pay // (m * sigma)))


def eligible_workers(state: LedgerState, params: Params) -> list[str]:
    """Compute nodes with enough bonded stake, an execution profile and a free task slot."""
    return [peer_id for peer_id in qualified_workers(state, params)
            if state.nodes[peer_id].active_tasks < params.max_tasks_per_worker]


def qualified_workers(state: LedgerState, params: Params) -> list[str]:
    """Compute nodes with enough bonded stake and at least one execution profile, busy or not (a node
    without a profile gets no work: ADR 0188)."""
    out = []
    for peer_id, node in state.nodes.items():
        if "compute" not in node.roles or not node.hardware.get("profiles"):
            continue
        stake = state.stakes.get(peer_id)
        if stake is not None and stake.bonded >= params.min_worker_stake:
            out.append(peer_id)
    return out


def has_gpu(state: LedgerState, peer_id: str) -> bool:
    """Whether a node registered a GPU (a non-empty ``hardware.gpu``)."""
    return bool(state.nodes[peer_id].hardware.get("gpu"))


def device_pool(state: LedgerState, profile: str, candidates: list[str]) -> tuple[str, list[str]]:
    """The device class a task's workers train on (its profile's: "any" is settled by the profile the
    owner named) and the candidates that run that profile; cuda profiles only on GPU nodes."""
    device = profile_device(profile)
    return device, [peer_id for peer_id in candidates if audits.runs_profile(state.nodes[peer_id].hardware, profile)
                    and (device != "cuda" or has_gpu(state, peer_id))]


def assign_open_tasks(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """Give each open task (oldest first) its workers: the highest-weight eligible compute
    nodes able to train on its device and running its execution profile, ties broken by
    sha256(task_id, peer_id). A task waits while too few are free, or while some chosen worker
    would have no eligible verifier (ADR 0168)."""
    if not state.open_tasks:
        return
    candidates = eligible_workers(state, params)
    if not candidates:
        return
    weights = {peer_id: worker_weight(state, peer_id) for peer_id in candidates}
    bars = rejections.recent_bars(state, ctx.height)
    for task_id in sorted(state.open_tasks, key=state.open_tasks.__getitem__):
        task = state.tasks[task_id]
        wanted, profile = task.spec["workers"], task.profile
        device, pool = _worker_pool(state, params, task_id, task, candidates, weights, bars)
        if len(pool) < wanted:
            continue
        chosen = sorted(pool[:wanted])
        if not audits.can_audit_every_worker(state, params, profile, task.owner, chosen):
            continue
        _take_slots(state, params, chosen, candidates)
        task.workers = chosen
        task.device = device
        task.status = TaskStatus.ASSIGNED
        task.assigned_height = ctx.height
        task.commit_deadline = deadlines.commit_deadline(params, ctx, task)
        epochs.start(task)
        del state.open_tasks[task_id]
        state.touch(TASK, task_id)
        state.events.append({"type": "task_assigned", "task_id": task_id, "workers": chosen, "device": device,
                             "profile": profile})


def _worker_pool(state: LedgerState, params: Params, task_id: bytes, task: Task, candidates: list[str],
                 weights: dict[str, int], bars: rejections.Bars) -> tuple[str, list[str]]:
    """The device class and the candidates able to work on ``task`` (not its owner, not barred by it,
    bonded for its pay, running its profile), best first: highest weight, ties broken by
    sha256(task_id, peer_id)."""
    stake = required_worker_stake(params, task)
    allowed = bars.allowed(task.owner, [peer_id for peer_id in candidates if peer_id != task.owner])
    device, pool = device_pool(state, task.profile, [peer_id for peer_id in allowed
                                                     if state.stakes[peer_id].bonded >= stake])
    pool.sort(key=lambda pid: (-weights[pid], hashlib.sha256(task_id + pid.encode()).digest()))
    return device, pool


def _take_slots(state: LedgerState, params: Params, chosen: list[str], candidates: list[str]) -> None:
    """Each chosen worker holds one more task (and leaves ``candidates`` once it holds its maximum)."""
    for peer_id in chosen:
        node = state.nodes[peer_id]
        node.active_tasks += 1
        state.touch(NODE, peer_id)
        if node.active_tasks >= params.max_tasks_per_worker and peer_id in candidates:
            candidates.remove(peer_id)


def fill_vacant_seats(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task) -> None:
    """When an epoch closes, name a replacement for each seat whose occupant left the crew (docs/adr/0226):
    the best free candidate the assignment rule would pick (same device, profile and stake; not a worker
    the task had), entering at ``join_epoch``, if that epoch is not past the task's last; then open extra
    seats up to the task's ``max_workers`` for the candidates left (docs/adr/0234)."""
    start = epochs.join_epoch(task)
    if start >= epochs.count(task) or task_stop.STOP_KEY in task.epochs:
        return
    opened = crew.open_seats(task)
    vacant = [seat for seat in range(opened) if not epochs.in_crew(task, crew.occupant(task, seat))]
    wanted = [*vacant, *range(opened, crew.max_seats(task))]
    if wanted:
        _seat_joiners(state, params, task_id, task, wanted, replacements(state, params, ctx, task_id, task,
                                                                         len(wanted)), start)


def _restart_crew(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task) -> bool:
    """The open epoch's deadline passed with no commitment of it: restart it on a new crew (docs/adr/0232,
    consensus/state/crew_restart.py) when allowed and a quorum of seats can be filled; False otherwise."""
    if not crew_restart.allowed(params, task):
        return False
    vacant = crew_restart.vacant_seats(task)
    picks = replacements(state, params, ctx, task_id, task, len(vacant))
    if len(picks) < commit_quorum(crew.seats(task)):
        return False
    state.events.append({**crew_restart.begin(ctx, task, deadlines.task_span_ms(params, task), picks),
                         "task_id": task_id})
    _seat_joiners(state, params, task_id, task, vacant, picks, epochs.current(task))
    state.touch(TASK, task_id)
    return True


def replacements(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, task: Task,
                 wanted: int) -> list[str]:
    """Up to ``wanted`` free compute nodes for seats of ``task``, best first, as assignment would pick them:
    same device, profile and stake, not barred by the owner, with an eligible verifier, not a worker the
    task already had."""
    candidates = [peer_id for peer_id in eligible_workers(state, params) if peer_id not in task.workers]
    weights = {peer_id: worker_weight(state, peer_id) for peer_id in candidates}
    device, pool = _worker_pool(state, params, task_id, task, candidates, weights,
                                rejections.recent_bars(state, ctx.height))
    if device != task.device:
        return []
    able = (peer_id for peer_id in pool
            if audits.can_audit_every_worker(state, params, task.profile, task.owner, [peer_id]))
    return [peer_id for _, peer_id in zip(range(wanted), able)]


def _seat_joiners(state: LedgerState, params: Params, task_id: bytes, task: Task, seats: list[int],
                  picks: list[str], start: int) -> None:
    """Name each of ``picks`` to the seat in the same place of ``seats`` from epoch ``start`` on."""
    for seat, pick in zip(seats, picks):
        _take_slots(state, params, [pick], [])
        state.events.append({**crew.join(task, pick, seat, start), "task_id": task_id})


def expire_open_tasks(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """End each task still waiting for workers ``task_assign_s`` after its submission (block time):
    status expired, the whole escrow back to the owner, and a reason that says what was missing."""
    due = [task_id for task_id in sorted(state.open_tasks, key=state.open_tasks.__getitem__)
           if deadlines.passed(state.tasks[task_id].assign_deadline, ctx, closing=True)]
    if not due:
        return
    qualified = qualified_workers(state, params)
    for task_id in due:
        task = state.tasks[task_id]
        task.reason = unassigned_reason(state, params, task, qualified)
        _refund(state, task, {})
        task.status = TaskStatus.EXPIRED
        del state.open_tasks[task_id]
        state.touch(TASK, task_id)
        state.events.append({"type": "task_expired", "task_id": task_id, "reason": task.reason,
                             "payouts": dict(task.payouts)})


def unassigned_reason(state: LedgerState, params: Params, task: Task, qualified: list[str]) -> str:
    """Why ``task`` found no workers, e.g. "needs 3 compute nodes for device cuda; 1 eligible"."""
    wanted, device = task.spec["workers"], task.spec.get("device", DEFAULT_DEVICE)
    stake = required_worker_stake(params, task)
    _, able = device_pool(state, task.profile, [peer_id for peer_id in qualified if peer_id != task.owner
                                                and state.stakes[peer_id].bonded >= stake])
    busy = sum(1 for peer_id in able if state.nodes[peer_id].active_tasks >= params.max_tasks_per_worker)
    shown = "cuda or cpu" if device == "any" else device
    reason = (f"not assigned within {params.task_assign_s} s: needs {wanted} compute "
              f"node{'s' if wanted != 1 else ''} for device {shown}"
              f"{f' running profile {task.profile}' if task.profile else ''}"
              f"{f' with {stake} bonded' if stake > params.min_worker_stake else ''}; {len(able)} eligible")
    if busy:
        reason += f" ({busy} busy with other tasks)"
    if len(able) >= wanted and not audits.can_audit_every_worker(state, params, task.profile, task.owner,
                                                                  able[:wanted]):
        reason += "; every worker needs an eligible verifier besides itself (ADR 0168)"
    return reason


def _refund(state: LedgerState, task: Task, payouts: dict[str, int]) -> None:
    """Pay ``payouts`` from the escrow, the rest to the owner; the escrow ends empty."""
    payouts = {peer_id: amount for peer_id, amount in payouts.items() if amount}
    rest = task.escrow - sum(payouts.values())
    if rest:
        payouts[task.owner] = payouts.get(task.owner, 0) + rest
    for peer_id, amount in sorted(payouts.items()):
        state.credit(peer_id, amount)
        task.payouts[peer_id] = task.payouts.get(peer_id, 0) + amount   # after any epochs paid out (ADR 0230)
    task.escrow = 0


# ---- results (audit slots, disputes and referees: consensus/state/audits.py) -----------------

def apply_commit_result(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    p = tx.payload
    task = get_task(state, p["task_id"])
    if tx.sender not in task.workers:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a worker of this task")
    _require_status(task, TaskStatus.OPEN_FOR_COMMITS, "commit a result to")
    if tx.sender in task.commits:
        raise TxError(TxCode.ALREADY_KNOWN, "this worker already committed its result")
    if tx.sender in task.rejections:
        raise TxError(TxCode.BAD_STATE, "this worker rejected the task; it cannot commit a result")
    if deadlines.passed(task.commit_deadline, ctx):
        raise TxError(TxCode.BAD_STATE, f"the commit deadline (block time {task.commit_deadline} ms) has passed")
    if task.segments and p["segments"] != task.segments:
        raise TxError(TxCode.BAD_PAYLOAD, f"the task declares {task.segments} segments, the commitment has "
                                          f"{p['segments']}")
    epochs.check_result(task, tx.sender)
    rates = p.get("peer_rates") or {}
    bandwidth.check_report(task, tx.sender, rates)
    relayed = relay_bytes.kept_entries(state, tx.sender, p.get("relay_bytes") or {})
    task.commits[tx.sender] = [p["segments_root"], p["result_hash"], p["segments"], ctx.height]
    if rates:
        task.rate_reports[tx.sender] = dict(rates)
    if relayed:
        task.relay_bytes[tx.sender] = dict(relayed)
    task.status = TaskStatus.RUNNING
    if len(task.commits) == commit_quorum(crew.seats(task)):
        task.commit_deadline = min(task.commit_deadline, ctx.time_ms + deadlines.commit_grace_ms(params, task))
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "result_committed", "task_id": p["task_id"], "worker": tx.sender,
                         "result": p["result_hash"]})
    _close_if_all_answered(state, params, ctx, p["task_id"], task)


def _close_if_all_answered(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes,
                           task: Task) -> None:
    """Open the audit window at once when every worker has committed, rejected or left the crew (in the
    last epoch) and the committers are a quorum (nobody is left to wait for)."""
    if epochs.before_last(task):
        return
    answered = set(task.commits) | set(task.rejections) | epochs.departed(task)   # a guilty committer is both
    if answered >= set(task.workers) and len(task.commits) >= commit_quorum(crew.seats(task)):
        _open_audit_window(state, params, ctx, task_id, task)


def apply_commit_epoch(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A member's progress commitment at the end of an epoch (docs/adr/0203): the root of its segment
    records so far, their count (the epoch layout's) and its state digest, before the open epoch's
    deadline. The epoch closes at once when the whole crew committed it; a quorum brings its deadline
    forward to the grace."""
    p = tx.payload
    task = get_task(state, p["task_id"])
    if tx.sender not in task.workers:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a worker of this task")
    _require_status(task, TaskStatus.OPEN_FOR_COMMITS, "commit an epoch of")
    if tx.sender in task.rejections:
        raise TxError(TxCode.BAD_STATE, "this worker rejected the task; it cannot commit progress")
    epochs.check_commit(task, tx.sender, p)
    if deadlines.passed(task.commit_deadline, ctx):
        raise TxError(TxCode.BAD_STATE, f"the deadline of epoch {epochs.current(task)} (block time "
                                        f"{task.commit_deadline} ms) has passed")
    epochs.record(task, tx.sender, p, ctx.height)
    task.status = TaskStatus.RUNNING
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "epoch_committed", "task_id": p["task_id"], "worker": tx.sender,
                         "epoch": p["epoch"], "state": p["state_digest"]})
    if p["epoch"] != epochs.current(task):
        return
    done = len(epochs.committed(task, p["epoch"]))
    if epochs.all_committed(task):
        _close_epoch(state, params, ctx, p["task_id"], task)
    elif done == commit_quorum(crew.seats(task)):
        task.commit_deadline = min(task.commit_deadline, ctx.time_ms + deadlines.commit_grace_ms(params, task))


def apply_reject_task(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A worker reports that it cannot run the task (its dry run failed) instead of committing.
    When a strict majority of the workers rejected, the task ends ``rejected`` (ADR 0151): the relay
    claims are paid, ``reject_fee`` (capped by what is left of the escrow) is split among the
    rejecting workers when their rejection is corroborated, the owner gets the rest; every worker is
    freed; a lone rejecter gets no fee, loses reputation and is barred for a while (ADR 0192)."""
    p = tx.payload
    task_id = p["task_id"]
    task = get_task(state, task_id)
    if tx.sender not in task.workers:
        raise TxError(TxCode.UNAUTHORIZED, "sender is not a worker of this task")
    _require_status(task, TaskStatus.OPEN_FOR_COMMITS, "reject")
    if tx.sender in task.commits:
        raise TxError(TxCode.BAD_STATE, "this worker already committed a result; it cannot reject the task")
    if tx.sender in task.rejections:
        raise TxError(TxCode.ALREADY_KNOWN, "this worker already rejected the task")
    if epochs.entries(task, tx.sender):
        raise TxError(TxCode.BAD_STATE, "this worker already committed progress; it cannot reject the task")
    if crew.is_joiner(task, tx.sender):
        raise TxError(TxCode.BAD_STATE, "a worker that joined a running crew leaves it by not committing, "
                                        "not by rejecting the task")
    if deadlines.passed(task.commit_deadline, ctx):
        raise TxError(TxCode.BAD_STATE, f"the commit deadline (block time {task.commit_deadline} ms) has passed")
    task.rejections[tx.sender] = p["reason"]
    state.touch(TASK, task_id)
    state.events.append({"type": "worker_rejected", "task_id": task_id, "worker": tx.sender, "reason": p["reason"]})
    if len(task.rejections) >= commit_quorum(crew.seats(task)):
        _end_rejected(state, params, task_id, task)
    elif epochs.before_last(task) and epochs.all_committed(task):
        _close_epoch(state, params, ctx, task_id, task)   # the rest of the crew had committed the epoch
    else:
        _close_if_all_answered(state, params, ctx, task_id, task)


def _end_rejected(state: LedgerState, params: Params, task_id: bytes, task: Task) -> None:
    payouts: dict[str, int] = {}
    for relay, amount in sorted(task.relay_claims.items()):
        payouts[relay] = payouts.get(relay, 0) + amount
    fee = min(params.reject_fee, task.escrow - sum(payouts.values()))
    for worker, share in rejections.reject_payouts(task, fee).items():
        payouts[worker] = payouts.get(worker, 0) + share
    _refund(state, task, payouts)
    for worker in rejections.lone_rejecters(task):
        _adjust_reputation(state, worker, rejections.REPUTATION_LONE_REJECTION)
    for worker in task.workers:
        node = state.nodes.get(worker)
        if node is not None:
            node.active_tasks = max(0, node.active_tasks - 1)
            state.touch(NODE, worker)
    task.status = TaskStatus.REJECTED
    task.reason = "; ".join(f"{worker}: {task.rejections[worker]}" for worker in sorted(task.rejections))
    state.touch(TASK, task_id)
    state.events.append({"type": "task_rejected", "task_id": task_id, "rejections": dict(task.rejections),
                         "payouts": dict(task.payouts)})


def leading_result(task: Task, excluded: frozenset[str] | set[str] = frozenset()) -> bytes:
    """The result_hash the most committers (those not in ``excluded``) agree on; ties go to the
    hash committed first, then the smaller hash. b"" while nobody committed, and for a task whose crew
    stopped (its commitments are epoch states, not trained weights: ADR 0203)."""
    if "stopped" in task.epochs:
        return b""
    votes: dict[bytes, list[int]] = {}
    furthest = max((segments for worker, (_, _, segments, _) in task.commits.items() if worker not in excluded),
                   default=0)
    for worker, (_, result_hash, segments, height) in task.commits.items():
        if worker in excluded or segments < furthest:   # a worker that left the crew committed less
            continue
        count_first = votes.setdefault(result_hash, [0, height])
        count_first[0] += 1
        count_first[1] = min(count_first[1], height)
    if not votes:
        return b""
    return min(votes, key=lambda h: (-votes[h][0], votes[h][1], h))


def current_result(task: Task) -> bytes:
    """The task's result: fixed at finalize; before that, the leader among the committers whose
    audit slots do not (yet) find them guilty."""
    if task.status not in TaskStatus.ACTIVE:
        return task.result
    return leading_result(task, audits.guilty_workers(task))


# ---- finalize: payouts and slashing --------------------------------------------------------

def _check_finalizable(task: Task, ctx: BlockContext) -> None:
    _require_status(task, TaskStatus.ACTIVE, "finalize")
    if task.status in TaskStatus.OPEN_FOR_COMMITS:
        if not deadlines.passed(task.commit_deadline, ctx):
            raise TxError(TxCode.BAD_STATE, f"workers may commit until block time {task.commit_deadline} ms")
        return
    pending = audits.pending_slots(task)
    if pending:
        raise TxError(TxCode.BAD_STATE, f"audit slots {pending} are not resolved yet")
    if task.status != TaskStatus.VERIFIED and ctx.time_ms < task.window_end:
        raise TxError(TxCode.BAD_STATE, f"audit window open until block time {task.window_end} ms")


def _adjust_reputation(state: LedgerState, peer_id: str, delta: int) -> None:
    node = state.nodes.get(peer_id)
    if node is not None:
        node.reputation = min(max(node.reputation + delta, REPUTATION_BOUNDS[0]), REPUTATION_BOUNDS[1])
        state.touch(NODE, peer_id)


def apply_finalize(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """Settle a task whose audit slots are resolved (ADR 0168, 0188), or whose commit deadline has passed."""
    task_id = tx.payload["task_id"]
    task = get_task(state, task_id)
    _check_finalizable(task, ctx)
    settle(state, params, task_id, task)


def settle(state: LedgerState, params: Params, task_id: bytes, task: Task) -> None:
    """Pay out every epoch not yet paid (a task without epochs is one epoch; consensus/state/epoch_pay.py,
    docs/adr/0230): each worker held to an epoch's work and no slot found guilty is paid its seat's part
    for the slots that ended ok (a slot unaudited or undecided pays it nothing; ADR 0188); a guilty worker
    is slashed ``slash_mismatch_bps`` (burnt) once and unpaid; each verifier answer and referee vote a
    verdict contradicts costs ``slash_false_audit_bps``; the verifier pool goes to the answers and referee
    votes that agree with the verdicts. Then a worker that never committed loses reputation, relays'
    claims are paid and the owner gets the rest. The task ends ``paid`` when a worker was paid
    (``stopped`` when it stopped at an epoch boundary before its end, ADR 0211), else ``expired`` (nobody
    committed) or ``failed`` (every committer found guilty), with the reason (ADR 0187)."""
    wages = epoch_pay.earned(task)
    for epoch in range(epochs.count(task)):
        if epoch not in epoch_pay.released(task):
            for worker, amount in _release_epoch(state, params, task_id, task, epoch).items():
                wages[worker] = wages.get(worker, 0) + amount
    guilty = audits.guilty_workers(task)
    for worker in task.workers:
        if worker not in task.commits:   # a joiner whose first epoch never opened did not fail to show
            delta = 0 if epochs.never_started(task, worker) else REPUTATION_NO_SHOW
        else:
            delta = REPUTATION_SLASHED if worker in guilty else REPUTATION_PAID
        node = state.nodes.get(worker)
        if node is not None:
            node.active_tasks = max(0, node.active_tasks - 1)
            state.touch(NODE, worker)
        _adjust_reputation(state, worker, delta)
    _refund(state, task, dict(task.relay_claims))   # the relays' claims, the rest to the owner
    paid_workers = [worker for worker in task.workers if wages.get(worker)]
    slashed = sorted(guilty | set(audits.settle(task.slots, 0).false_answers))
    state.touch(TASK, task_id)
    if paid_workers:   # a task that stopped at an epoch boundary says so (docs/adr/0211)
        bandwidth.record_paid_task(state, task, paid_workers, state.height + 1)
        task.status = TaskStatus.STOPPED if "stopped" in task.epochs else TaskStatus.PAID
        task.result = leading_result(task, guilty)
        state.events.append({"type": "task_paid", "task_id": task_id, "payouts": dict(task.payouts),
                             "result": task.result, "slashed": slashed, "status": task.status})
        return
    task.status, task.reason = unpaid_outcome(task, guilty)
    state.events.append({"type": f"task_{task.status}", "task_id": task_id, "reason": task.reason,
                         "payouts": dict(task.payouts), "slashed": slashed})


def unpaid_outcome(task: Task, guilty: set[str] | None = None) -> tuple[str, str]:
    """The status and reason of a task that settles without paying any worker."""
    if not task.commits:
        rejected = f" ({len(task.rejections)} rejected it)" if task.rejections else ""
        return TaskStatus.EXPIRED, (f"no worker committed a result by the commit deadline (block time "
                                    f"{task.commit_deadline} ms){rejected}; the owner was refunded")
    if guilty is not None and len(guilty) < len(task.commits):
        return TaskStatus.FAILED, (f"no committed result ({len(task.commits)}) was audited ok: {len(guilty)} found "
                                   "wrong, the others' audit slots unaudited or undecided (ADR 0188); the owner was "
                                   "refunded, less the verifiers' pool")
    return TaskStatus.FAILED, (f"every committed result ({len(task.commits)}) was found wrong by its audits; "
                               "the owner was refunded, less the verifiers' pool")


def claim_relay_budget(task: Task, params: Params, relay: str, amount: int) -> None:
    """Reserve ``amount`` of the task's relay budget for ``relay`` (paid at finalize)."""
    budget = task.price * params.relay_share_bps // 10_000
    left = budget - sum(task.relay_claims.values())
    if amount > left:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"task relay budget has {left} left, receipt claims {amount}")
    task.relay_claims[relay] = task.relay_claims.get(relay, 0) + amount
