"""Training this node's share of an assigned task: check the spec (an invalid or untrainable task is
rejected with its reason, reject_task), fetch the inputs, dry-run one step, start the all-reduce group
with the co-workers, wait for them at the ready barrier, train to the end, keep the final weights as an
artifact (served from then on, docs/adr/0157), save the segment records and commit the result
(commit_result, with its co-workers' uploads as its probes measured them: docs/adr/0219); a task cut
into epochs gets a progress commitment per epoch while it trains (ml/compute/epoch_commits.py,
docs/adr/0203). The group keeps serving until every worker committed (or LINGER_S). A job whose task
the ledger ended meanwhile is stopped. Progress goes on the job board (`/status`, dkb_taskProgress,
the progress protocol)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from consensus.task_info import TaskInfo, TaskStatus
from consensus.tx import MAX_BANDWIDTH_MBPS
from ml.compute import ready_protocol
from ml.compute.commitment import Commitment
from ml.compute.crew_changes import CrewGate, group_of, joining_state, start_from
from ml.compute.epoch_commits import EpochCommitter
from ml.compute.executor import grow_crew, make_group, prepare_trainer
from ml.compute.fault_seam import FaultInjection
from ml.compute.held_states import HeldStates
from ml.compute.job_board import TERMINAL, JobBoard, JobState
from ml.compute.limits import LimitsControl
from ml.compute.membership import Membership
from ml.compute.peer_fetch import PeerFetch
from ml.compute.progress_history import record_point
from ml.compute.relay_meter import commit_report
from ml.compute.results import ResultStore
from ml.compute.segment_record import leaves, root
from ml.compute.task_spec import InvalidTask, check_segments, train_spec_for_task
from ml.job.participation import InconsistentRecord, departures
from ml.job.runner import train_to_end
from ml.train.dry_run import Untrainable, dry_run
from ml.train.progress import ProgressFeed
from ml.train.segments import ArtifactSink
from node.bandwidth import MEASURE_BUDGET_S
from node.ledger import LedgerGateway, LedgerUnavailable, TxFailed

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
JOINER_WAITS_FOR_HOLDER = "waiting for a holder of the crew's state"   # a joiner's job state (docs/adr/0232)
READY_MIN_FETCH_RATE = 1 << 20   # bytes/s: co-workers fetching the inputs this slowly are still waited for
LINGER_S = 60.0          # keep a finished group serving while peers may still finish the last round
RATES_WAIT_S = 1.0       # the commit waits at least this for co-worker probes still running (taken while training)
CLOSE_POLL_S = 30.0      # while lingering, a look at the task even without an event
MAX_REASON_CHARS = 500   # reject_task's reason (the ledger's bound)
PAUSED_REASON = "paused by its provider"


class Training:
    """Runs one training job at a time (the ledger assigns at most `max_tasks_per_worker` each)."""

    def __init__(self, node: Any, ledger: LedgerGateway, config: Any, board: JobBoard, results: ResultStore,
                 fetch: PeerFetch, membership: Membership, faults: FaultInjection, transport: Any,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]], limits: LimitsControl) -> None:
        self.node = node
        self.limits = limits                     # the provider's (memory is checked after the dry run)
        self.ledger = ledger
        self.config = config
        self.board = board
        self.results = results
        self.fetch = fetch
        self.membership = membership
        self.faults = faults
        self.transport = transport               # the all-reduce's (HostTransport over the node's Host)
        self.spawn = spawn
        self.busy: asyncio.Task[None] | None = None   # the training job in progress
        self.ready_groups: set[bytes] = set()         # task ids whose group is up (the ready protocol)
        self.groups: dict[str, Any] = {}              # task id hex -> its all-reduce group, while it serves
        self.task_changed: dict[str, asyncio.Event] = {}   # task id hex -> set on its next ledger event
        # where our committed epoch states are served, kept across restarts (docs/adr/0232)
        self.held = HeldStates(None if node.data_dir is None else node.data_dir / "compute")
        self.held.load()
        self._register_metrics(node.metrics)

    def _register_metrics(self, metrics: Any) -> None:
        jobs = self.board.jobs
        self.tasks_done = metrics.counter("dekube_compute_tasks_total", "Task shares finished, by outcome.",
                                          ["outcome"])
        metrics.gauge("dekube_compute_training_step", "Optimizer steps done in the task being trained.").set_function(
            lambda: max((j["step"] for j in jobs.values() if j["state"] == "training"), default=0))
        metrics.counter_function("dekube_compute_allreduce_bytes_sent_total",
                                 "All-reduce bytes sent by this node's task shares.",
                                 lambda: sum(j["bytes_sent"] for j in jobs.values()))
        self.steps = metrics.counter("dekube_compute_steps_total", "Optimizer steps trained, all tasks.")
        self.round_seconds = metrics.histogram("dekube_compute_allreduce_round_seconds",
                                               "Seconds per committed all-reduce round.",
                                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))

    def idle(self) -> bool:
        return self.busy is None or self.busy.done()

    def start(self, task: TaskInfo) -> None:
        self.busy = self.spawn(self.run_job(task))

    def notify(self, key: str | None) -> None:
        """A ledger event for task `key` (None: events may have been lost, so for every task)."""
        for changed_key, changed in self.task_changed.items():
            if key is None or changed_key == key:
                changed.set()

    def on_progress(self, key: str, progress: Any) -> None:
        """Count new steps, keep the job's bounded loss/metric history (served by dkb_taskProgress and
        the progress protocol's first frame) and update the job (which wakes its watchers)."""
        job = self.board.jobs[key]
        self.steps.inc(max(0, progress.step - job.get("history_last_step", 0)))
        job["history_last_step"] = max(progress.step, job.get("history_last_step", 0))
        record_point(job, progress.step, progress.loss, progress.metrics)
        self.board.update(key, step=progress.step, loss=progress.loss, bytes_sent=progress.bytes_sent,
                          participants=progress.participants, compute_s=progress.compute_s,
                          **({"metrics": progress.metrics} if progress.metrics else {}))

    async def run_job(self, task: TaskInfo) -> None:
        key, me = task.task_id, self.node.peer_id
        first = task.first_epoch(me)   # 0, or the epoch this worker joins a running crew at (ADR 0226)
        workers = task.crew_at(first)
        rank, world = task.seat_of(me), task.world_at(first)   # the seats open at its first epoch (ADR 0234)
        task_id = task.task_bytes
        began = time.monotonic()
        mirrored = (self.board.jobs.get(key) or {}).get("epoch_states")   # kept as its verifier (ADR 0236)
        self.board.start(key, workers=workers, **({"epoch_states": dict(mirrored)} if mirrored else {}))
        try:
            spec = train_spec_for_task(dict(task.spec))
            check_segments(task, spec)
        except InvalidTask as exc:
            await self.reject(key, task_id, f"invalid task: {exc}", joiner=bool(first))
            return
        others = [w for w in workers if w != me]
        group: Any = None
        uploads: asyncio.Task[None] | None = None
        meter = getattr(self.transport, "relay_meter", None)   # relayed bytes of this task (ADR 0223)
        try:
            device = self.device_for(task, spec)
            if getattr(spec, "device", device) != device:
                spec = dataclasses.replace(spec, device=device)
            self.board.update(key, spec=spec.to_dict(), steps=spec.steps, device=device)
            files = await self.fetch.task_inputs(key, task, spec, workers)
            self.board.update(key, state="dry run")
            tried = await asyncio.to_thread(dry_run, spec, files, world)
            over = self.limits.memory_refusal(tried["params"])
            if over is not None:
                await self.reject(key, task_id, over, joiner=bool(first))
                return
            await self.fetch.learn_addresses(others)
            group = make_group(spec, self.transport, me, workers, task_id, self.config["allreduce_mode"],
                               self.node.identity)
            await group.start()
            self.groups[key] = group
            feed = ProgressFeed()
            feed.subscribe(lambda p: self.on_progress(key, p))
            group.round_observer = lambda seconds, result: self.round_seconds.observe(seconds)
            trainer = await asyncio.to_thread(prepare_trainer, spec, group, rank, world, feed, files,
                                              self._sink(), self.faults.trainer_mode)
            if task.shards_from(first):   # the crew grew before this worker's first epoch
                grow_crew(trainer, world, spec.first_step_of_segment(task.shards_from(first)))
            if first:
                # its co-workers as the ledger shows them once the state is there: a restart may have named
                # a new crew meanwhile (docs/adr/0232)
                others = await self._start_from_crew_state(key, task, trainer, group, spec, first, began)
                await self.fetch.learn_addresses(others)
            self.ready_groups.add(task_id)
            self.board.update(key, state="waiting for workers")
            await ready_protocol.wait_until_ready(self.node.host, others, task_id, ready_timeout(files))
            self.board.update(key, state="training")
            if meter is not None:
                meter.start(key)
            # co-workers' uploads for commit_result (ADR 0219), probed while we train: off the commit's path
            uploads = asyncio.ensure_future(self._probe_co_workers(others))
            probes_started = time.monotonic()

            async def keep(records: dict[str, Any]) -> None:   # an epoch's records, served to its verifiers (ADR 0203)
                await asyncio.to_thread(self.results.save, key, records)
                self.results.leaves.pop(key, None)
                # and where its state is served, on disk before commit_epoch names it (docs/adr/0232)
                digest = records["records"][-1]["state_out"]
                artifact = trainer.recorder.state_artifacts.get(digest) if trainer.recorder is not None else None
                if artifact:
                    await asyncio.to_thread(self.held.add, key, digest, artifact)
            committer = EpochCommitter(task, task_id, me, trainer.recorder, self.ledger.send, keep)
            committer.on_committed = lambda progress: self._show_epoch_state(key, trainer.recorder, progress)
            if trainer.recorder is not None:   # joiners enter at epoch boundaries (ADR 0226)
                trainer.recorder.before_segment = CrewGate(
                    me, first, committer.per_epoch, committer, lambda: self._read_task(key), group,
                    lambda peers, timeout: ready_protocol.ready_among(self.node.host, peers, task_id, timeout),
                    state_bytes=3 * sum(p.numel() * p.element_size() for p in trainer.params),   # weights, 2 moments
                    reshard=lambda size, segment: grow_crew(trainer, size, spec.first_step_of_segment(segment)),
                    world=world)
            summary = await committer.alongside(train_to_end(trainer))
            self.board.end_training(key, trainer.compute_seconds)
            self._record_allreduce_rate(group)
            weights = await self._keep_weights(trainer)
            if trainer.recorder is None:
                raise RuntimeError("the trainer kept no segment records")
            records, leaf_worker = await self.faults.committed_records(task_id, me, trainer.recorder.records)
            leaf_list = leaves(task_id, leaf_worker, records)
            self.results.leaves[key] = leaf_list
            commitment = Commitment(root(leaf_list), bytes.fromhex(weights), records[-1].index + 1)
            await asyncio.to_thread(self.results.save, key, {  # a long job's records are megabytes of JSON
                                    "records": [r.to_obj() for r in records], "leaf_worker": leaf_worker,
                                    "segments_root": commitment.segments_root.hex(),
                                    "params_hash": summary["params_hash"], "weights": weights,
                                    "short_rounds": summary["short_rounds"],
                                    "metrics": summary["metrics"], "bytes_sent": summary["bytes_sent"]})
            self.board.update(key, state="committing", step=summary["steps"], bytes_sent=summary["bytes_sent"],
                              metrics=summary["metrics"], result=weights,
                              departures=_departures(summary["short_rounds"], workers))
            rates = await self._co_worker_uploads(uploads, others, probes_started)
            counted = meter.take(key) if meter is not None else {}
            if counted:
                self.board.update(key, relay_bytes=counted)   # shown in /status and dkb_computeStatus
            relayed = await self._relay_report(counted)
            receipt = await self.ledger.send("commit_result", {**commitment.payload(task_id), **rates, **relayed})
            self.board.update(key, state=JobState.COMMITTED, commit_height=receipt["height"], finished_at=time.time())
            self.tasks_done.inc(outcome=JobState.COMMITTED)
            log.info("committed task %s", key, extra={"metrics": summary["metrics"], "weights": weights})
        except asyncio.CancelledError:
            raise
        except Untrainable as exc:
            await self.reject(key, task_id, f"Untrainable: {exc.reason}", joiner=bool(first))
        except Exception as exc:  # a failed job must not stop the node; it shows in /status
            self.board.update(key, state=JobState.FAILED, error=f"{type(exc).__name__}: {exc}")
            self.tasks_done.inc(outcome=JobState.FAILED)
            log.warning("task %s failed: %s", key, exc)
        finally:
            if uploads is not None:
                uploads.cancel()
            if meter is not None:
                meter.take(key)   # a job that ended before its commit closes its span too
            if group is not None:
                self.spawn(self._close_after_peers(task_id, group))

    async def _read_task(self, key: str) -> TaskInfo:
        doc = await self.ledger.call("dkb_getTask", key)
        if doc is None:
            raise RuntimeError(f"the ledger does not know task {key}")
        return TaskInfo.from_json(doc)

    async def _start_from_crew_state(self, key: str, task: TaskInfo, trainer: Any, group: Any, spec: Any,
                                     first: int, began: float) -> list[str]:
        """A joiner's trainer starts from the state a member committed for the epoch before its first
        (fetched and checked, ml/compute/crew_changes.py); ``began``: when the job started. The other
        workers of its first epoch, as the ledger shows them then."""
        self.board.update(key, state="fetching the crew's state")
        changed = self.task_changed.setdefault(key, asyncio.Event())

        async def wait_change(timeout: float) -> None:   # an event seen since the last look returns at once
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
            changed.clear()

        started = time.monotonic()
        def no_holder(why: str) -> None:   # every holder of the state is gone for now (docs/adr/0232)
            self.board.update(key, state=JOINER_WAITS_FOR_HOLDER, holder_error=why)

        mirrored = dict(self.board.jobs.get(key, {}).get("epoch_states") or {})   # kept as its verifier (0236)
        state, digest, now = await joining_state(self.node, key, first, lambda: self._read_task(key),
                                                 self.fetch.learn_addresses, wait_change, on_retry=no_holder,
                                                 held=mirrored.get)
        fetched = time.monotonic()
        segment = task.first_segment(self.node.peer_id)
        await asyncio.to_thread(start_from, trainer, state, spec.first_step_of_segment(segment), segment)
        group.set_peers(group_of(now, first))   # the members' group of this epoch, as they will read it
        self.board.update(key, joined_at_epoch=first, joined_from=digest, step=trainer.step,
                          join_timings={"state_wait_and_fetch_s": round(fetched - started, 3),
                                        "load_s": round(time.monotonic() - fetched, 3),
                                        "ready_after_s": round(time.monotonic() - began, 3)})
        log.info("task %s: joined the crew at epoch %d from state %s", key, first + 1, digest[:16])
        return [w for w in now.crew_at(first) if w != self.node.peer_id]

    def seen(self, task: TaskInfo) -> None:
        """The role saw ``task`` on the ledger: a group of ours takes streams from every worker named to it
        (a joiner may send before this worker reached the round it enters at)."""
        group = self.groups.get(task.task_id)
        if group is not None:
            group.accept(list(task.workers))

    async def reject(self, key: str, task_id: bytes, reason: str, joiner: bool = False) -> None:
        """Tell the ledger we cannot train this task (no retry: the job stays "rejected"). A worker named to
        a running crew cannot reject it (docs/adr/0226): it stays out, misses its first epoch and its seat
        goes to another node."""
        reason = (reason.strip() or "untrainable")[:MAX_REASON_CHARS]
        if joiner:
            self.board.update(key, state=JobState.FAILED, error=f"not joining the crew: {reason}",
                              finished_at=time.time())
            self.tasks_done.inc(outcome=JobState.FAILED)
            log.warning("not joining task %s: %s", key, reason)
            return
        self.board.update(key, state=JobState.REJECTING, reason=reason)
        try:
            receipt = await self.ledger.send("reject_task", {"task_id": task_id, "reason": reason})
            self.board.update(key, state=JobState.REJECTED, reject_height=receipt.get("height"),
                              finished_at=time.time())
            self.tasks_done.inc(outcome=JobState.REJECTED)
            log.warning("rejected task %s: %s", key, reason)
        except (TxFailed, LedgerUnavailable) as exc:
            with contextlib.suppress(LedgerUnavailable):  # the others' rejections may have ended it already
                doc = await self.ledger.call("dkb_getTask", key)
                if doc is not None and TaskInfo.from_json(doc).status == TaskStatus.REJECTED:
                    self.board.update(key, state=JobState.REJECTED, finished_at=time.time())
                    self.tasks_done.inc(outcome=JobState.REJECTED)
                    log.warning("task %s rejected by the other workers: %s", key, reason)
                    return
            self.board.update(key, state=JobState.FAILED, error=f"untrainable ({reason}); reject_task failed: {exc}")
            self.tasks_done.inc(outcome=JobState.FAILED)
            log.warning("task %s is untrainable (%s) and reject_task failed: %s", key, reason, exc)

    def stop_job(self, task: TaskInfo) -> None:
        """Stop our training job for a task the ledger has ended (it can take no commitment any more)."""
        if self.busy is not None and not self.busy.done():
            self.busy.cancel()
        # a task its crew rejected (while this node was still checking it) ends "rejected" here too
        state = JobState.REJECTED if task.status == TaskStatus.REJECTED else JobState.FAILED
        because = f" ({task.reason})" if task.reason else ""
        self.board.update(task.task_id, state=state, finished_at=time.time(),
                          error=f"the ledger ended the task: {task.status}{because}")
        self.tasks_done.inc(outcome=state)
        log.warning("stopped task %s: the ledger says it is %s", task.task_id, task.status)

    def ended(self, key: str) -> bool:
        """Whether our job for `key` reached a terminal state."""
        job = self.board.jobs.get(key)
        return job is not None and job["state"] in TERMINAL

    def device_for(self, task: TaskInfo, spec: Any) -> str:
        """The device to train on: the one the ledger assigned the task to (`device`: cpu or cuda),
        else the spec's; "any" takes CUDA when this node has it. Untrainable when CUDA is wanted
        and this node has none."""
        wanted = str(task.device or getattr(spec, "device", "cpu"))
        has_cuda = self.membership.has_cuda()
        if wanted == "any":
            return "cuda" if has_cuda else "cpu"
        if wanted not in ("cpu", "cuda"):
            raise Untrainable(f"unknown device {wanted[:32]!r}")
        if wanted == "cuda" and not has_cuda:
            raise Untrainable("the task needs a CUDA device and this node has none")
        return wanted

    async def _keep_weights(self, trainer: Any) -> str:
        """Add the trained weights to the node's artifacts (served from then on); their id."""
        weights_id: str = await self.node.artifacts.add_bytes(await asyncio.to_thread(trainer.weights_bytes))
        return weights_id

    def _sink(self) -> Any:
        """Where the trainer puts its checkpoints and averages: the node's artifacts."""
        sink_type: Any = ArtifactSink   # ml.train.segments is not typed yet
        return sink_type(self.node.artifacts)

    def _show_epoch_state(self, key: str, recorder: Any, progress: Any) -> None:
        """Where the state an epoch commitment names is served (its artifact id, by its digest): the owner's
        `task fetch --epoch N` asks for it over the progress protocol and checks the file (docs/adr/0211)."""
        digest = progress.state_digest.hex()
        artifact = recorder.state_artifacts.get(digest)
        if artifact:
            shown = dict(self.board.jobs.get(key, {}).get("epoch_states") or {})
            self.board.update(key, epoch_states={**shown, digest: artifact})

    def restore(self, task: TaskInfo, me: str) -> dict[str, Any] | None:
        """The job of a task this worker committed epoch states of before the node restarted (None when it
        held none): ended, serving those states to joiners and the owner (docs/adr/0232)."""
        fields = self.held.restored_job(task.task_id, me in task.commits)
        if fields is None:
            return None
        log.info("task %s: serving the epoch states committed before this node restarted", task.task_id)
        return self.board.start(task.task_id, **fields, finished_at=time.time())

    async def _probe_co_workers(self, co_workers: list[str]) -> None:
        """Probe the co-workers' uploads (the bandwidth service probes those it has no fresh figure for),
        while this worker trains; `_co_worker_uploads` reads what it found at commit."""
        service = self.membership.bandwidth_service()
        if service is not None and co_workers:
            await service.measure_peers(co_workers)

    async def _co_worker_uploads(self, probing: asyncio.Task[None], co_workers: list[str],
                                 started: float) -> dict[str, dict[str, int]]:
        """commit_result's ``peer_rates``: each co-worker's upload (Mbit/s) as this node's probes measured
        it, which the ledger turns into verified bandwidth once the task is paid (docs/adr/0219). The commit
        waits for probes still running until their budget from ``started`` is spent (a job shorter than
        the probing) or RATES_WAIT_S, whichever is later, then reports the co-workers measured so far;
        {} when none could be measured."""
        await measured_in_time(probing, max(RATES_WAIT_S, started + MEASURE_BUDGET_S - time.monotonic()))
        service = self.membership.bandwidth_service()
        if service is None or not co_workers:
            return {}
        measured = service.uploads_of(co_workers)
        rates = {peer: min(MAX_BANDWIDTH_MBPS, int(mbps)) for peer, mbps in sorted(measured.items()) if mbps >= 1}
        return {"peer_rates": rates} if rates else {}

    async def _relay_report(self, relayed: dict[str, int]) -> dict[str, dict[str, int]]:
        """commit_result's ``relay_bytes`` (docs/adr/0223): what this task's circuits carried per relay,
        for the relays the ledger knows as relays (a lookup that fails leaves that relay out); {} when
        nothing went through a relay."""
        registered = set()
        for relay in relayed:
            try:
                record = await self.ledger.node_info(relay)
            except Exception as exc:  # the figure is informational: it never holds the commit up
                log.info("relay %s not looked up for the relay_bytes report: %s", relay[:16], exc)
                continue
            if record and "relay" in record.get("roles", ()):
                registered.add(relay)
        report = commit_report(relayed, registered)
        return {"relay_bytes": report} if report else {}

    def _record_allreduce_rate(self, group: Any) -> None:
        """This node's upload rate as the all-reduce measured it (bytes/s) into the bandwidth meter."""
        meter = self.membership.meter()
        rate = group.upload_rates.get(self.node.peer_id, 0.0)
        if meter is not None and rate > 0:
            meter.record_rate("up", rate * 8 / 1e6)

    async def _close_after_peers(self, task_id: bytes, group: Any) -> None:
        """Keep serving the group until every worker committed (or LINGER_S), then close it."""
        key = task_id.hex()
        deadline = time.monotonic() + LINGER_S
        changed = self.task_changed[key] = asyncio.Event()
        try:
            while time.monotonic() < deadline:
                changed.clear()
                try:
                    doc = await self.ledger.call("dkb_getTask", key)
                    if doc is None or TaskInfo.from_json(doc).status not in TaskStatus.OPEN_FOR_COMMITS:
                        break
                except LedgerUnavailable:
                    pass
                with contextlib.suppress(asyncio.TimeoutError):  # until the task's next event
                    await asyncio.wait_for(changed.wait(), max(0.0, min(CLOSE_POLL_S, deadline - time.monotonic())))
        finally:
            self.task_changed.pop(key, None)
            self.ready_groups.discard(task_id)
            self.groups.pop(key, None)
            await group.close()


def ready_timeout(files: dict[str, Path]) -> float:
    """How long to wait for the co-workers at the start barrier: READY_TIMEOUT_S, plus the time a
    co-worker on a slow link (READY_MIN_FETCH_RATE) needs to fetch the task's inputs first."""
    size = sum(path.stat().st_size for path in files.values())
    return READY_TIMEOUT_S + size / READY_MIN_FETCH_RATE


async def measured_in_time(probing: asyncio.Task[None], wait_s: float) -> None:
    """Let the co-worker probes started while training run at most ``wait_s`` more, then stop them: a slow
    or unanswering co-worker never holds the commit back longer (a failed probe neither)."""
    done, _ = await asyncio.wait({probing}, timeout=wait_s)
    if not done:
        probing.cancel()
    elif not probing.cancelled() and probing.exception() is not None:
        log.info("co-worker probes failed: %r", probing.exception())


def _departures(short_rounds: list[Any], workers: list[str]) -> dict[str, int]:
    """Who left the rounds, and from which (shown in /status). A crew that changed (a joiner, an extra seat)
    lists workers the first epoch's crew lacks: its record shows no departures rather than failing the job."""
    try:
        return departures(short_rounds, workers)
    except InconsistentRecord:
        return {}
