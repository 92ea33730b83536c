"""Streaming DiLoCo (Douillard et al. 2025; docs/adr/0191): DiLoCo whose model is split into P
fragments synced in turn, each fragment's outer all-reduce overlapping the next inner steps.

Every worker keeps the outer ("anchor") copy of the parameters, the same on every worker, beside its
local ones. When a fragment's round starts (ml/train/streaming_schedule.py) the worker takes its
pseudo-gradient, anchor - local, adds the fragment's error-feedback residual, keeps as the new
residual what `spec.codec` (e.g. int4) loses of that sum, and hands the sum to the group; the
all-reduce runs as a task on the event loop while the worker goes on with its inner steps (each in a
compute thread). `overlap_steps` (tau) steps later it waits for the average only if it has not
arrived, applies the outer Nesterov step to the fragment's anchor and merges:
local = mix * local + (1 - mix) * anchor. The warm-start rounds (the leader alone trains over the lr
warmup, as in DiLoCo) and the final round (the whole model, so that every worker ends with the same
weights) are blocking and set local = anchor.

Reproducibility: what a round changes depends only on the state at its start, the inner steps up to
its due step and the group's average, never on when the average arrived, so a replay
(ml.compute.segment_replay) that takes each round's committed average reaches the same bits. A
segment starts where no round is in flight; its checkpoint (`training_state`) holds the anchor, the
outer optimizer, the residuals and the next round; its record has one hashed step per round (hash of
the contribution handed to the group, of the codec input, of the average).
"""
from __future__ import annotations

import asyncio
import time

import torch

from ml.codecs import CodecError, get_codec
from ml.train.averaging import Averaged
from ml.train.compression import flatten, unflatten
from ml.train.diloco import LEADER, OuterTrainer
from ml.train.dry_run import Untrainable
from ml.train.reproducibility import hash_tensors
from ml.train.streaming_schedule import STREAM, WARM, Round, fragment_of_params, schedule

LOSSLESS = ("fp32",)


class StreamingDiLoCoTrainer(OuterTrainer):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = [name for name, _ in self.model.named_parameters()]
        try:
            owner = fragment_of_params(names, self.spec.fragments)
        except ValueError as exc:   # the compute role rejects the task instead of failing it
            raise Untrainable(str(exc)) from None
        self.members = [[i for i, f in enumerate(owner) if f == fragment] for fragment in range(self.spec.fragments)]
        self.rounds = schedule(self.spec)
        self.warm_end = self.leader_rounds * self.spec.inner_steps
        self.codec = get_codec(self.spec.codec, **self.spec.codec_options)
        self.feedback = self.spec.codec.partition("+")[0] not in LOSSLESS
        self.residuals = [torch.zeros(sum(self.params[i].numel() for i in m)) if self.feedback else torch.zeros(0)
                          for m in self.members]
        self.next_round = 0
        self.wait_seconds = 0.0   # time spent waiting for an average (the overlap did not hide it)
        self._first = {r.segment: r.index for r in reversed(self.rounds)}
        self._last = {r.segment: r.index for r in self.rounds}

    def _outer_parameters(self) -> list[torch.Tensor]:
        self.anchor = [p.detach().clone() for p in self.params]
        return self.anchor

    def _indices(self, fragments: tuple[int, ...]) -> list[int]:
        return [i for f in fragments for i in self.members[f]]

    # -- local computation (compute thread) ----------------------------------------------------------
    def _inner(self, step: int) -> float:
        loss = (self._union_gradients if step < self.warm_end else self._gradients)(step)
        self._inner_step(step)
        return loss

    def _contribution(self, rnd: Round) -> list[torch.Tensor]:
        """The fragments' pseudo-gradients plus their residuals; the residuals become what the codec
        loses of that sum."""
        with torch.no_grad():
            deltas = self.to_host([self.anchor[i] - self.params[i] for i in self._indices(rnd.fragments)])
            if not self.feedback:
                return deltas
            flat = flatten(deltas) + torch.cat([self.residuals[f] for f in rnd.fragments])
            try:
                lost = flat - self.codec.decode(self.codec.encode(flat), flat.numel())
            except CodecError:   # non-finite: the group deals with it; the residuals stay as they were
                return deltas
            offset = 0
            for f in rnd.fragments:
                size = self.residuals[f].numel()
                self.residuals[f] = lost[offset:offset + size].clone()
                offset += size
            return unflatten(flat, deltas)

    def _apply(self, rnd: Round, averaged: list[torch.Tensor], participants: int) -> None:
        indices = self._indices(rnd.fragments)
        with torch.no_grad():
            if rnd.kind == WARM:   # only the leader contributed: its pseudo-gradient is the sum
                for i, g in zip(indices, averaged):
                    self.anchor[i].sub_(g.to(self.anchor[i].device) * participants)
                    self.params[i].copy_(self.anchor[i])
                return
            for i, g in zip(indices, averaged):
                self.anchor[i].grad = g.to(self.anchor[i].device)
            self.outer.step()
            for i in indices:
                self.anchor[i].grad = None
            mix = self.spec.mix if rnd.kind == STREAM else 0.0
            for i in indices:
                if mix:
                    self.params[i].mul_(mix).add_(self.anchor[i], alpha=1 - mix)
                else:
                    self.params[i].copy_(self.anchor[i])

    # -- the timeline ---------------------------------------------------------------------------------
    async def _steps_until(self, boundary: int, fake: bool, losses: list[float]) -> None:
        while self.step < boundary:
            if not fake and (self.step >= self.warm_end or self.rank == LEADER):
                losses.append(await self.compute(self._inner, self.step))
            self.step += 1

    async def outer_round(self) -> float | None:
        """One averaging round: inner steps up to its start, the pseudo-gradient handed to the group,
        inner steps while the all-reduce runs, then (waiting only if it has not arrived) the outer step
        and the merge; with a recorder, the checkpoint before a segment's first round and the record
        after its last. Returns the mean loss of the inner steps taken (None if none)."""
        rnd = self.rounds[self.next_round]
        recorder = self.recorder
        if recorder is not None and rnd.index == self._first[rnd.segment]:
            await recorder.begin(self, rnd.segment)
        fake = self.fault is not None and self.fault.fake_segment(rnd.segment)
        losses: list[float] = []
        await self._steps_until(rnd.start, fake, losses)
        contribution = await self.compute(self._contribution, rnd)
        if self.fault is not None:
            contribution = self.fault.contribution(contribution)
        if recorder is not None:
            await recorder.gradient(contribution)
        pending = asyncio.ensure_future(self.averager.average(contribution, round_id=rnd.index))
        try:
            await self._steps_until(rnd.due, fake, losses)
            waiting = time.monotonic()
            averaged: Averaged = await pending
            self.wait_seconds += time.monotonic() - waiting
        finally:
            pending.cancel()   # a no-op once done; stops the round if an inner step failed
        if recorder is not None:
            await recorder.averaged(averaged.tensors)
        await self.compute(self._apply, rnd, averaged.tensors, len(averaged.participants))
        self.next_round += 1
        self.bytes_sent += averaged.bytes_sent
        self.last_participants = averaged.participants
        if rnd.index == self._last[rnd.segment]:
            self.outer_step += 1
            self.segment_hashes.append(await self.compute(hash_tensors, self.anchor))
            if recorder is not None:
                await recorder.end(self)
        return sum(losses) / len(losses) if losses else None

    # -- state ----------------------------------------------------------------------------------------
    def _streaming_state(self) -> dict:
        return {"anchor": list(self.anchor), "residuals": list(self.residuals), "round": self.next_round}

    def _load_streaming_state(self, state: dict) -> None:
        anchor, residuals, index = state["anchor"], state["residuals"], state["round"]
        if (not isinstance(anchor, list) or len(anchor) != len(self.anchor) or not isinstance(residuals, list)
                or len(residuals) != len(self.residuals) or isinstance(index, bool) or not isinstance(index, int)
                or not 0 <= index <= len(self.rounds)):
            raise ValueError("not a streaming DiLoCo training state")
        for mine, theirs in zip([*self.anchor, *self.residuals], [*anchor, *residuals]):
            if not isinstance(theirs, torch.Tensor) or theirs.shape != mine.shape:
                raise ValueError("streaming DiLoCo state of another model")
        with torch.no_grad():
            for a, t in zip(self.anchor, anchor):
                a.copy_(t)
        self.residuals = [r.to(torch.float32).clone() for r in residuals]
        self.next_round = index

    def training_state(self) -> dict:
        return {**super().training_state(), **self._streaming_state()}

    def load_training_state(self, state: dict) -> None:
        super().load_training_state(state)
        self._load_streaming_state(state)

    def state_marker(self) -> tuple:
        return (self.step, self.outer_step, self.next_round)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self._streaming_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_streaming_state(state)
