"""A verifier's replay of ONE worker's ONE segment (docs/adr/0167): load the worker's committed state
file at the segment start, recompute that worker's own steps on its shard, take the group's averages
from the committed averages file instead of a group, and compare every hash of the record.

Only that worker's computation is redone, so a deviating worker is named alone: a poisoner's
gradient hashes differ from the recomputed ones, while its honest co-workers' segments (which applied
the same poisoned averages, committed in their records) replay to their committed hashes.

Evidence is sha256(salt || the raw bytes of every recomputed contribution), in step order, up to
`until_step` (inclusive, an offset in the segment) or the segment end; the replay goes on past a
divergence (with the committed averages) so that every honest replayer of the same request gets the
same evidence. `replay_segment` is blocking (torch): callers run it with
`ml.train.reproducibility.in_compute_thread` (a verifier's whole audit of a slot -- record, proof,
state files, replay -- is ml/compute/verification_flow.py's `judge_slot`). All codecs are
supported: the error-feedback residual (top-k, sign) and PowerSGD's error and Q travel in the state
file, and PowerSGD's two averaging phases are both in the averages file.
"""
from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ml.codecs import get_codec
from ml.compute.segment_record import SegmentRecord
from ml.compute.wire_evidence import Claim, flat_contribution, honest_digest
from ml.train.allreduce_averager import group_codec
from ml.train.averaging import Averaged
from ml.train.compression import BIASED_CODECS, Compressor, flatten
from ml.train.segments import SegmentRecorder, load_averages
from ml.train.simulation import make_trainer, with_codec_layer
from ml.train.spec import TrainSpec
from ml.train.state_file import BadStateFile, load_state
from node.artifacts.merkle import artifact_id_of_file

MAX_STATE_BYTES = 8 << 30
# What training from a malformed committed state raises (wrong optimizer entries, NaN in a codec's
# state, ...): deterministic, so every honest replayer calls it a mismatch alike.
STATE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError)


@dataclass(frozen=True)
class SegmentReplay:
    match: bool
    first_divergence: tuple[int, str] | None   # (step offset in the segment, field) of the first difference
    evidence: bytes                            # 32 bytes
    wire: tuple[tuple[Claim, bool], ...] = ()  # each receivers' claim given, and whether the honest bytes match it


class MissingAverage(RuntimeError):
    """The committed averages lack a round the replay needs (or have the wrong shapes)."""


class CommittedAverages:
    """The plain averager of a replay: returns the group's committed average of each round; for codecs
    with worker-side state (top-k, sign) it encodes this worker's contribution as the original did, so
    the error-feedback residual and the codec hash follow."""

    def __init__(self, spec: TrainSpec, rounds: dict[int, tuple[list[torch.Tensor], list[str]]],
                 claims: Sequence[Claim] = ()):
        self.rounds = rounds
        biased = spec.codec.partition("+")[0] in BIASED_CODECS
        self.compressor = Compressor(spec.codec, spec.codec_options) if biased else None
        self.last_encoded: bytes | None = None
        self.claims: dict[int, list[Claim]] = {}
        for claim in claims:
            self.claims.setdefault(claim.receipt.round, []).append(claim)
        self.wire_codec = get_codec(group_codec(spec)) if self.claims else None
        self.checked: list[tuple[Claim, bool]] = []

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        if self.compressor is not None:
            self.last_encoded = await asyncio.to_thread(self.compressor.encode, flatten(tensors))
        if round_id in self.claims:
            await asyncio.to_thread(self._check_claims, tensors, round_id)
        entry = self.rounds.get(round_id)
        if entry is None or len(entry[0]) != len(tensors) or any(
                tuple(a.shape) != tuple(t.shape) for a, t in zip(entry[0], tensors)):
            raise MissingAverage(f"no committed average of round {round_id} with the contribution's shapes")
        averaged, participants = entry
        return Averaged([a.clone() for a in averaged], tuple(participants), 0)

    def _check_claims(self, tensors: list[torch.Tensor], round_id: int) -> None:
        """Compare what the receivers recorded from this worker in `round_id` with what its honest
        contribution puts on the wire."""
        flat = flat_contribution(tensors) if self.compressor is None else torch.empty(0)
        assert self.wire_codec is not None   # made whenever there are claims
        for claim in self.claims.pop(round_id):
            honest = honest_digest(self.wire_codec, flat, self.last_encoded, claim.receipt)
            self.checked.append((claim, honest == claim.receipt.digest))

    def state_dict(self) -> dict:
        return self.compressor.state_dict() if self.compressor is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.compressor is not None:
            self.compressor.load_state_dict(state)


def replay_segment(spec: TrainSpec, rank: int, world: int, record: SegmentRecord, checkpoint_path: Path | str,
                   averages_path: Path | str, files: Mapping[str, Path] | None, salt: bytes,
                   until_step: int | None = None, claims: Sequence[Claim] = (), shards_from: int = 0) -> SegmentReplay:
    """Replay worker `rank` of `world` (its seat; the data cut into `world` shards from step `shards_from`
    on, docs/adr/0234) over segment `record.index` of `spec` from the committed checkpoint and averages
    files; compare every hash of `record`.
    `claims`: receipts its co-workers recorded from it (ml.compute.wire_evidence), each checked against
    the honest contribution of its round (`SegmentReplay.wire`).

    A record inconsistent with the spec, a checkpoint or averages file that does not match the record,
    or one that cannot be loaded or trained from is a mismatch (the worker committed it); a bad argument
    of the caller raises ValueError."""
    if not isinstance(record, SegmentRecord) or not 0 <= rank < world or len(salt) != 32:
        raise ValueError("replay_segment needs a SegmentRecord, 0 <= rank < world and a 32-byte salt")
    evidence = hashlib.sha256(salt)

    committed: CommittedAverages | None = None

    def verdict(divergence: tuple[int, str] | None) -> SegmentReplay:
        wire = tuple(committed.checked) if committed is not None else ()
        return SegmentReplay(divergence is None, divergence, evidence.digest(), wire)

    if record.index >= spec.segment_count or len(record.steps) != spec.steps_in_segment(record.index):
        return verdict((0, "record"))
    if until_step is not None and not 0 <= until_step < len(record.steps):
        raise ValueError(f"until_step {until_step} outside the segment's {len(record.steps)} steps")
    checkpoint_path, averages_path = Path(checkpoint_path), Path(averages_path)
    if (checkpoint_path.stat().st_size > MAX_STATE_BYTES or averages_path.stat().st_size > MAX_STATE_BYTES):
        return verdict((0, "state_in"))
    data = checkpoint_path.read_bytes()
    if hashlib.sha256(data).hexdigest() != record.state_in or artifact_id_of_file(checkpoint_path) != record.checkpoint:
        return verdict((0, "state_in"))
    if artifact_id_of_file(averages_path) != record.averages:
        return verdict((0, "average"))
    try:
        state = load_state(data)
        rounds = load_averages(averages_path.read_bytes())
    except BadStateFile:
        return verdict((0, "state_in"))
    del data
    committed = CommittedAverages(spec, rounds, claims)
    trainer = make_trainer(spec, rank, world, with_codec_layer(spec, committed), files=files)
    if shards_from:
        trainer.reshard(world, shards_from)
    recorder = SegmentRecorder(sink=None, evidence=evidence)
    recorder.attach(trainer)
    try:
        trainer.load_training_state(state)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError):
        return verdict((0, "state_in"))
    if (trainer.step != spec.first_step_of_segment(record.index)
            or getattr(trainer, "outer_step", record.index) != record.index):
        return verdict((0, "state_in"))
    last = len(record.steps) - 1 if until_step is None else until_step
    return verdict(asyncio.run(_replay(trainer, recorder, record, last)))


def replay_segment_blobs(spec: TrainSpec, rank: int, world: int, record: SegmentRecord, blobs: Mapping[str, bytes],
                         files: Mapping[str, Path] | None, salt: bytes, until_step: int | None = None,
                         claims: Sequence[Claim] = (), shards_from: int = 0) -> SegmentReplay:
    """`replay_segment` with the checkpoint and averages taken from `blobs` (artifact id -> bytes, e.g.
    a simulation's MemorySink); a blob that is missing is a mismatch."""
    with tempfile.TemporaryDirectory(prefix="dekube-replay-") as folder:
        paths = []
        for name in (record.checkpoint, record.averages):
            path = Path(folder) / name
            path.write_bytes(blobs.get(name, b""))
            paths.append(path)
        return replay_segment(spec, rank, world, record, paths[0], paths[1], files, salt, until_step, claims,
                              shards_from)


async def _replay(trainer, recorder: SegmentRecorder, record: SegmentRecord, last: int) -> tuple[int, str] | None:
    step_once = trainer.outer_round if hasattr(trainer, "outer_round") else trainer.train_step
    divergence: tuple[int, str] | None = None
    for offset in range(last + 1):
        try:
            await step_once()
        except MissingAverage:
            return divergence or (offset, "average")
        except STATE_ERRORS:  # a committed state that loads but cannot be trained from (the worker's doing)
            return divergence or (offset, "state_in")
        got, committed = recorder.steps[offset], record.steps[offset]
        if divergence is None:
            for name in ("gradient", "codec", "average"):
                if getattr(got, name) != getattr(committed, name):
                    divergence = (offset, name)
                    break
    if divergence is None and last == len(record.steps) - 1 and recorder.state_out != record.state_out:
        divergence = (last, "state_out")
    return divergence
