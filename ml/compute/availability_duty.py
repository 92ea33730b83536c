"""The compute node's side of availability challenges (docs/adr/0207).

When every verifier of one of our audit slots said it could not fetch our record or state, the ledger
challenges the slot (``slot["challenge"]["deadline"]``, consensus/state/availability.py): we answer with
``availability_response``, the Merkle leaf of the audited segment's record and its audit path against
the segments_root we committed, before the deadline, and keep serving the record and the state; the
ledger then asks the verifiers again. ``answer_challenges`` finds our open challenges in a task document
and sends the responses (a node that restarted answers from the records it serves from disk).

A verifier asked again sees its old slot duty come back: ``Reasks`` tells the node which duty keys to
forget (ml/compute/duties.py keys; the ledger keeps each earlier answer in the entry's ``set_aside``),
so it fetches and judges afresh instead of repeating its sealed "unavailable".
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from consensus.task_info import SlotOutcome, TaskInfo
from ml.compute.duties import AUDIT, REVEAL
from ml.compute.segment_record import leaf
from ml.compute.segments_protocol import SegmentAnswer
from node.ledger import LedgerUnavailable, TxFailed

log = logging.getLogger(__name__)

RESPONSE_TX = "availability_response"
MAX_TRACKED = 4096   # slots whose re-asks Reasks remembers (the oldest forgotten first)


@dataclass(frozen=True)
class Challenge:
    task_id: str      # hex
    slot: int
    segment: int
    deadline: int     # last block time (ms) at which the response counts
    segments: int     # the count of the commitment the slot checks (docs/adr/0230)


def challenges_for(task: TaskInfo, me: str, now_ms: int) -> list[Challenge]:
    """The open availability challenges on ``me``'s slots of ``task`` at block time ``now_ms``, in slot order."""
    return [Challenge(task.task_id, slot.slot, slot.segment, slot.challenge_deadline, commit.segments)
            for slot in task.slots
            if slot.outcome == SlotOutcome.PENDING and slot.worker == me and slot.challenge_deadline
            and now_ms <= slot.challenge_deadline and (commit := task.slot_commit(slot)) is not None]


def response_payload(task_id: bytes, slot: int, leaf_worker: str, answer: SegmentAnswer) -> dict:
    """The ``availability_response`` payload proving ``answer``'s record under our segments_root;
    ``leaf_worker`` is the peer ID our leaves were made with."""
    return {"task_id": task_id, "slot": slot, "leaf": leaf(task_id, leaf_worker, answer.record),
            "path": list(answer.proof)}


async def answer_challenges(task: TaskInfo, me: str, now_ms: int, leaf_worker: str,
                            record_for: Callable[[bytes, int, int], SegmentAnswer | None],
                            send: Callable[[str, dict], Awaitable[object]], answered: set[tuple[str, int]]) -> int:
    """Send a response to each open challenge on our slots of ``task`` not in ``answered`` (task hex,
    slot; updated here); ``record_for(task_id, segment, segments)`` is the record we serve with its proof
    under our commitment of ``segments``. A send that fails is left out of ``answered`` and tried again at
    the next look. Returns how many were sent."""
    sent = 0
    for challenge in challenges_for(task, me, now_ms):
        key = (challenge.task_id, challenge.slot)
        if key in answered:
            continue
        task_id = bytes.fromhex(challenge.task_id)
        answer = record_for(task_id, challenge.segment, challenge.segments)
        if answer is None:
            log.error("task %s slot %d: availability challenge on segment %d, but we hold no record of it",
                      challenge.task_id, challenge.slot, challenge.segment)
            continue
        answered.add(key)
        try:
            await send(RESPONSE_TX, response_payload(task_id, challenge.slot, leaf_worker, answer))
        except (TxFailed, LedgerUnavailable) as exc:   # retried at the next look
            answered.discard(key)
            log.warning("task %s slot %d: availability response not applied: %s", challenge.task_id,
                        challenge.slot, exc)
            continue
        log.warning("task %s slot %d: our verifiers could not fetch segment %d; answered the availability "
                    "challenge", challenge.task_id, challenge.slot, challenge.segment)
        sent += 1
    return sent


class Reasks:
    """Which of this node's verifier duties the ledger asked again after an availability response."""

    def __init__(self) -> None:
        self._rounds: dict[tuple[str, int], int] = {}

    def forget(self, task: TaskInfo, me: str) -> list[tuple[str, int]]:
        """(task hex, slot) of each slot where ``me`` was asked again since the last call: the node drops
        the duty keys ``keys(...)`` and the sealed judgement it kept for them."""
        out = []
        for slot in task.slots:
            for seat in slot.verifiers:
                if seat.verifier != me:
                    continue
                key = (task.task_id, slot.slot)
                if seat.rounds > self._rounds.get(key, 0):
                    self._rounds.pop(key, None)
                    self._rounds[key] = seat.rounds
                    out.append(key)
        while len(self._rounds) > MAX_TRACKED:
            del self._rounds[next(iter(self._rounds))]
        return out


def keys(task_id: str, slot: int) -> list[tuple[str, str, int]]:
    """The duty keys (ml/compute/duties.py ``Duty.key``) of a verifier asked again on ``slot``."""
    return [(AUDIT, task_id, slot), (REVEAL, task_id, slot)]
