"""Data-parallel training: every step each worker computes gradients on its shard, the group
averages them (compressed by the averager's codec) and every worker applies the same AdamW step.

Segment hashes: the parameter hash every `spec.segment_steps` steps. Because every worker applies the
same averaged gradient, the hashes agree across workers; replaying a segment needs the group (or the
averages it produced).
"""
from __future__ import annotations

import torch

from ml.train.reproducibility import in_compute_thread
from ml.train.worker import TrainerBase


class DataParallelTrainer(TrainerBase):

    def _apply(self, averaged, step: int) -> None:
        for p, g in zip(self.params, averaged):
            p.grad = g.to(p.device)
        self._inner_step(step)

    async def run(self, until_step: int | None = None) -> dict:
        """Train up to `until_step` (default: `spec.steps`); returns the final evaluation."""
        target = self.spec.steps if until_step is None else min(until_step, self.spec.steps)
        while self.step < target:
            step = self.step
            loss = await in_compute_thread(self._gradients, step)
            self._record_loss(loss)
            grads = self.to_host([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
            averaged = await self.averager.average(grads, round_id=step)
            await in_compute_thread(self._apply, averaged.tensors, step)
            self.step += 1
            self.bytes_sent += averaged.bytes_sent
            self.last_participants = averaged.participants
            if self.step % self.spec.segment_steps == 0:
                self.segment_hashes.append(self.params_hash())
            if self.step % self.spec.report_every == 0 and self.step < self.spec.steps:
                self._report(metrics=await self.evaluate() if self.eval_due() else None)
        metrics = await self.evaluate()
        self._report(metrics=metrics)
        return metrics
