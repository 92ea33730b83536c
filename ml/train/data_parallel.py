"""Data-parallel training: every step each worker computes gradients on its shard, the group
averages them (compressed by the averager's codec) and every worker applies the same AdamW step.

Segments: `spec.segment_steps` steps each (the last may be shorter). `segment_hashes` keeps the
parameter hash at each segment end (identical on every worker); a `SegmentRecorder` (ml.train.segments)
keeps this worker's own per-step records, which a verifier replays alone with the committed averages
(ml.compute.segment_replay, docs/adr/0167).
"""
from __future__ import annotations

import torch

from ml.train.worker import TrainerBase


class DataParallelTrainer(TrainerBase):

    def _apply(self, averaged, step: int) -> None:
        for p, g in zip(self.params, averaged):
            p.grad = g.to(p.device)
        self._inner_step(step)

    def segment_of(self, step: int) -> int:
        return step // self.spec.segment_steps

    async def train_step(self) -> None:
        """One step: gradients on this worker's batch, the group's average, the optimizer step; with a
        recorder, the segment's checkpoint at its first step and its record after its last."""
        step, recorder = self.step, self.recorder
        if recorder is not None and step % self.spec.segment_steps == 0:
            await recorder.begin(self, self.segment_of(step))
        loss = await self.compute(self._gradients, step)
        self._record_loss(loss)
        grads = self.to_host([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        if self.fault is not None:
            grads = self.fault.contribution(grads)
        if recorder is not None:
            await recorder.gradient(grads)
        averaged = await self.averager.average(grads, round_id=step)
        if recorder is not None:
            await recorder.averaged(averaged.tensors)
        await self.compute(self._apply, averaged.tensors, step)
        self.step += 1
        self.bytes_sent += averaged.bytes_sent
        self.last_participants = averaged.participants
        if self.step % self.spec.segment_steps == 0:
            self.segment_hashes.append(self.params_hash())
        if recorder is not None and (self.step % self.spec.segment_steps == 0 or self.step == self.spec.steps):
            await recorder.end(self)

    async def run(self, until_step: int | None = None) -> dict:
        """Train up to `until_step` (default: `spec.steps`); returns the final evaluation."""
        target = self.spec.steps if until_step is None else min(until_step, self.spec.steps)
        while self.step < target:
            await self.train_step()
            if self.step % self.spec.report_every == 0 and self.step < self.spec.steps:
                self._report(metrics=await self.evaluate() if self.eval_due() else None)
        metrics = await self.evaluate()
        self._report(metrics=metrics)
        return metrics
