"""Task deadlines in block time (docs/adr/0187): derived from the work a task declares, never block counts.

Every deadline of a task (commit, audit answer, dispute, referee vote, audit window) is a block-header
time in milliseconds (BFT time: the proposer's clock, at least the previous block's and at most
``MAX_FUTURE_BLOCK_MS`` ahead of the validators' clocks, consensus/validator/block_check.py), so the
chain's block rate, which follows its load, cannot cut off real work. A span is the expected duration
of the work times ``deadline_factor_pct`` plus a slack: for the commit the whole task (the spec's
``expected_s``, which the submitter's dry run measured), for an answer or a referee vote one
segment's replay (the expected duration over the task's segments). A task cut into epochs (docs/adr/0203)
gets the span of one epoch's work per epoch, renewed at each epoch's close. Pure functions of the params, the
task and the block: every replica computes the same deadlines.
"""
from __future__ import annotations

from consensus.genesis import Params
from consensus.state.context import BlockContext
from consensus.state.records import Task
from consensus.txcodes import TxCode, TxError

COMMIT_GRACE_FRACTION = 4    # stragglers get a quarter of the commit span once a quorum has committed
MIN_GRACE_MS = 1_000


def expected_ms(task: Task) -> int:
    """The task's declared duration in milliseconds (0: not declared, a task from before ADR 0187)."""
    return int(task.spec.get("expected_s", 0)) * 1000


def work_span_ms(params: Params, work_ms: int, slack_s: int) -> int:
    """``work_ms`` times the deadline factor, plus ``slack_s``."""
    return work_ms * params.deadline_factor_pct // 100 + slack_s * 1000


def commit_span_ms(params: Params, expected_s: int) -> int:
    """From assignment to the commit deadline: within [task_min_s, task_max_s] (check_expected refuses
    at submit a task that would need more than task_max_s)."""
    span = max(params.task_min_s * 1000, work_span_ms(params, expected_s * 1000, params.task_slack_s))
    return min(span, params.task_max_s * 1000)


def check_expected(params: Params, expected_s: int) -> None:
    """Refuse a submit whose declared duration needs a commit span beyond the chain's ``task_max_s``."""
    needed = max(params.task_min_s * 1000, work_span_ms(params, expected_s * 1000, params.task_slack_s))
    if needed > params.task_max_s * 1000:
        raise TxError(TxCode.BAD_PAYLOAD, f"a task expecting {expected_s} s needs {needed // 1000} s to commit; "
                                          f"this chain allows at most task_max_s {params.task_max_s} s")


def epoch_count(task: Task) -> int:
    """How many epochs the task's spec cuts it into (1: a task without epochs)."""
    return int(task.spec.get("epochs", 1))


def task_span_ms(params: Params, task: Task) -> int:
    """The commit span of the task, or, for a task cut into epochs, of one epoch: its share of the
    declared work, with the same factor, slack and bounds (docs/adr/0203)."""
    return commit_span_ms(params, expected_ms(task) // epoch_count(task) // 1000)


def commit_deadline(params: Params, ctx: BlockContext, task: Task) -> int:
    """The last block time that accepts a commitment (of the task, or of its open epoch), for a task
    assigned (or an epoch opened) in block ``ctx``."""
    return ctx.time_ms + task_span_ms(params, task)


def commit_grace_ms(params: Params, task: Task) -> int:
    """How long the other workers still get once a quorum has committed (the task, or its epoch)."""
    return max(MIN_GRACE_MS, task_span_ms(params, task) // COMMIT_GRACE_FRACTION)


def replay_ms(task: Task) -> int:
    """The expected duration of one segment's replay (a verifier's or referee's work)."""
    segments = task.segments or max((commit[2] for commit in task.commits.values()), default=1)
    return expected_ms(task) // max(1, segments)


def answer_deadline(params: Params, ctx: BlockContext, task: Task) -> int:
    """The last block time for a verifier drawn in block ``ctx`` to answer (or a referee to vote)."""
    return ctx.time_ms + work_span_ms(params, replay_ms(task), params.audit_answer_s)


def reveal_deadline(params: Params, ctx: BlockContext) -> int:
    """The last block time for a slot's verifiers to reveal the answers they committed to, for reveals
    opened in block ``ctx`` (ADR 0202)."""
    return ctx.time_ms + params.audit_reveal_s * 1000


def dispute_deadline(params: Params, ctx: BlockContext) -> int:
    """The last block time for an audited worker to dispute a mismatch found in block ``ctx``."""
    return ctx.time_ms + params.dispute_s * 1000


def window_end(params: Params, ctx: BlockContext) -> int:
    """When finalize may pay a task whose commit phase closed in block ``ctx`` (unless it is verified)."""
    return ctx.time_ms + params.audit_window_s * 1000


def passed(deadline: int, ctx: BlockContext, closing: bool = False) -> bool:
    """Whether ``deadline`` has passed for a transaction of block ``ctx`` (one at the deadline still
    counts), or, ``closing``, at the end of that block."""
    return deadline < ctx.time_ms or (closing and deadline <= ctx.time_ms)


def passed_in_block(deadline: int, last_block_time_ms: int, ctx: BlockContext) -> bool:
    """Whether ``deadline`` passes at the end of block ``ctx`` and had not at the end of the previous
    block (whose time is ``last_block_time_ms``): once per deadline, whatever the block rate."""
    return last_block_time_ms < deadline <= ctx.time_ms
