"""Per-segment records of one worker's training (docs/adr/0167): the state file at each segment start,
the averaged tensors of every all-reduce round in it, and per step the hashes of this worker's own
contribution, of its codec's output and of the average it got back.

`SegmentRecorder` is attached to a trainer (`attach`); the trainer calls `begin`, `gradient`,
`averaged` and `end` around each step. Blobs (state files, averages) go to a `BlobSink` as each
segment ends (the compute role passes the node's artifact store), so a job holds at most one
segment's averages in memory. A recorder without a sink is the replay side: it only hashes (and feeds
the audit evidence).

The codec hash of a step is sha256 over, for each plain averaging round of the step (PowerSGD has two),
the sha256 of the bytes this worker's own compressor produced when the codec keeps worker state
(top-k / sign with error feedback), else the canonical hash of the tensors handed to the group (for
stateless dense codecs the group encodes them in chunks inside the all-reduce, a pure function of
them; for PowerSGD these are the P and Q factors).

The receipts of a step are what the group says this worker received from each other sender in each
round of the step (`Averaged.received`, ml.allreduce.receipts), kept as `WireReceipt`s with the round id.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ml.compute.segment_record import SegmentRecord, StepHashes, WireReceipt
from ml.train.averaging import Averaged
from ml.train.reproducibility import hash_tensors, in_compute_thread
from ml.train.state_file import BadStateFile, read_tensor_file, state_bytes
from node.artifacts.merkle import artifact_id_of_bytes

ROUNDS_KEY = "dekube-rounds"


class BlobSink(Protocol):
    async def put(self, data: bytes) -> str:
        """Store `data`; its artifact id."""
        ...


@dataclass
class MemorySink:
    """Blobs kept in memory by artifact id (tests, simulations)."""
    blobs: dict[str, bytes] = field(default_factory=dict)

    async def put(self, data: bytes) -> str:
        artifact = await asyncio.to_thread(artifact_id_of_bytes, data)
        self.blobs[artifact] = data
        return artifact


class ArtifactSink:
    """Blobs into a node's artifact service (`add_bytes`, async), which serves them from then on."""

    def __init__(self, artifacts):
        self.artifacts = artifacts

    async def put(self, data: bytes) -> str:
        return await self.artifacts.add_bytes(data)


class RecordingAverager:
    """Wraps a trainer's plain averager (the one that talks to the group): keeps the averaged tensors
    of each round for the segment's averages file and the digest of this worker's codec output."""

    def __init__(self, inner):
        self.inner = inner
        self.rounds: list[tuple[int, list[torch.Tensor], list[str]]] = []
        self.codec_digests: list[bytes] = []
        self.receipts: list[WireReceipt] = []
        self.known: tuple[list[torch.Tensor], str] | None = None   # (contribution, its hash) of the step

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        result = await self.inner.average(tensors, round_id)
        encoded = getattr(self.inner, "last_encoded", None)
        known = self.known[1] if encoded is None and self.known is not None and self.known[0] is tensors else None
        digest, kept = await in_compute_thread(_keep_round, encoded, tensors, known, result.tensors)
        self.codec_digests.append(digest)
        self.receipts += [WireReceipt(round_id, r.sender, r.digest, r.start, r.stop, r.chunk, r.signature.hex())
                          for r in getattr(result, "received", ())]
        self.rounds.append((round_id, kept, [str(p) for p in result.participants]))
        return result

    def take_codec(self) -> str:
        digests, self.codec_digests = self.codec_digests, []
        return hashlib.sha256(b"".join(digests)).hexdigest()

    def take_receipts(self) -> tuple[WireReceipt, ...]:
        receipts, self.receipts = self.receipts, []
        return tuple(sorted(receipts, key=lambda r: (r.round, r.sender)))

    def take_rounds(self) -> list[tuple[int, list[torch.Tensor], list[str]]]:
        rounds, self.rounds = self.rounds, []
        return rounds

    def state_dict(self) -> dict:
        return self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}

    def load_state_dict(self, state: dict) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state)


def _keep_round(encoded: bytes | None, tensors: list[torch.Tensor], known: str | None,
                averaged: list[torch.Tensor]) -> tuple[bytes, list[torch.Tensor]]:
    """(the round's codec digest, a CPU copy of its averaged tensors); `known` is the hash of
    `tensors` when the trainer hashed them already."""
    if encoded is not None:
        digest = hashlib.sha256(encoded).digest()
    else:
        digest = bytes.fromhex(known or hash_tensors(tensors))
    return digest, [t.detach().to("cpu", copy=True).float().contiguous() for t in averaged]


def averages_bytes(rounds: list[tuple[int, list[torch.Tensor], list[str]]]) -> bytes:
    """A segment's averaged tensors as deterministic safetensors: tensor "r<round>.<i>", and the
    rounds (id, tensor count, participants) in the metadata."""
    from safetensors.torch import save

    tensors = {f"r{round_id}.{i}": t for round_id, ts, _ in rounds for i, t in enumerate(ts)}
    meta = json.dumps([[round_id, len(ts), parts] for round_id, ts, parts in rounds], separators=(",", ":"))
    return save(tensors, metadata={ROUNDS_KEY: meta})


def load_averages(data: bytes) -> dict[int, tuple[list[torch.Tensor], list[str]]]:
    """round id -> (averaged tensors, participants) from `averages_bytes` output; BadStateFile if malformed."""
    tensors, metadata = read_tensor_file(data)
    try:
        rounds = json.loads(metadata.get(ROUNDS_KEY, "null"))
    except (ValueError, RecursionError):
        raise BadStateFile("averages metadata is not JSON") from None
    if not isinstance(rounds, list):
        raise BadStateFile("averages file lacks its rounds")
    out: dict[int, tuple[list[torch.Tensor], list[str]]] = {}
    used = 0
    for entry in rounds:
        if (not isinstance(entry, list) or len(entry) != 3 or isinstance(entry[0], bool)
                or not isinstance(entry[0], int) or isinstance(entry[1], bool) or not isinstance(entry[1], int)
                or not 0 <= entry[1] <= 1 << 16 or not isinstance(entry[2], list)
                or not all(isinstance(p, str) for p in entry[2]) or entry[0] in out):
            raise BadStateFile("malformed averages round entry")
        round_id, count, participants = entry
        try:
            out[round_id] = ([tensors[f"r{round_id}.{i}"] for i in range(count)], participants)
        except KeyError:
            raise BadStateFile(f"averages file lacks a tensor of round {round_id}") from None
        used += count
    if used != len(tensors):
        raise BadStateFile("averages file holds tensors no round names")
    return out


def plain_averager_holder(averager):
    """(object, attribute) holding the plain averager under the layers the trainers put on top of it
    (ParticipationLog, PowerSGDAverager: each keeps it as `.inner`)."""
    from ml.job.participation import ParticipationLog
    from ml.train.powersgd_averager import PowerSGDAverager

    holder, name = None, None
    current = averager
    while isinstance(current, (ParticipationLog, PowerSGDAverager)):
        holder, name, current = current, "inner", current.inner
    return holder, name


class SegmentRecorder:
    """Builds one worker's SegmentRecords while it trains (or, without a sink, the hashes of a replay)."""

    def __init__(self, sink: BlobSink | None = None, evidence=None):
        self.sink = sink
        self.evidence = evidence            # a hashlib object fed every gradient's raw bytes (replay)
        self.records: list[SegmentRecord] = []
        self.steps: list[StepHashes] = []
        self.received: list[tuple[WireReceipt, ...]] = []
        self.state_out: str | None = None
        self.recording: RecordingAverager | None = None
        self._index = 0
        self._checkpoint = ""
        self._state_in = ""
        self._gradient = ""
        self._carry: tuple[tuple, str] | None = None   # (state marker, digest) of the state the last segment ended in
        self.state_artifacts: dict[str, str] = {}   # sha256 of a segment's end state -> its artifact id (sink)
        # awaited at the start of each segment, before its first round (a crew change at an epoch
        # boundary, ml/compute/crew_changes.py); no round of this worker is in flight then
        self.before_segment: Callable[[int], Awaitable[None]] | None = None

    def attach(self, trainer) -> None:
        """Wrap the trainer's plain averager and have the trainer report to this recorder."""
        holder, name = plain_averager_holder(trainer.averager)
        if holder is None:
            self.recording = trainer.averager = RecordingAverager(trainer.averager)
        else:
            self.recording = RecordingAverager(getattr(holder, name))
            setattr(holder, name, self.recording)
        trainer.recorder = self

    async def begin(self, trainer, index: int) -> None:
        """Segment `index` starts: store the trainer's full state as its checkpoint."""
        if self.before_segment is not None:
            await self.before_segment(index)
        self._index, self.steps, self.received, self.state_out = index, [], [], None
        if self.recording is not None:
            self.recording.take_rounds()
            self.recording.take_codec()
            self.recording.take_receipts()
        if self.sink is None:
            return
        if self._carry is not None and self._carry[0] == trainer.state_marker():
            self._state_in = self._carry[1]   # the state the last segment ended in, stored by end()
            self._checkpoint = self.state_artifacts[self._state_in]
        else:
            data, self._state_in = await in_compute_thread(_state_file, trainer)
            self._checkpoint = await self.sink.put(data)
        self._carry = None

    async def gradient(self, tensors: list[torch.Tensor]) -> None:
        """This worker's own contribution for the step, before the codec."""
        self._gradient = await in_compute_thread(self._hash_gradient, tensors)
        if self.recording is not None:
            self.recording.known = (tensors, self._gradient)

    def _hash_gradient(self, tensors: list[torch.Tensor]) -> str:
        if self.evidence is not None:
            for t in tensors:
                c = t.detach().cpu().contiguous()
                if c.numel():
                    self.evidence.update(c.view(-1).view(torch.uint8).numpy())
        return hash_tensors(tensors)

    async def averaged(self, tensors: list[torch.Tensor]) -> None:
        """The average the group returned for the step (ends the step's hashes)."""
        average = await in_compute_thread(hash_tensors, tensors)
        codec = self.recording.take_codec() if self.recording is not None else hashlib.sha256(b"").hexdigest()
        self.steps.append(StepHashes(self._gradient, codec, average))
        self.received.append(self.recording.take_receipts() if self.recording is not None else ())

    async def end(self, trainer) -> None:
        """Segment ends: hash the state reached; with a sink, store the averages and keep the record."""
        data, state_out = await in_compute_thread(_state_file, trainer)
        self.state_out = state_out
        rounds = self.recording.take_rounds() if self.recording is not None else []
        if self.sink is None:
            return
        # the end state is the next segment's checkpoint; stored now, an epoch's last state can be fetched
        # by its digest even when no next segment begins (docs/adr/0211)
        self.state_artifacts[state_out] = await self.sink.put(data)
        self._carry = (trainer.state_marker(), state_out)
        averages = await self.sink.put(await in_compute_thread(averages_bytes, rounds))
        self.records.append(SegmentRecord(self._index, self._checkpoint, averages, self._state_in,
                                          tuple(self.steps), state_out, tuple(self.received)))


def _state_file(trainer) -> tuple[bytes, str]:
    """The trainer's state file and its sha256 (in a compute thread: both cost a pass over the state)."""
    data = state_bytes(trainer.training_state())
    return data, hashlib.sha256(data).hexdigest()
