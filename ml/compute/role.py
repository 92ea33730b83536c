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
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from consensus.tx import HARDWARE, MAX_CPU_CORES
from ml import hardware
from ml.compute import progress_protocol, ready_protocol, segments_protocol
from ml.compute.commitment import Commitment
from ml.compute.dashboard_view import history, payouts_to, slashes_of
from ml.compute.duties import AUDIT, DISPUTE, REVEAL, Duty, duties_for
from ml.compute.epoch_commits import EpochCommitter, crew_exit
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.host_transport import HostTransport
from ml.compute.job_board import JobBoard
from ml.compute.limits import LimitsControl
from ml.compute.progress_history import record_point
from ml.compute.provider_checks import problems as provider_problems
from ml.compute.sealed_answers import SealedAnswers
from ml.compute.segment_record import BadRecord, SegmentRecord, leaves, proof, root
from ml.compute.task_inputs import fetch_inputs, source_peers
from ml.compute.task_spec import InvalidTask, check_segments, train_spec_for_task
from ml.compute.verification_flow import VERIFIER_FAULTS, Judgement, Sources, judge_as, unavailable_evidence
from ml.job.participation import departures
from ml.job.runner import train_to_end
from ml.profiles import MAX_PROFILES
from ml.train.dry_run import Untrainable, dry_run
from ml.train.faults import falsify_records
from ml.train.inputs import artifact_ids
from ml.train.progress import ProgressFeed
from ml.train.segments import ArtifactSink
from node.admission import PeerClass
from node.artifacts.quota import task_pins
from node.bandwidth import worth_publishing
from node.ledger import RESYNC, LedgerGateway, LedgerUnavailable, TxFailed
from node.p2p.errors import ProtocolError
from node.roles import Role
from node.rpc.errors import InvalidParams, ResourceNotFound

if TYPE_CHECKING:
    from node.metrics import Registry
    from node.runtime import Node

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
READY_MIN_FETCH_RATE = 1 << 20   # bytes/s: co-workers fetching the inputs this slowly are still waited for
LINGER_S = 60.0          # keep a finished group serving while peers may still finish the last round
FETCH_ATTEMPTS = 3
UNAVAILABLE_FRACTION = 0.25  # a judge answers "unavailable" only in the last quarter of its answer window
COPYCAT_WAIT_S = 300.0   # fault_inject=copycat: how long to wait for another worker's commitment
TRAINING = ("assigned", "running")
AUDITABLE = ("committed", "verified", "disputed")
LEDGER_FINAL = ("paid", "cancelled", "rejected", "expired", "failed")   # nothing more to train or commit
FINALIZE_RETRY_MS = 15_000   # block time between two finalize attempts of one task
FALLBACK_POLL_S = 30.0   # a look at the tasks even when no event came (a missed one must not stall us)
ENDED = ("failed", "committed", "rejected")
FIRST_BANDWIDTH_CHECK_S = 10.0
BANDWIDTH_CHECK_S = 15.0     # how often the measured bandwidth is compared with the published one
REPUBLISH_MIN_S = 300.0      # and at most how often a new figure is published
PAUSED_REASON = "paused by its provider"
MAX_REASON_CHARS = 500       # reject_task's reason (the ledger's bound)
BANDWIDTH_FILE = "bandwidth.json"   # in <data_dir>/compute: the last measured figure published


class ComputeRole(Role):
    name = "compute"

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.ledger: LedgerGateway = node.ledger
        self.config = node.config["compute"]
        self.registered = False
        self.board = JobBoard()
        self.jobs: dict[str, dict] = self.board.jobs  # task id hex -> progress/state of our share
        self.hardware: dict | None = None        # ml.hardware.detect(), measured once at join
        self._published_mbps: int | None = None  # the bandwidth figure in our ledger record
        self.results: dict[str, dict] = {}       # task id hex -> {"records", "segments_root", ...}
        self._leaves: dict[str, list[bytes]] = {}   # task id hex -> Merkle leaves of the served records
        self.audits: dict[str, list[dict]] = {}  # task id hex -> audit answers and referee votes we sent
        self._duties_started: set[tuple[str, str, int]] = set()   # Duty.key of those sent or under way
        self._judging = asyncio.Lock()
        self.sealed = SealedAnswers(node.identity)   # audit answers committed, then revealed (ADR 0202)
        self._first_seen: dict[tuple[str, str, int], int] = {}   # Duty.key -> block time it was first looked at
        self._ready_groups: set[bytes] = set()
        self._finalize_at: dict[str, int] = {}   # task id hex -> block time of the next finalize attempt
        self._busy: asyncio.Task | None = None   # the training job or audit in progress
        self._background: set[asyncio.Task] = set()
        self.last_error: str | None = None
        self.paused = False                      # the dashboard's switch: take no new task (docs/adr/0195)
        self._wake = asyncio.Event()             # a task changed: look again
        self._due_ms: int | None = None          # a block time at which something becomes due
        self._heads_wanted = asyncio.Event()     # set while _due_ms is: follow newHeads
        self._task_changed: dict[str, asyncio.Event] = {}  # task id hex -> set on its next event
        self.transport = HostTransport(node.host)
        node.host.set_handler(segments_protocol.PROTOCOL, segments_protocol.make_record_handler(self._record_for))
        node.host.set_handler(ready_protocol.PROTOCOL, ready_protocol.make_handler(self._ready_groups.__contains__))
        node.host.set_handler(progress_protocol.PROTOCOL, progress_protocol.make_handler(self.board))
        node.status.add_section("compute", self.status)
        node.rpc.register("dkb_computeStatus", self._rpc_status)
        node.rpc.register("dkb_taskProgress", self._rpc_task_progress)
        node.dashboard.sections["compute"] = self.dashboard_section
        node.dashboard.pause = self.set_paused
        self.limits = LimitsControl(self.config)   # hours, longest task, GPUs lent (docs/adr/0198)
        node.dashboard.sections["limits"], node.dashboard.limits = self.limits.section, self.limits.set
        self._register_metrics(node.metrics)
        if node.data_dir is not None:
            self._load_results()

    def _register_metrics(self, metrics: Registry) -> None:
        self.tasks_done = metrics.counter("dekube_compute_tasks_total", "Task shares finished, by outcome.",
                                          ["outcome"])
        self.audits_sent = metrics.counter("dekube_compute_audits_total", "Audit results submitted, by verdict.",
                                           ["verdict"])
        metrics.gauge("dekube_compute_training_step", "Optimizer steps done in the task being trained.").set_function(
            lambda: max((j["step"] for j in self.jobs.values() if j["state"] == "training"), default=0))
        metrics.counter_function("dekube_compute_allreduce_bytes_sent_total",
                                 "All-reduce bytes sent by this node's task shares.",
                                 lambda: sum(j["bytes_sent"] for j in self.jobs.values()))
        self.steps = metrics.counter("dekube_compute_steps_total", "Optimizer steps trained, all tasks.")
        self.round_seconds = metrics.histogram("dekube_compute_allreduce_round_seconds",
                                               "Seconds per committed all-reduce round.",
                                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))

    def _on_progress(self, key: str, progress) -> None:
        """Count new steps, keep the job's bounded loss/metric history (served by dkb_taskProgress and
        the progress protocol's first frame) and update the job (which wakes its watchers)."""
        job = self.jobs[key]
        self.steps.inc(max(0, progress.step - job.get("history_last_step", 0)))
        job["history_last_step"] = max(progress.step, job.get("history_last_step", 0))
        record_point(job, progress.step, progress.loss, progress.metrics)
        self.board.update(key, step=progress.step, loss=progress.loss, bytes_sent=progress.bytes_sent,
                          participants=progress.participants,
                          **({"metrics": progress.metrics} if progress.metrics else {}))

    def status(self) -> dict:
        return {"registered": self.registered, "ledger": self.ledger.describe(), "hardware": self.hardware,
                "jobs": self.jobs, "audits": self.audits, "last_error": self.last_error}

    def set_paused(self, paused: bool) -> dict:
        """Pause: the job under way finishes, a task assigned from now on is rejected (reason "paused by its
        provider"); audits of finished work go on. Resume: take tasks again."""
        if paused != self.paused:
            log.warning("compute %s from the dashboard", "paused" if paused else "resumed")
        self.paused = paused
        self._wake.set()
        return {"paused": self.paused}

    async def dashboard_section(self) -> dict:
        me = self.node.peer_id
        current = next(({"task_id": key, **{k: job.get(k) for k in ("state", "step", "steps", "loss")},
                         "eta_s": self.board.snapshot(key)["eta_s"]}
                        for key, job in self.jobs.items() if job.get("state") not in ENDED), None)
        section = {"paused": self.paused, "registered": self.registered, "ledger": self.ledger.describe(),
                   "hardware": self.hardware, "current_task": current, "last_error": self.last_error,
                   "ledger_reachable": False}
        stake = await self.ledger.call("dkb_getStake", me)
        tasks = await self.ledger.call("dkb_listTasks", None, None, 200)
        section["ledger_reachable"] = True
        section["wallet"] = {"balance": await self.ledger.balance(me), "bonded": stake["bonded"],
                             "unbonding": sum(int(a) for _, a in stake.get("unbonding") or [])}
        section["payouts"] = payouts_to(tasks, me)
        section["slashes"] = slashes_of(tasks, me)
        section["slashed"] = int(stake.get("slashed") or 0)
        section["problems"] = await provider_problems(self.ledger, int(stake["bonded"]), tasks)
        section.update(history(tasks, me))   # earnings over time, audits, owned tasks (docs/adr/0198)
        return section

    async def _rpc_status(self) -> dict:
        return self.status()

    async def _rpc_task_progress(self, task_id: str) -> dict:
        if not isinstance(task_id, str):
            raise InvalidParams("task_id: expected 32 bytes as hex")
        key = (task_id[2:] if task_id[:2] in ("0x", "0X") else task_id).lower()
        if len(key) != 64:
            raise InvalidParams("task_id: expected 32 bytes as hex")
        job = self.jobs.get(key)
        if job is None:
            raise ResourceNotFound(f"this node has no job for task {key}")
        return job

    # ---- results kept across restarts (a verifier may ask after we restarted)
    def _results_dir(self) -> Path | None:
        return None if self.node.data_dir is None else self.node.data_dir / "compute"

    def _load_results(self) -> None:
        folder = self._results_dir()
        if folder is None or not folder.is_dir():
            return
        for path in folder.glob("*.json"):
            if len(path.stem) != 64:   # results are named by task id (bandwidth.json is not one)
                continue
            try:
                self.results[path.stem] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable result %s: %s", path, exc)

    def _save_result(self, key: str, result: dict) -> None:
        self.results[key] = result
        folder = self._results_dir()
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{key}.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, folder / f"{key}.json")

    def _saved_bandwidth(self) -> int | None:
        """The last measured link figure this node published (kept across restarts, so a restart
        does not fall back to the configured guess until it has measured again)."""
        folder = self._results_dir()
        try:
            value = json.loads((folder / BANDWIDTH_FILE).read_text())["link_mbps"] if folder is not None else None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 10**6 else None

    def _save_bandwidth(self, link_mbps: int) -> None:
        folder = self._results_dir()
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{BANDWIDTH_FILE}.tmp"
        tmp.write_text(json.dumps({"link_mbps": link_mbps}))
        os.replace(tmp, folder / BANDWIDTH_FILE)

    def _record_for(self, task_id: bytes, index: int) -> segments_protocol.SegmentAnswer | None:
        """Our record of segment `index` of a task we committed, with its Merkle proof (v2 protocol)."""
        key = task_id.hex()
        result = self.results.get(key)
        if result is None or not isinstance(result.get("records"), list) or not 0 <= index < len(result["records"]):
            return None
        try:
            if key not in self._leaves:
                records = [SegmentRecord.from_obj(r) for r in result["records"]]
                self._leaves[key] = leaves(task_id, result.get("leaf_worker") or self.node.peer_id, records)
            record = SegmentRecord.from_obj(result["records"][index])
        except BadRecord as exc:
            log.warning("cannot serve the records of task %s: %s", key, exc)
            return None
        leaf_list = self._leaves[key]
        return segments_protocol.SegmentAnswer(record, proof(leaf_list, index), len(leaf_list))

    # ---- main loop
    async def run(self) -> None:
        await self.node.ready.wait()
        if not self.ledger.available:  # a misconfiguration: say so in the log and /status, keep serving
            self.last_error = "no ledger: set [ledger] rpc_urls or run a validator role"
            log.error("compute role idle: %s", self.last_error)
            await asyncio.Event().wait()
        watchers = [self._spawn(self._watch_tasks()), self._spawn(self._watch_heads()),
                    self._spawn(self._follow_bandwidth())]
        try:
            while True:
                self._wake.clear()
                try:
                    if not self.registered:
                        await self._join()
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
            for task in watchers:
                task.cancel()
            for task in [self._busy, *self._background]:
                if task is not None:
                    task.cancel()
            await self.transport.close()

    async def _join(self) -> None:
        """Bond up to the configured stake and have this node's record say compute (and verifier)."""
        me = self.node.peer_id
        bonded = await self.ledger.bonded(me)
        if bonded < self.config["stake"]:
            await self.ledger.send("bond", {"amount": self.config["stake"] - bonded})
        if self.hardware is None:
            try:
                self.hardware = await asyncio.to_thread(hardware.detect)
            except Exception as exc:  # a broken driver must not keep the node out: register as CPU-only
                log.warning("GPU detection failed, registering without a GPU: %s", exc)
                self.hardware = {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0}
            log.info("hardware detected", extra={k: v for k, v in self.hardware.items() if k != "gpu"} |
                     {"gpu_name": self.hardware["gpu"] or "none"})
        meter = self._meter()
        measured = meter.link_mbps() if meter is not None else None
        self._contribute_record(measured or self._saved_bandwidth() or self.config["bandwidth_mbps"])
        await self.ledger.record.sync()
        self.registered = True
        log.info("compute node registered", extra={"peer_id": me, "ledger": self.ledger.describe()})

    def _contribute_record(self, bandwidth_mbps: int) -> None:
        self._published_mbps = bandwidth_mbps
        self.ledger.record.contribute(
            self.name, roles={"compute", "verifier"} if self.config["audit"] else {"compute"},
            listen_addrs=self.node.host.listen_addrs,
            hardware=hardware_record(self.hardware or {}, bandwidth_mbps))

    def _bandwidth_service(self):
        return getattr(self.node, "services", {}).get("bandwidth")

    def _meter(self):
        service = self._bandwidth_service()
        return service.meter if service is not None else None

    async def _follow_bandwidth(self) -> None:
        """Have the node measure its link, and publish the measured figure in the record: the first
        one as soon as it exists (replacing the configured guess), later ones when they moved by
        more than half, at most every REPUBLISH_MIN_S (each is a register_node transaction)."""
        service = self._bandwidth_service()
        if service is None:
            return
        service.start_probing()
        measured_once, last = False, 0.0
        await asyncio.sleep(FIRST_BANDWIDTH_CHECK_S)
        while True:
            measured = service.meter.link_mbps()
            if self.registered and measured is not None and (not measured_once or (
                    time.monotonic() - last >= REPUBLISH_MIN_S and worth_publishing(self._published_mbps, measured))):
                log.info("measured bandwidth %s Mbit/s (published %s): updating the record",
                         measured, self._published_mbps)
                self._contribute_record(measured)
                await asyncio.to_thread(self._save_bandwidth, measured)
                measured_once, last = True, time.monotonic()
            await asyncio.sleep(BANDWIDTH_CHECK_S)

    # ---- what wakes the main loop
    async def _watch_tasks(self) -> None:
        """Wake the main loop on every task event (and after a reconnect, which may have lost some)."""
        while True:
            try:
                async for event in self.ledger.subscribe("tasks"):
                    key = event.get("task_id") if isinstance(event, dict) else None
                    if event is RESYNC:
                        for changed in self._task_changed.values():
                            changed.set()
                    elif key in self._task_changed:
                        self._task_changed[key].set()
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
            stream = self.ledger.subscribe("newHeads")
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

    async def _tick(self) -> None:
        me = self.node.peer_id
        tasks = await self.ledger.call("dkb_listTasks", None, None, 200)
        self.node.artifacts.quota.set_task_pins(task_pins(tasks, me))   # kept from eviction (node/artifacts/quota.py)
        now = ledger_time(tasks)
        self._due_ms = None
        self._heads_wanted.clear()
        business: set[str] = set()   # crews, owners, verifiers and referees of our open tasks (ADR 0186)
        for task in reversed(tasks):  # oldest first
            key, status = task["task_id"], task["status"]
            slots = task.get("slots") or []
            parties = [v.get("verifier") for slot in slots for v in slot.get("verifiers") or []] + \
                [r.get("referee") for slot in slots for r in slot.get("referees") or []]
            involved = me in task["workers"] or me in parties
            if (involved or task.get("owner") == me) and status in (*TRAINING, *AUDITABLE):
                business.update(p for p in (*task["workers"], *parties, task.get("owner")) if isinstance(p, str))
            if me in task["workers"]:
                job = self.jobs.get(key)
                rejected = me in (task.get("rejections") or {})
                refusal = PAUSED_REASON if self.paused else self.limits.refusal(task)
                if status in TRAINING and me not in task["commits"] and not rejected and job is None and refusal:
                    self.board.start(key, workers=task["workers"])   # once: the job now exists
                    self._spawn(self._reject(key, bytes.fromhex(key), refusal))
                elif status in TRAINING and me not in task["commits"] and not rejected and job is None and self._idle():
                    self._busy = self._spawn(self._run_job(task))
                elif status in TRAINING and (rejected or job is not None and job["state"] in ENDED):
                    # a worker never committed: finalize once the commit deadline has passed
                    self._finalize_at.setdefault(key, int(task.get("commit_deadline") or 0) + 1)
                    await self._finalize(key, now)
                    self._due_at(self._finalize_at[key])
                elif status in LEDGER_FINAL and job is not None and job["state"] not in ENDED:
                    self._stop_job(key, task)
                elif crew_exit(task, me) and job is not None and job["state"] not in ENDED:   # ADR 0203
                    self._stop_job(key, {**task, "status": "closed to this worker", "reason": crew_exit(task, me)})
            if status in AUDITABLE and (self.config["audit"] or me in task["workers"]):
                for duty in duties_for(task, me, now + 1):
                    if duty.key not in self._duties_started:
                        self._duties_started.add(duty.key)
                        self._spawn(self._perform(duty, task))
            if status in AUDITABLE and involved:
                pending = [slot for slot in slots if slot.get("outcome") == "pending"]
                if not pending and (status == "verified" or now >= task["window_end"]):
                    self._finalize_at.pop(key, None)   # due now: no need to wait for the retry time
                    await self._finalize(key, now)
                deadlines = [d for slot in pending for d in _slot_deadlines(slot)]
                self._due_at(min([*deadlines, task["window_end"], self._finalize_at.get(key, task["window_end"])]))
        # reserved artifact upload slots and serving capacity for them (node/admission.py)
        self.node.host.classes.set_tag("compute-business", PeerClass.BUSINESS, business - {me})

    def _due_at(self, time_ms: int) -> None:
        self._due_ms = time_ms if self._due_ms is None else min(self._due_ms, time_ms)
        self._heads_wanted.set()

    def _stop_job(self, key: str, task: dict) -> None:
        """Stop our training job for a task the ledger has ended (it can take no commitment any more)."""
        if self._busy is not None and not self._busy.done():
            self._busy.cancel()
        reason = task.get("reason") or ""
        # a task its crew rejected (while this node was still checking it) ends "rejected" here too
        state = "rejected" if task["status"] == "rejected" else "failed"
        self.board.update(key, state=state, finished_at=time.time(),
                          error=f"the ledger ended the task: {task['status']}" + (f" ({reason})" if reason else ""))
        self.tasks_done.inc(outcome=state)
        log.warning("stopped task %s: the ledger says it is %s", key, task["status"])

    def _idle(self) -> bool:
        return self._busy is None or self._busy.done()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: self._wake.set())  # a job or audit ended: look again
        return task

    async def _finalize(self, key: str, now: int) -> None:
        """Send finalize for `key`, at most once per FINALIZE_RETRY_MS of block time (the ledger refuses
        it while commits or audits may still come, and only one finalize per task succeeds)."""
        if now < self._finalize_at.get(key, 0):
            return
        self._finalize_at[key] = now + FINALIZE_RETRY_MS
        try:
            await self.ledger.send("finalize", {"task_id": bytes.fromhex(key)})
            log.info("finalized task %s", key)
        except TxFailed as exc:  # another node finalized first, or it is too early
            log.info("finalize %s not applied: %s", key, exc)

    # ---- training our share
    async def _learn_addresses(self, peers: list[str]) -> None:
        for peer in peers:
            info = await self.ledger.call("dkb_getNode", peer)
            # direct addresses first; relayed ones let NAT'd workers be reached through their relays
            addrs = (info.get("listen_addrs") or []) + (info.get("relay_addrs") or []) if info else []
            if addrs:
                self._add_addrs(peer, addrs)

    def _add_addrs(self, peer: str, addrs: list[str]) -> None:
        try:
            self.node.host.peerbook.add_addrs(peer, addrs)
        except (ValueError, ProtocolError) as exc:
            log.warning("bad addresses for %s: %s", peer, exc)

    async def _fetch_task_inputs(self, key: str | None, task: dict, spec, peers: list[str]) -> dict[str, Path]:
        """The task's input artifacts as local files, fetched (when not held) from the task's
        sources and `peers` (co-workers or committed workers, which serve what they fetched)."""
        ids = artifact_ids(spec)
        if not ids:
            return {}
        me = self.node.peer_id
        sources = {peer: addrs for peer, addrs in source_peers(task.get("sources") or []).items() if peer != me}
        for peer, addrs in sources.items():
            self._add_addrs(peer, addrs)
        others = [p for p in peers if p != me and p not in sources]
        await self._learn_addresses(others)
        progress = None
        if key is not None:
            self.board.update(key, state="fetching inputs", fetched_bytes=0, fetch_total=0)

            def progress(done: int, total: int) -> None:
                self.board.update(key, fetched_bytes=done, fetch_total=total)

        return await fetch_inputs(self.node.artifacts, ids, [*sources, *others], progress, self._meter())

    def _device_for(self, task: dict, spec) -> str:
        """The device to train on: the one the ledger assigned the task to (`device`: cpu or cuda),
        else the spec's; "any" takes CUDA when this node has it. Untrainable when CUDA is wanted
        and this node has none."""
        wanted = str(task.get("device") or getattr(spec, "device", "cpu"))
        has_cuda = bool((self.hardware or {}).get("cuda_devices"))
        if wanted == "any":
            return "cuda" if has_cuda else "cpu"
        if wanted not in ("cpu", "cuda"):
            raise Untrainable(f"unknown device {wanted[:32]!r}")
        if wanted == "cuda" and not has_cuda:
            raise Untrainable("the task needs a CUDA device and this node has none")
        return wanted

    async def _replay_device(self, task: dict) -> str | None:
        """The device to replay `task` on (the one its workers trained on), or None when this node
        cannot reproduce their bits: a CUDA task needs CUDA here and the same GPU model as every
        committed worker (docs/adr/0150)."""
        device = task.get("device") or "cpu"
        if device != "cuda":
            return "cpu"
        mine = (self.hardware or {}).get("gpu") or ""
        if not (self.hardware or {}).get("cuda_devices") or not mine:
            return None
        for worker in task["commits"]:
            info = await self.ledger.call("dkb_getNode", worker)
            if not isinstance(info, dict) or (info.get("hardware") or {}).get("gpu") != mine:
                return None
        return "cuda"

    async def _reject(self, key: str, task_id: bytes, reason: str) -> None:
        """Tell the ledger we cannot train this task (no retry: the job stays "rejected")."""
        reason = (reason.strip() or "untrainable")[:MAX_REASON_CHARS]
        self.board.update(key, state="rejecting", reason=reason)
        try:
            receipt = await self.ledger.send("reject_task", {"task_id": task_id, "reason": reason})
            self.board.update(key, state="rejected", reject_height=receipt.get("height"), finished_at=time.time())
            self.tasks_done.inc(outcome="rejected")
            log.warning("rejected task %s: %s", key, reason)
        except (TxFailed, LedgerUnavailable) as exc:
            with contextlib.suppress(LedgerUnavailable):  # the others' rejections may have ended it already
                task = await self.ledger.call("dkb_getTask", key)
                if isinstance(task, dict) and task.get("status") == "rejected":
                    self.board.update(key, state="rejected", finished_at=time.time())
                    self.tasks_done.inc(outcome="rejected")
                    log.warning("task %s rejected by the other workers: %s", key, reason)
                    return
            self.board.update(key, state="failed", error=f"untrainable ({reason}); reject_task failed: {exc}")
            self.tasks_done.inc(outcome="failed")
            log.warning("task %s is untrainable (%s) and reject_task failed: %s", key, reason, exc)

    async def _run_job(self, task: dict) -> None:
        key, me = task["task_id"], self.node.peer_id
        task_id = bytes.fromhex(key)
        self.board.start(key, workers=task["workers"])
        try:
            spec = train_spec_for_task(task["spec"])
            check_segments(task, spec)
        except InvalidTask as exc:
            await self._reject(key, task_id, f"invalid task: {exc}")
            return
        others = [w for w in task["workers"] if w != me]
        fault = self.config["fault_inject"]
        group = None
        try:
            device = self._device_for(task, spec)
            if getattr(spec, "device", device) != device:
                spec = dataclasses.replace(spec, device=device)
            self.board.update(key, spec=spec.to_dict(), steps=spec.steps, device=device)
            files = await self._fetch_task_inputs(key, task, spec, task["workers"])
            self.board.update(key, state="dry run")
            await asyncio.to_thread(dry_run, spec, files, len(task["workers"]))
            await self._learn_addresses(others)
            group = make_group(spec, self.transport, me, task["workers"], task_id, self.config["allreduce_mode"])
            await group.start()
            feed = ProgressFeed()
            feed.subscribe(lambda p: self._on_progress(key, p))
            group.round_observer = lambda seconds, result: self.round_seconds.observe(seconds)
            trainer = await asyncio.to_thread(prepare_trainer, spec, group, me, task["workers"], feed, files,
                                              ArtifactSink(self.node.artifacts), fault)
            self._ready_groups.add(task_id)
            self.board.update(key, state="waiting for workers")
            await ready_protocol.wait_until_ready(self.node.host, others, task_id, ready_timeout(files))
            self.board.update(key, state="training")
            async def keep(records: dict) -> None:   # an epoch's records, served to its verifiers (ADR 0203)
                await asyncio.to_thread(self._save_result, key, records)
                self._leaves.pop(key, None)
            committer = EpochCommitter(task, task_id, me, trainer.recorder, self.ledger.send, keep)
            summary = await committer.alongside(train_to_end(trainer))
            self._record_allreduce_rate(group)
            weights = await self._keep_weights(trainer)
            records, leaf_worker = trainer.recorder.records, me
            if fault == "wrong_segments":
                records = falsify_records(records)
            elif fault == "copycat":
                records, leaf_worker = await self._copy_records(task_id, me)
            leaf_list = leaves(task_id, leaf_worker, records)
            self._leaves[key] = leaf_list
            commitment = Commitment(root(leaf_list), bytes.fromhex(weights), len(records))
            await asyncio.to_thread(self._save_result, key, {  # a long job's records are megabytes of JSON
                                    "records": [r.to_obj() for r in records], "leaf_worker": leaf_worker,
                                    "segments_root": commitment.segments_root.hex(),
                                    "params_hash": summary["params_hash"], "weights": weights,
                                    "short_rounds": summary["short_rounds"],
                                    "metrics": summary["metrics"], "bytes_sent": summary["bytes_sent"]})
            self.board.update(key, state="committing", step=summary["steps"], bytes_sent=summary["bytes_sent"],
                              metrics=summary["metrics"], result=weights,
                              departures=departures(summary["short_rounds"], task["workers"]))
            receipt = await self.ledger.send("commit_result", commitment.payload(task_id))
            self.board.update(key, state="committed", commit_height=receipt["height"], finished_at=time.time())
            self.tasks_done.inc(outcome="committed")
            log.info("committed task %s", key, extra={"metrics": summary["metrics"], "weights": weights})
        except asyncio.CancelledError:
            raise
        except Untrainable as exc:
            await self._reject(key, task_id, f"Untrainable: {exc.reason}")
        except Exception as exc:  # a failed job must not stop the node; it shows in /status
            self.board.update(key, state="failed", error=f"{type(exc).__name__}: {exc}")
            self.tasks_done.inc(outcome="failed")
            log.warning("task %s failed: %s", key, exc)
        finally:
            if group is not None:
                self._spawn(self._close_after_peers(task_id, group))

    async def _copy_records(self, task_id: bytes, me: str) -> tuple[list[SegmentRecord], str]:
        """fault_inject=copycat (testing only): another worker's records and its id, once it committed;
        we then commit its segments_root as ours."""
        key, deadline = task_id.hex(), time.monotonic() + COPYCAT_WAIT_S
        while time.monotonic() < deadline:
            task = await self.ledger.call("dkb_getTask", key)
            others = sorted(w for w in (task or {}).get("commits", {}) if w != me)
            if others:
                victim, count = others[0], task["commits"][others[0]][2]
                await self._learn_addresses([victim])
                answers = [await segments_protocol.fetch_record(self.node.host, victim, task_id, i)
                           for i in range(count)]
                return [a.record for a in answers], victim
            await asyncio.sleep(1.0)
        raise RuntimeError("copycat: no other worker committed in time")

    async def _keep_weights(self, trainer) -> str:
        """Add the trained weights to the node's artifacts (served from then on); their id."""
        return await self.node.artifacts.add_bytes(await asyncio.to_thread(trainer.weights_bytes))

    def _record_allreduce_rate(self, group) -> None:
        """This node's upload rate as the all-reduce measured it (bytes/s) into the bandwidth meter."""
        meter = self._meter()
        rate = group.upload_rates.get(self.node.peer_id, 0.0)
        if meter is not None and rate > 0:
            meter.record_rate("up", rate * 8 / 1e6)

    async def _close_after_peers(self, task_id: bytes, group) -> None:
        """Keep serving the group until every worker committed (or LINGER_S), then close it."""
        key = task_id.hex()
        deadline = time.monotonic() + LINGER_S
        changed = self._task_changed[key] = asyncio.Event()
        try:
            while time.monotonic() < deadline:
                changed.clear()
                try:
                    task = await self.ledger.call("dkb_getTask", key)
                    if task is None or task["status"] not in TRAINING:
                        break
                except LedgerUnavailable:
                    pass
                with contextlib.suppress(asyncio.TimeoutError):  # until the task's next event
                    await asyncio.wait_for(changed.wait(), max(0.0, min(FALLBACK_POLL_S, deadline - time.monotonic())))
        finally:
            self._task_changed.pop(key, None)
            self._ready_groups.discard(task_id)
            await group.close()

    # ---- verification duties: audits, disputes, referee votes (docs/adr/0168, 0175)
    async def _perform(self, duty: Duty, task: dict) -> None:
        """Send what `duty` asks of this node; a failure is logged and the duty retried at the next
        look (while its deadline allows)."""
        key, task_id = duty.task_id, bytes.fromhex(duty.task_id)
        try:
            if duty.kind == DISPUTE:
                await self.ledger.send("dispute", {"task_id": task_id, "slot": duty.slot})
                log.warning("task %s: a verifier says our segment %d mismatches; disputed (slot %d)",
                            key, duty.segment, duty.slot)
                return
            async with self._judging:   # one replay at a time: they compete for the same cores
                judgement = self.sealed.recall(duty) or await self._judge(duty, task)
            if judgement is None:
                return
            if duty.kind == REVEAL:
                await self.ledger.send("audit_result", self.sealed.reveal_payload(task_id, duty.slot, judgement))
                return
            if judgement.evidence == unavailable_evidence(duty.salt) and await self._too_early_to_give_up(duty):
                log.info("%s of task %s slot %d: %s; trying again later", duty.kind, key, duty.slot, judgement.reason)
                self._duties_started.discard(duty.key)
                return
            if duty.kind == AUDIT:
                await self.ledger.send("audit_commit", self.sealed.commit_payload(task_id, duty.slot, judgement))
                self.audits_sent.inc(verdict="match" if judgement.match else "mismatch")
            else:
                await self.ledger.send("referee_vote", judgement.vote_payload(task_id, duty.slot))
            self.audits.setdefault(key, []).append({
                "kind": duty.kind, "slot": duty.slot, "worker": duty.worker, "segment": duty.segment,
                "match": judgement.match, "step": judgement.step, "reason": judgement.reason})
            log.info("%s of task %s slot %d (%s, segment %d): %s (%s)", duty.kind, key, duty.slot, duty.worker[:16],
                     duty.segment, "match" if judgement.match else "MISMATCH", judgement.reason)
        except asyncio.CancelledError:
            raise
        except (TxFailed, LedgerUnavailable) as exc:
            log.warning("%s of task %s slot %d not applied: %s", duty.kind, key, duty.slot, exc)
            self._duties_started.discard(duty.key)
        except Exception as exc:  # a failed replay must not stop the node; retried at the next look
            self.last_error = f"{duty.kind} of {key} slot {duty.slot}: {type(exc).__name__}: {exc}"
            log.warning("%s", self.last_error)
            self._duties_started.discard(duty.key)

    async def _too_early_to_give_up(self, duty: Duty) -> bool:
        """Whether a judge that could not get the worker's record or state files should try again
        rather than answer "unavailable" (a mismatch): until the last UNAVAILABLE_FRACTION of its
        answer window, so a passing network fault on either side does not accuse an honest worker."""
        if not duty.deadline:
            return False
        task = await self.ledger.call("dkb_getTask", duty.task_id)
        now = ledger_time([task] if isinstance(task, dict) else [])
        window = max(1, duty.deadline - self._first_seen.setdefault(duty.key, now))
        return now < duty.deadline - window * UNAVAILABLE_FRACTION

    async def _judge(self, duty: Duty, task: dict) -> Judgement | None:
        """Replay the slot's segment (or answer as the configured adversary, in tests)."""
        device = await self._replay_device(task)
        if device is None:
            log.warning("cannot judge task %s: it trained on %s, which this node cannot replay bit for bit",
                        duty.task_id, task.get("device"))
            return None
        spec = train_spec_for_task(task["spec"])
        if spec.device != device:
            spec = dataclasses.replace(spec, device=device)
        committed = sorted(task["commits"])
        await self._learn_addresses(committed)
        files = await self._fetch_task_inputs(None, task, spec, committed)
        task_id = bytes.fromhex(duty.task_id)

        async def record(worker: str, index: int) -> segments_protocol.SegmentAnswer:
            for attempt in range(FETCH_ATTEMPTS):
                try:
                    return await segments_protocol.fetch_record(self.node.host, worker, task_id, index)
                except segments_protocol.SegmentsError:
                    if attempt == FETCH_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(1.0)
            raise AssertionError("unreachable")

        async def artifact(artifact_id: str, holders: list[str]) -> Path:
            return await self.node.artifacts.fetch(artifact_id, holders)

        mode = self.config["fault_inject"] if self.config["fault_inject"] in VERIFIER_FAULTS else ""
        return await judge_as(mode, task, spec, duty.worker, duty.segment, duty.salt, Sources(record, artifact, files))


def ledger_time(tasks: list[dict]) -> int:
    """The ledger's time as its task documents carry it (``block_time_ms``: the last block's time, which
    task deadlines are measured against, docs/adr/0187); 0 when none says."""
    return max((t["block_time_ms"] for t in tasks if isinstance(t.get("block_time_ms"), int)), default=0)


def _slot_deadlines(slot: dict) -> list[int]:
    """The block times at which a pending slot moves on (answers, dispute, referee votes due)."""
    out = [v["deadline"] for v in slot.get("verifiers") or [] if isinstance(v.get("deadline"), int)]
    out += [slot[name] + 1 for name in ("dispute_deadline", "referee_deadline", "reveal_deadline") if slot.get(name)]
    return [d + 1 for d in out]


def ready_timeout(files: dict[str, Path]) -> float:
    """How long to wait for the co-workers at the start barrier: READY_TIMEOUT_S, plus the time a
    co-worker on a slow link (READY_MIN_FETCH_RATE) needs to fetch the task's inputs first."""
    size = sum(path.stat().st_size for path in files.values())
    return READY_TIMEOUT_S + size / READY_MIN_FETCH_RATE


def hardware_record(detected: dict, bandwidth_mbps: int) -> dict:
    """The record's hardware map: the fields the ledger's schema has (`consensus.tx.HARDWARE`),
    from what this node detected and measured (integers: the ledger has no floats)."""
    values = {"cpu_cores": min(os.cpu_count() or 1, MAX_CPU_CORES), "ram_mb": _ram_mb(),
              "gpu": str(detected.get("gpu") or "")[:64], "gpu_mem_mb": int(detected.get("gpu_mem_mb") or 0),
              "gpu_tflops": round(float(detected.get("gpu_tflops") or 0)),
              "cuda_devices": int(detected.get("cuda_devices") or 0),
              "bandwidth_mbps": max(0, min(int(bandwidth_mbps), 10**6)),
              "profiles": [str(p) for p in detected.get("profiles") or []][:MAX_PROFILES]}   # ADR 0166
    return {name: values[name] for name in HARDWARE if name in values}   # optional fields left out


def _ram_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 0
