"""The compute role: join the ledger as a worker, train assigned tasks with the other workers over this
node's p2p Host, commit results, audit other workers' results by replay, and finalize tasks.

All ledger access goes through the node's ledger gateway (`node.ledger`, docs/adr/0100): at start it
bonds up to `[compute] stake` and contributes its roles, listen addresses and hardware to the node's
ledger record: the GPU it detected (`ml.hardware.detect`) and the bandwidth the node measured
(`node.bandwidth`; `[compute] bandwidth_mbps` only until a measurement exists), republished when the
measurement moves (docs/adr/0158). Then it looks at the tasks whenever the ledger's `tasks` subscription
reports a change (or a block reaches a block time it waits for: a deadline, an audit window's end, a
finalize retry; task deadlines are block times, docs/adr/0187), and at least every `FALLBACK_POLL_S`: a
task assigned to it is trained (one at a time, as the ledger assigns at most `max_tasks_per_worker`
each): its input artifacts fetched from the task's sources and co-workers, one step dry-run (an
untrainable task is rejected with the reason, reject_task), trained on the task's device, the final
weights added to the node's artifacts and committed as the result (commit_result), and served from then
on (docs/adr/0157); a committed task it does not work on is audited (`[compute] audit`, see
docs/adr/0080); a verified task it audited, a task of its own whose audit window has closed, or one
where some worker never committed (once the ledger accepts it) is finalized. A worker that dies mid-task
leaves the group; the others finish, commit (with the record of the rounds it missed, for the replay),
and the ledger opens the audit window once a quorum committed (docs/adr/0081). A job whose task the
ledger ended meanwhile (expired, failed, paid without it) is stopped. Progress is in `/status`
("compute"), the RPC methods `dkb_computeStatus` and `dkb_taskProgress`, and live over
`/dekube/task-progress/1.0.0`.

`ComputeRole` is the composition: it wakes on ledger events and looks at the tasks (`_tick`), and
hands each to the piece whose job it is: `Membership` (ml/compute/membership.py: bond, node record,
bandwidth), `Training` (ml/compute/training.py: our share of an assigned task), `VerificationDuties`
(ml/compute/verifying.py: audits, disputes, referee votes), `ResultStore` and `Finalizer`
(ml/compute/results.py: committed results served to verifiers, finalize), with `PeerFetch`
(ml/compute/peer_fetch.py) for peers' addresses and task inputs and `FaultInjection`
(ml/compute/fault_seam.py) the one seam for the test-only adversary modes. Tasks are read as
`consensus.task_info.TaskInfo`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Coroutine
from typing import TYPE_CHECKING, Any, cast

from consensus.task_info import TaskDocError, TaskInfo, TaskStatus
from ml.compute import availability_duty, progress_protocol, ready_protocol, segments_protocol
from ml.compute.dashboard_view import history, payouts_to, slashes_of
from ml.compute.epoch_commits import crew_exit
from ml.compute.fault_seam import FaultInjection
from ml.compute.host_transport import HostTransport
from ml.compute.job_board import TERMINAL, JobBoard
from ml.compute.limits import LimitsControl
from ml.compute.membership import Membership
from ml.compute.peer_fetch import PeerFetch
from ml.compute.provider_checks import problems as provider_problems
from ml.compute.results import Finalizer, ResultStore
from ml.compute.state_mirror import StateMirror, mirror_only
from ml.compute.training import PAUSED_REASON, Training
from ml.compute.verifying import VerificationDuties
from node.admission import PeerClass
from node.artifacts.quota import task_pins
from node.ledger import RESYNC, LedgerGateway, LedgerUnavailable, TxFailed
from node.roles import Role
from node.rpc.errors import InvalidParams, ResourceNotFound

if TYPE_CHECKING:
    from node.runtime import Node

log = logging.getLogger(__name__)

FALLBACK_POLL_S = 30.0   # a look at the tasks even when no event came (a missed one must not stall us)


class ComputeRole(Role):
    name = "compute"

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self._ledger: LedgerGateway = node.ledger
        self.config = node.config["compute"]
        self.board = JobBoard()
        self.jobs: dict[str, dict[str, Any]] = self.board.jobs  # task id hex -> progress/state of our share
        self._background: set[asyncio.Task[None]] = set()
        self.last_error: str | None = None
        self.paused = False                      # the dashboard's switch: take no new task (docs/adr/0195)
        self._wake = asyncio.Event()             # a task changed: look again
        self._due_ms: int | None = None          # a block time at which something becomes due
        self._heads_wanted = asyncio.Event()     # set while _due_ms is: follow newHeads
        folder = None if node.data_dir is None else node.data_dir / "compute"
        self.transport = HostTransport(node.host)
        self.membership = Membership(node, self._ledger, self.config, self.name, folder)
        self.store = ResultStore(folder, node.peer_id)
        self._challenges_answered: set[tuple[str, int]] = set()   # (task hex, slot) answered (ADR 0207)
        self.finalizer = Finalizer(self.ledger)
        self.fetch = PeerFetch(node, self.ledger, self.board, self.membership.meter)
        self.faults = FaultInjection(self.config["fault_inject"], lambda key: self.ledger.call("dkb_getTask", key),
                                     self.fetch.learn_addresses, node.host)
        # hours, longest task, GPUs, cores and memory lent (docs/adr/0198, 0220)
        self.limits = LimitsControl(self.config)
        self.training = Training(node, self.ledger, self.config, self.board, self.store, self.fetch, self.membership,
                                 self.faults, self.transport, self._spawn, self.limits)
        self.verification = VerificationDuties(node, self.ledger, self.fetch, self.membership, self.faults,
                                               self._spawn, self._set_error)
        self.mirror = StateMirror(node, self.board, self.fetch.learn_addresses, self._spawn)   # ADR 0236
        node.host.set_handler(segments_protocol.PROTOCOL, segments_protocol.make_record_handler(self.store.record_for))
        node.host.set_handler(ready_protocol.PROTOCOL,
                              ready_protocol.make_handler(self.training.ready_groups.__contains__))
        node.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(self.board))
        node.status.add_section("compute", self.status)
        node.rpc.register("dkb_computeStatus", self._rpc_status)
        node.rpc.register("dkb_taskProgress", self._rpc_task_progress)
        node.dashboard.sections["compute"] = self.dashboard_section
        node.dashboard.pause = self.set_paused
        node.dashboard.sections["limits"], node.dashboard.limits = self.limits.section, self.limits.set
        self.store.load()

    @property
    def ledger(self) -> LedgerGateway:
        return self._ledger

    @ledger.setter
    def ledger(self, ledger: LedgerGateway) -> None:
        """Another ledger gateway (tests give a fake one) for the role and every piece."""
        self._ledger = ledger
        for piece in (self.membership, self.finalizer, self.fetch, self.training, self.verification):
            piece.ledger = ledger

    @property
    def registered(self) -> bool:
        return self.membership.registered

    @registered.setter
    def registered(self, value: bool) -> None:
        self.membership.registered = value

    @property
    def hardware(self) -> dict[str, Any] | None:
        return self.membership.hardware

    @hardware.setter
    def hardware(self, value: dict[str, Any] | None) -> None:
        self.membership.hardware = value

    def _set_error(self, message: str) -> None:
        self.last_error = message

    def status(self) -> dict[str, Any]:
        return {"registered": self.registered, "ledger": self.ledger.describe(), "hardware": self.hardware,
                "jobs": self.jobs, "audits": self.verification.audits, "mirrors": self.mirror.status(),
                "last_error": self.last_error}

    def set_paused(self, paused: bool) -> dict[str, bool]:
        """Pause: the job under way finishes, a task assigned from now on is rejected (reason "paused by its
        provider"); audits of finished work go on. Resume: take tasks again."""
        if paused != self.paused:
            log.warning("compute %s from the dashboard", "paused" if paused else "resumed")
        self.paused = paused
        self._wake.set()
        return {"paused": self.paused}

    async def dashboard_section(self) -> dict[str, Any]:
        me = self.node.peer_id
        current = next(({"task_id": key, **{k: job.get(k) for k in ("state", "step", "steps", "loss", "utilization")},
                         "eta_s": self.board.snapshot(key)["eta_s"]}
                        for key, job in self.jobs.items()
                        if job.get("state") not in TERMINAL and not mirror_only(job)), None)
        section: dict[str, Any] = {"paused": self.paused, "registered": self.registered,
                                   "ledger": self.ledger.describe(), "hardware": self.hardware,
                                   "current_task": current, "last_error": self.last_error, "ledger_reachable": False}
        stake = await self.ledger.call("dkb_getStake", me)
        tasks = self._decode(await self.ledger.call("dkb_listTasks", None, None, 200))
        section["ledger_reachable"] = True
        section["wallet"] = {"balance": await self.ledger.balance(me), "bonded": stake["bonded"],
                             "unbonding": sum(int(a) for _, a in stake.get("unbonding") or [])}
        section["payouts"] = payouts_to(tasks, me)
        section["slashes"] = slashes_of(tasks, me)
        section["slashed"] = int(stake.get("slashed") or 0)
        section["problems"] = await provider_problems(self.ledger, int(stake["bonded"]), tasks)
        section.update(history(tasks, me))   # earnings over time, audits, owned tasks (docs/adr/0198)
        return section

    async def _rpc_status(self) -> dict[str, Any]:
        return self.status()

    async def _rpc_task_progress(self, task_id: str) -> dict[str, Any]:
        if not isinstance(task_id, str):
            raise InvalidParams("task_id: expected 32 bytes as hex")
        key = (task_id[2:] if task_id[:2] in ("0x", "0X") else task_id).lower()
        if len(key) != 64:
            raise InvalidParams("task_id: expected 32 bytes as hex")
        job = self.jobs.get(key)
        if job is None:
            raise ResourceNotFound(f"this node has no job for task {key}")
        return job

    # ---- main loop
    async def run(self) -> None:
        await self.node.ready.wait()
        if not self.ledger.available:  # a misconfiguration: say so in the log and /status, keep serving
            self.last_error = "no ledger: set [ledger] rpc_urls or run a validator role"
            log.error("compute role idle: %s", self.last_error)
            await asyncio.Event().wait()
        watchers = [self._spawn(self._watch_tasks()), self._spawn(self._watch_heads()),
                    self._spawn(self.membership.follow_bandwidth())]
        try:
            while True:
                self._wake.clear()
                try:
                    if not self.registered:
                        await self.membership.join()
                    await self._tick()
                    self.last_error = None
                    wait = FALLBACK_POLL_S
                except (LedgerUnavailable, TxFailed) as exc:
                    # the same failure every poll is logged once (it stays in /status as last_error)
                    (log.debug if str(exc) == self.last_error else log.warning)("compute: %s", exc)
                    self.last_error = str(exc)
                    wait = self.config["poll_interval"]
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
        finally:
            for watcher in watchers:
                watcher.cancel()
            for running in [self.training.busy, *self._background]:
                if running is not None:
                    running.cancel()
            await self.transport.close()

    # ---- what wakes the main loop
    async def _watch_tasks(self) -> None:
        """Wake the main loop on every task event (and after a reconnect, which may have lost some)."""
        while True:
            try:
                async for event in self.ledger.subscribe("tasks"):
                    if event is RESYNC:
                        self.training.notify(None)
                    elif isinstance(event, dict) and isinstance(event.get("task_id"), str):
                        self.training.notify(event["task_id"])
                    self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no tasks topic at this validator: the fallback poll still runs
                log.warning("compute: no tasks subscription (%s); looking every %g s", exc, FALLBACK_POLL_S)
                await asyncio.sleep(FALLBACK_POLL_S)

    async def _watch_heads(self) -> None:
        """Wake the main loop when a block's time reaches ``_due_ms``; follows ``newHeads`` only while
        something is due (an idle node gets no message per block)."""
        while True:
            await self._heads_wanted.wait()
            stream = cast("AsyncGenerator[Any, None]", self.ledger.subscribe("newHeads"))
            try:
                async for head in stream:
                    due = self._due_ms
                    if due is None:
                        break
                    if head is RESYNC or (isinstance(head, dict) and head.get("time_ms", 0) >= due):
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("compute: no newHeads subscription (%s)", exc)
                await asyncio.sleep(FALLBACK_POLL_S)
            finally:
                await stream.aclose()

    @staticmethod
    def _decode(docs: Any) -> list[TaskInfo]:
        """A dkb_listTasks answer as TaskInfos; a task the decoder refuses is logged and left out."""
        out = []
        for doc in docs if isinstance(docs, list) else []:
            try:
                out.append(TaskInfo.from_json(doc))
            except TaskDocError as exc:
                log.warning("compute: ignoring a malformed task from the ledger: %s", exc)
        return out

    async def _tick(self) -> None:
        me = self.node.peer_id
        docs = await self.ledger.call("dkb_listTasks", None, None, 200)
        self.node.artifacts.quota.set_task_pins(task_pins(docs, me))   # kept from eviction (node/artifacts/quota.py)
        tasks = self._decode(docs)
        now = ledger_time(tasks)
        self._due_ms = None
        self._heads_wanted.clear()
        business: set[str] = set()   # crews, owners, verifiers and referees of our open tasks (ADR 0186)
        for task in reversed(tasks):  # oldest first
            parties = task.parties
            involved = me in task.workers or me in parties
            if (involved or task.owner == me) and task.status in TaskStatus.ACTIVE:
                business.update(p for p in (*task.workers, *parties, task.owner) if p)
            if me in task.workers:
                await self._look_as_worker(task, me, now)
            audited = task.status in TaskStatus.AUDITABLE or (task.status in TaskStatus.ACTIVE and task.slots)
            if audited and (self.config["audit"] or me in task.workers):   # an epoch's audits run beside training
                self.verification.start_owed(task, now + 1)                 # (docs/adr/0230)
            if audited and involved:
                await self._look_at_audits(task, now)
        self.mirror.look_all([task for task in reversed(tasks) if me in task.parties])   # a verifier keeps epoch states
        # reserved artifact upload slots and serving capacity for them (node/admission.py)
        self.node.host.classes.set_tag("compute-business", PeerClass.BUSINESS, business - {me})

    async def _look_as_worker(self, task: TaskInfo, me: str, now: int) -> None:
        """Train, reject (paused, or outside the provider's limits), finalize or stop our share of a task we
        are a worker of (stopped too once the ledger takes no more commitments from us, docs/adr/0203)."""
        key, status = task.task_id, task.status
        job = self.jobs.get(key)
        if mirror_only(job):   # we only kept its states as a verifier (ADR 0236): named to its crew now
            job = None
        job = job or self.training.restore(task, me)   # states kept across a restart (ADR 0232)
        self.training.seen(task)   # a joiner named to the crew may send before our round reaches it (ADR 0226)
        if availability_duty.challenges_for(task, me, now + 1):   # ADR 0207 (an epoch's slots too, ADR 0230)
            self._spawn(self._answer_challenges(task, me, now + 1))
        rejected = me in task.rejections
        open_to_us = status in TaskStatus.OPEN_FOR_COMMITS and me not in task.commits and not rejected and job is None
        refusal = PAUSED_REASON if self.paused else self.limits.refusal(task)
        if open_to_us and refusal:
            self.board.start(key, workers=list(task.workers))   # once: the job now exists
            self._spawn(self.training.reject(key, task.task_bytes, refusal, joiner=bool(task.first_epoch(me))))
        elif open_to_us and self.training.idle():
            self.training.start(task)
        elif status in TaskStatus.OPEN_FOR_COMMITS and (rejected or self.training.ended(key)):
            # a worker never committed: finalize once the commit deadline has passed
            self.finalizer.not_before(key, task.commit_deadline + 1)
            await self.finalizer.finalize(key, now)
            self._due_at(self.finalizer.next_attempt(key, 0))
        elif status in TaskStatus.FINAL and job is not None and not self.training.ended(key):
            self.training.stop_job(task)
        elif crew_exit(task, me) and job is not None and not self.training.ended(key):   # ADR 0203
            self.training.stop_job(dataclasses.replace(task, status="closed to this worker",
                                                       reason=crew_exit(task, me)))

    async def _answer_challenges(self, task: TaskInfo, me: str, now: int) -> None:
        """Answer the availability challenges on our slots of `task` with the records we serve (ADR 0207)."""
        await availability_duty.answer_challenges(task, me, now, self.store.leaf_worker(task.task_id),
                                                  self.store.record_for, self.ledger.send, self._challenges_answered)

    async def _look_at_audits(self, task: TaskInfo, now: int) -> None:
        """Finalize a task whose audit slots are settled (or whose window closed); else wake at the next
        block time one of its pending slots moves at."""
        key = task.task_id
        pending = [slot for slot in task.slots if slot.pending]
        if task.status not in TaskStatus.AUDITABLE:   # an epoch's slots while the crew trains: no finalize yet
            if pending:
                self._due_at(min([d for slot in pending for d in slot.deadlines()], default=now + 1000))
            return
        if not pending and (task.status == TaskStatus.VERIFIED or now >= task.window_end):
            self.finalizer.due_now(key)   # due now: no need to wait for the retry time
            await self.finalizer.finalize(key, now)
        deadlines = [d for slot in pending for d in slot.deadlines()]
        self._due_at(min([*deadlines, task.window_end, self.finalizer.next_attempt(key, task.window_end)]))

    def _due_at(self, time_ms: int) -> None:
        self._due_ms = time_ms if self._due_ms is None else min(self._due_ms, time_ms)
        self._heads_wanted.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: self._wake.set())  # a job or audit ended: look again
        return task


def ledger_time(tasks: list[TaskInfo]) -> int:
    """The ledger's time as its task documents carry it (``block_time_ms``: the last block's time, which
    task deadlines are measured against, docs/adr/0187); 0 when none says."""
    return max((t.block_time_ms for t in tasks), default=0)
