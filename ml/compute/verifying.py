"""This node's verification duties (docs/adr/0168, 0175): for each task it is party to, the audit
answers, disputes and referee votes it still owes (ml/compute/duties.py), each performed once (retried
at a later look when it failed and its deadline allows): judge the slot by replaying the worker's
segment (ml/compute/verification_flow.py; one replay at a time), then send audit_commit (the answer
sealed; revealed with audit_result once the slot's reveals open, ml/compute/sealed_answers.py, docs/adr/0202),
referee_commit (the vote sealed; revealed with referee_vote, docs/adr/0210) or dispute. A judge that
cannot get the worker's record or state files tries again until the last UNAVAILABLE_FRACTION of its
answer window before it answers "unavailable"."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from consensus.task_info import TaskInfo
from ml.compute import availability_duty, segments_protocol
from ml.compute.duties import AUDIT, DISPUTE, REFEREE_REVEAL, REVEAL, Duty, duties_for, referee_panel
from ml.compute.fault_seam import FaultInjection
from ml.compute.membership import Membership
from ml.compute.peer_fetch import PeerFetch
from ml.compute.sealed_answers import SealedAnswers
from ml.compute.task_spec import train_spec_for_task
from ml.compute.verification_flow import Judgement, Sources, judge_as, unavailable_evidence
from node.ledger import LedgerGateway, LedgerUnavailable, TxFailed

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 3
FAILED_RETRY_S = 5.0   # a duty that raised is started again after this (not at the next look: every block)
UNAVAILABLE_FRACTION = 0.25  # a judge answers "unavailable" only in the last quarter of its answer window


class VerificationDuties:
    """Audits, disputes and referee votes this node owes, performed in the background."""

    def __init__(self, node: Any, ledger: LedgerGateway, fetch: PeerFetch, membership: Membership,
                 faults: FaultInjection, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
                 on_error: Callable[[str], None]) -> None:
        self.node = node
        self.ledger = ledger
        self.fetch = fetch
        self.membership = membership
        self.faults = faults
        self.spawn = spawn
        self.on_error = on_error            # a failed duty's message (the role's last_error)
        self.audits: dict[str, list[dict[str, Any]]] = {}   # task id hex -> audit answers and referee votes sent
        self.started: set[tuple[str, str, int]] = set()      # Duty.key of those sent or under way
        self.first_seen: dict[tuple[str, str, int], int] = {}   # Duty.key -> block time it was first looked at
        self._judging = asyncio.Lock()
        self.sealed = SealedAnswers(node.identity)   # audit answers committed, then revealed (ADR 0202)
        self.reasks = availability_duty.Reasks()      # slots the ledger asked us again (ADR 0207)
        self.audits_sent = node.metrics.counter("dekube_compute_audits_total", "Audit results submitted, by verdict.",
                                                ["verdict"])

    def start_owed(self, task: TaskInfo, now_ms: int) -> None:
        """Start every duty this node owes `task` at block time `now_ms` and has not started yet; a slot
        the ledger asked us again after an availability response (docs/adr/0207) is judged afresh."""
        for task_hex, slot_index in self.reasks.forget(task, self.node.peer_id):
            for duty_key in availability_duty.keys(task_hex, slot_index):
                self.started.discard(duty_key)
                self.first_seen.pop(duty_key, None)
            self.sealed.forget(task_hex, slot_index)
        for duty in duties_for(task, self.node.peer_id, now_ms):
            if duty.key not in self.started:
                self.started.add(duty.key)
                self.spawn(self.perform(duty, task))

    async def perform(self, duty: Duty, task: TaskInfo) -> None:
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
                judgement = self.sealed.recall(duty) or await self.judge(duty, task)
            if judgement is None:
                return
            if duty.kind == REVEAL:
                await self.ledger.send("audit_result", self.sealed.reveal_payload(task_id, duty.slot, judgement))
                return
            if duty.kind == REFEREE_REVEAL:
                await self.ledger.send("referee_vote", self.sealed.vote_reveal_payload(task_id, duty.slot, judgement))
                return
            if judgement.evidence == unavailable_evidence(duty.salt) and await self._too_early_to_give_up(duty):
                log.info("%s of task %s slot %d: %s; trying again later", duty.kind, key, duty.slot, judgement.reason)
                self.started.discard(duty.key)
                return
            if duty.kind == AUDIT:
                await self.ledger.send("audit_commit", self.sealed.commit_payload(task_id, duty.slot, judgement))
                self.audits_sent.inc(verdict="match" if judgement.match else "mismatch")
            else:   # a referee's vote, sealed: revealed once every referee of the slot committed (ADR 0210)
                await self.ledger.send("referee_commit", self.sealed.vote_commit_payload(
                    task_id, duty.slot, referee_panel(task, duty.slot, self.node.peer_id), judgement))
            self.audits.setdefault(key, []).append({
                "kind": duty.kind, "slot": duty.slot, "worker": duty.worker, "segment": duty.segment,
                "match": judgement.match, "step": judgement.step, "reason": judgement.reason})
            log.info("%s of task %s slot %d (%s, segment %d): %s (%s)", duty.kind, key, duty.slot, duty.worker[:16],
                     duty.segment, "match" if judgement.match else "MISMATCH", judgement.reason)
        except asyncio.CancelledError:
            raise
        except (TxFailed, LedgerUnavailable) as exc:
            log.warning("%s of task %s slot %d not applied: %s", duty.kind, key, duty.slot, exc)
            self.started.discard(duty.key)
        except Exception as exc:  # a failed replay must not stop the node; retried at a later look
            message = f"{duty.kind} of {key} slot {duty.slot}: {type(exc).__name__}: {exc}"
            log.warning("%s; trying again in %g s", message, FAILED_RETRY_S)
            self.on_error(message)
            self.spawn(self._retry_later(duty.key))

    async def _retry_later(self, duty_key: tuple[str, str, int]) -> None:
        """Let a duty that failed be started again after FAILED_RETRY_S (not at once: looks come with every
        block, and a failure that repeats would replay in a loop)."""
        await asyncio.sleep(FAILED_RETRY_S)
        self.started.discard(duty_key)

    async def _too_early_to_give_up(self, duty: Duty) -> bool:
        """Whether a judge that could not get the worker's record or state files should try again
        rather than answer "unavailable" (a mismatch): until the last UNAVAILABLE_FRACTION of its
        answer window, so a passing network fault on either side does not accuse an honest worker."""
        if not duty.deadline:
            return False
        doc = await self.ledger.call("dkb_getTask", duty.task_id)
        now = TaskInfo.from_json(doc).block_time_ms if doc is not None else 0
        window = max(1, duty.deadline - self.first_seen.setdefault(duty.key, now))
        return now < duty.deadline - window * UNAVAILABLE_FRACTION

    async def judge(self, duty: Duty, task: TaskInfo) -> Judgement | None:
        """Replay the slot's segment (or answer as the configured adversary, in tests)."""
        device = await self.replay_device(task)
        if device is None:
            log.warning("cannot judge task %s: it trained on %s, which this node cannot replay bit for bit",
                        duty.task_id, task.device)
            return None
        spec = train_spec_for_task(dict(task.spec))
        if spec.device != device:
            spec = dataclasses.replace(spec, device=device)
        committed = task.committers
        await self.fetch.learn_addresses(committed)
        files = await self.fetch.task_inputs(None, task, spec, committed)
        task_id = bytes.fromhex(duty.task_id)

        async def record(worker: str, index: int, segments: int) -> segments_protocol.SegmentAnswer:
            for attempt in range(FETCH_ATTEMPTS):
                try:
                    answer: segments_protocol.SegmentAnswer = await segments_protocol.fetch_record(
                        self.node.host, worker, task_id, index, segments)
                    return answer
                except segments_protocol.SegmentsError:
                    if attempt == FETCH_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(1.0)
            raise AssertionError("unreachable")

        async def artifact(artifact_id: str, holders: list[str]) -> Path:
            path: Path = await self.node.artifacts.fetch(artifact_id, holders)
            return path

        slot = task.slots[duty.slot] if duty.slot < len(task.slots) else None
        commit = task.slot_commit(slot) if slot is not None and slot.worker == duty.worker else None
        return await judge_as(self.faults.verifier_mode, task, spec, duty.worker, duty.segment, duty.salt,
                              Sources(record, artifact, files), commit)

    async def replay_device(self, task: TaskInfo) -> str | None:
        """The device to replay `task` on (the one its workers trained on), or None when this node
        cannot reproduce their bits: a CUDA task needs CUDA here and the same GPU model as every
        committed worker (docs/adr/0150)."""
        if (task.device or "cpu") != "cuda":
            return "cpu"
        mine = self.membership.gpu()
        if not self.membership.has_cuda() or not mine:
            return None
        for worker in task.committers:
            info = await self.ledger.call("dkb_getNode", worker)
            if not isinstance(info, dict) or (info.get("hardware") or {}).get("gpu") != mine:
                return None
        return "cuda"
