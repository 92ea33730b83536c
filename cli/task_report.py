"""How a task is told: its audit slots (docs/adr/0168: each committed worker's drawn segments, the
verifiers' answers, a dispute, the referees' votes, the outcome) and the payouts of a paid task, each
labelled worker, verifier, referee, relay or refund (cli/payout_lines.py); the bytes relayed for it per
relay (docs/adr/0223); the reason, the workers'
rejections and the refund of a rejected, expired, failed or cancelled one. Deadlines are block times
(docs/adr/0187), told relative to the ledger's time the document carries (``block_time_ms``).
``report_final`` returns the command's exit status (0 paid or cancelled by the owner, 1 rejected,
expired or failed)."""
from __future__ import annotations

import json
from typing import Any

from cli.errors import CliError
from cli.payout_lines import payout_lines
from cli.safe_text import echo
from consensus.task_info import Answer, TaskDocError, TaskInfo, TaskStatus

FAILED = (TaskStatus.REJECTED, TaskStatus.EXPIRED, TaskStatus.FAILED)
OPEN_FOR_COMMITS = TaskStatus.OPEN_FOR_COMMITS


def decode_task(doc: object) -> TaskInfo:
    """A task document from the ledger as a TaskInfo; a CliError saying what is wrong when it is malformed."""
    try:
        return TaskInfo.from_json(doc)
    except TaskDocError as exc:
        raise CliError(f"the ledger answered a malformed task: {exc}") from None


def short(peer: str) -> str:
    return f"{peer[:16]}.." if len(peer) > 18 else peer


def duration_text(ms: int) -> str:
    """``ms`` as 1h02m, 4m05s or 12s."""
    seconds = max(0, ms) // 1000
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def deadline_text(task: TaskInfo, deadline: int) -> str:
    """A deadline (block time, ms) as "in 4m05s" or "passed 12s ago" from the ledger's time; the block
    time itself when the document does not carry the ledger's time."""
    now = task.block_time_ms
    if not deadline:
        return "no deadline"
    if not now:
        return f"at block time {deadline} ms"
    return f"in {duration_text(deadline - now)}" if deadline >= now else f"passed {duration_text(now - deadline)} ago"


def deadline_lines(task: TaskInfo) -> list[str]:
    """The task's running deadline, if any: the commit deadline while its workers may commit, the
    audit window's end while it is committed or disputed."""
    if task.status in OPEN_FOR_COMMITS and task.commit_deadline:
        expected = task.spec_field("expected_s")
        work = f" (expected work {duration_text(expected * 1000)})" if isinstance(expected, int) else ""
        return [f"commit by:  {deadline_text(task, task.commit_deadline)}{work}"]
    if task.status in (TaskStatus.COMMITTED, TaskStatus.DISPUTED) and task.window_end:
        return [f"audits end: {deadline_text(task, task.window_end)} at the earliest"]
    return []


def mib_text(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def relay_lines(task: TaskInfo) -> list[str]:
    """The bytes the task's circuits carried through each relay, as its workers reported them at commit
    (docs/adr/0223); nothing when no worker reported any."""
    by_relay = task.relayed_by_relay
    if not by_relay:
        return []
    lines = [f"relayed: {mib_text(sum(by_relay.values()))} through relays (the workers' circuit counts at commit)"]
    lines += [f"  relay {short(relay)}  {mib_text(n)}" for relay, n in by_relay.items()]
    return lines


def answer_text(answer: Answer | None) -> str:
    """A verifier's answer or a referee's vote: match / MISMATCH (at step s) and its evidence."""
    if answer is None:
        return "no answer yet"
    text = "match" if answer.match else "MISMATCH"
    if not answer.match and answer.step:
        text += f" from step {answer.step}"
    return f"{text}, evidence {answer.evidence[:16]}.."


def slot_lines(task: TaskInfo) -> list[str]:
    """One line per audit slot (worker, segment, outcome), then one per verifier, the dispute and
    one per referee."""
    if not task.slots:
        return []
    lines = [f"audit slots ({len(task.slots)}, profile {task.profile or 'any'}):"]
    for slot in task.slots:
        lines.append(f"  slot {slot.slot}  {slot.outcome:9}  segment {slot.segment} of {short(slot.worker)}")
        for v in slot.verifiers:
            text = seat_text(v.answer, v.commitment is not None, v.unrevealed, slot.pending)
            lines.append(f"      verifier {short(v.verifier)}  {text}"
                         f"{'  [redrawn]' if v.redraw else ''}  (due {deadline_text(task, v.deadline)})")
        if slot.challenge_deadline and slot.pending:   # docs/adr/0207
            lines.append(f"      challenged: the worker must show its record, due "
                         f"{deadline_text(task, slot.challenge_deadline)}")
        if slot.disputed:
            lines.append(f"      disputed by the worker at height {slot.dispute_height}")
        elif slot.dispute_deadline and slot.pending:
            lines.append(f"      the worker may dispute: due {deadline_text(task, slot.dispute_deadline)}")
        for r in slot.referees:
            lines.append(f"      referee  {short(r.referee)}  "
                         f"{seat_text(r.vote, r.commitment is not None, r.unrevealed, slot.pending, 'vote')}"
                         f"  (due {deadline_text(task, slot.referee_deadline)})")
    return lines


def seat_text(answer: Answer | None, committed: bool, unrevealed: bool, pending: bool, what: str = "answer") -> str:
    """A judge's seat: its revealed answer (or vote); else sealed, withheld or silent (docs/adr/0202, 0210)."""
    if answer is not None:
        return answer_text(answer)
    if unrevealed:
        return f"withheld its sealed {what} (slashed)"
    if committed:
        return f"{what} sealed, not revealed yet"
    return f"silent (no {what} by its deadline)" if not pending else f"no {what} yet"


def report_final(task: TaskInfo, *, as_json: bool = False, extra: dict[str, Any] | None = None) -> int:
    status = task.status
    code = 1 if status in FAILED else 0
    if as_json:
        print(json.dumps({**task.doc, **(extra or {})}))
        return code
    if status in FAILED or status in (TaskStatus.CANCELLED, TaskStatus.STOPPED):
        echo(f"task {task.task_id} {status}" + (f": {task.reason}" if task.reason else ""))
        for worker, reason in task.rejections.items():
            echo(f"  rejected by worker {worker}: {reason}")
    for line in slot_lines(task):
        echo(line)
    if task.payouts:
        echo(f"payouts of task {task.task_id} (price {task.price}):")
    for line in payout_lines(task):
        echo(line)
    if status in (TaskStatus.PAID, TaskStatus.STOPPED):
        for worker in task.workers:
            if worker not in task.payouts:
                echo(f"  {worker}  {'worker':10} 0 (not paid: no commitment, or an audit slot found it guilty)")
    if task.result:
        echo(f"result (weights artifact): {task.result}")
    return code
