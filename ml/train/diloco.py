"""DiLoCo: each worker takes `inner_steps` (H) local AdamW steps from the shared parameters, the group
averages the pseudo-gradients (start params - end params, compressed by the averager's codec), and
every worker applies the same outer Nesterov-SGD step to the shared parameters.

Warm start (docs/adr/0096): the first `leader_rounds(spec)` outer rounds cover the lr warmup. In them
only the leader (rank 0) trains, on the union of every worker's batches for each step (the batches
data-parallel training would use, so the same tokens), and the others contribute zeros; every worker
then sets the parameters to the round's start minus the leader's pseudo-gradient (the mean times the
participant count), with no outer optimizer. Each such round costs the bytes of an ordinary one.

`OuterTrainer` is what DiLoCo and streaming DiLoCo (ml/train/streaming_diloco.py, docs/adr/0191)
share: the outer Nesterov-SGD optimizer, the outer step count (one segment per outer step), the
leader's union batches of the warm start, the run loop and the outer parts of the state.

Segments: one per outer step. `segment_hashes` keeps the hash of this worker's pseudo-gradient per outer
step; a `SegmentRecorder` (ml.train.segments) keeps the full per-segment records (checkpoint, averages,
hashes) that a verifier replays alone (ml.compute.segment_replay, docs/adr/0167).
"""
from __future__ import annotations

import torch

from ml.train.reproducibility import hash_tensors
from ml.train.streaming_schedule import leader_rounds
from ml.train.worker import TrainerBase

LEADER = 0
__all__ = ["LEADER", "DiLoCoTrainer", "OuterTrainer", "leader_rounds"]


class OuterTrainer(TrainerBase):
    """A trainer whose segments are outer steps; subclasses define `outer_round()` (one hashed
    averaging round, advancing `outer_step` when a segment ends) and may put the outer optimizer on
    other tensors than the model's (`_outer_parameters`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Nesterov needs a momentum: outer_momentum 0 (which the spec allows) is plain outer SGD
        self.outer = torch.optim.SGD(self._outer_parameters(), lr=self.spec.outer_lr,
                                     momentum=self.spec.outer_momentum, nesterov=self.spec.outer_momentum > 0)
        self.outer_step = 0
        self.leader_rounds = leader_rounds(self.spec)

    def _outer_parameters(self) -> list[torch.Tensor]:
        return list(self.params)

    def _union_gradients(self, step: int) -> float:
        """Forward/backward on every worker's batch for `step` at once (the leader's warm start)."""
        batches = [self.batch_of(step, rank) for rank in range(self.world)]
        return self._backward(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]), step)

    async def outer_round(self) -> float | None:
        raise NotImplementedError

    async def run(self, until_outer_step: int | None = None) -> dict:
        """Train up to `until_outer_step` outer steps (default: all); returns the final evaluation."""
        total = self.spec.outer_steps
        target = total if until_outer_step is None else min(until_outer_step, total)
        while self.outer_step < target:
            before = self.outer_step
            loss = await self.outer_round()
            if loss is not None:
                self._record_loss(loss)
            if self.outer_step != before and self.outer_step < total:
                self._report(outer_step=self.outer_step,
                             metrics=await self.evaluate() if self.eval_due() else None)
        metrics = await self.evaluate()
        self._report(outer_step=self.outer_step, metrics=metrics)
        return metrics

    def training_state(self) -> dict:
        state = super().training_state()
        state["outer"] = self.outer.state_dict()
        state["outer_step"] = self.outer_step
        return state

    def load_training_state(self, state: dict) -> None:
        super().load_training_state(state)
        if not isinstance(state.get("outer_step"), int):
            raise ValueError("not a DiLoCo training state")
        self.outer.load_state_dict(state["outer"])
        self.outer_step = state["outer_step"]

    def state_marker(self) -> tuple:
        return (self.step, self.outer_step)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["outer"] = self.outer.state_dict()
        state["outer_step"] = self.outer_step
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.outer.load_state_dict(state["outer"])
        self.outer_step = state["outer_step"]


class DiLoCoTrainer(OuterTrainer):

    @property
    def in_warm_start(self) -> bool:
        return self.outer_step < self.leader_rounds

    def _local_segment(self) -> tuple[list[torch.Tensor], float | None]:
        """H inner steps from the current parameters; returns (pseudo-gradient, mean loss).

        In a warm-start round a non-leader only advances its step counter (zero pseudo-gradient, no
        loss) and the leader trains on every worker's batches.
        """
        if self.in_warm_start and self.rank != LEADER:
            self.step += self.spec.inner_steps
            return [torch.zeros_like(p, device="cpu") for p in self.params], None
        gradients = self._union_gradients if self.in_warm_start else self._gradients
        start = [p.detach().clone() for p in self.params]
        losses = 0.0
        for _ in range(self.spec.inner_steps):
            losses += gradients(self.step)
            self._inner_step(self.step)
            self.step += 1
        with torch.no_grad():
            delta = [s - p for s, p in zip(start, self.params)]
            for p, s in zip(self.params, start):
                p.copy_(s)
        return self.to_host(delta), losses / self.spec.inner_steps

    def _outer_apply(self, averaged: list[torch.Tensor], participants: int) -> None:
        if self.in_warm_start:   # only the leader contributed: its pseudo-gradient is the sum
            with torch.no_grad():
                for p, g in zip(self.params, averaged):
                    p.sub_(g.to(p.device) * participants)
            return
        for p, g in zip(self.params, averaged):
            p.grad = g.to(p.device)
        self.outer.step()
        for p in self.params:
            p.grad = None

    async def outer_round(self) -> float | None:
        """One outer step (one segment): H local steps, the group's average of the pseudo-gradients, the
        outer step; with a recorder, the checkpoint before and the record after. Returns the mean loss."""
        recorder = self.recorder
        if recorder is not None:
            await recorder.begin(self, self.outer_step)
        if self.fault is not None and self.fault.fake_segment(self.outer_step):
            self.step += self.spec.inner_steps
            delta, loss = [torch.zeros_like(p, device="cpu") for p in self.params], None
        else:
            delta, loss = await self.compute(self._local_segment)
        if self.fault is not None:
            delta = self.fault.contribution(delta)
        if recorder is not None:
            await recorder.gradient(delta)
        self.segment_hashes.append(hash_tensors(delta))
        averaged = await self.averager.average(delta, round_id=self.outer_step)
        if recorder is not None:
            await recorder.averaged(averaged.tensors)
        await self.compute(self._outer_apply, averaged.tensors, len(averaged.participants))
        self.outer_step += 1
        self.bytes_sent += averaged.bytes_sent
        self.last_participants = averaged.participants
        if recorder is not None:
            await recorder.end(self)
        return loss
