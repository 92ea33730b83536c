"""PowerSGD all-reduce: P and Q of every tensor averaged exactly in fp32 by an AllReduceGroup.

Round `r` uses the group's round ids 2r (the P factors) and 2r+1 (the Q factors), so give PowerSGD
its own fp32 group. Every survivor gets the same bits: the final product is computed only from the
shared P and Q means (see ml/codecs/powersgd.py). The participants reported are those of the Q
round; a member lost between the two rounds is listed in `excluded`.
"""
from __future__ import annotations

import asyncio

import torch

from ml.codecs.powersgd import PowerSGD, from_matrix, matrix_shape, to_matrix

from .group import AllReduceGroup, AllReduceResult


class PowerSGDAllReduce:
    """Low-rank averaging of a fixed list of tensor shapes, with error feedback and warm start."""

    def __init__(self, group: AllReduceGroup, shapes: list[tuple[int, ...]], rank: int, seed: int = 0):
        if group.codec_name != "fp32":
            raise ValueError("PowerSGD factors are averaged in fp32: give it an fp32 group")
        self.group = group
        self.shapes = [tuple(s) for s in shapes]
        self.states = [PowerSGD(matrix_shape(s), rank, seed + i) for i, s in enumerate(self.shapes)]

    async def allreduce(self, tensors: list[torch.Tensor], round_id: int) -> AllReduceResult:
        if [tuple(t.shape) for t in tensors] != self.shapes:
            raise ValueError("tensor shapes differ from the ones this PowerSGD state was built for")
        loop = asyncio.get_running_loop()
        ps = await loop.run_in_executor(None, self._p_step, tensors)
        p_round = await self.group.allreduce(ps, 2 * round_id)
        qs = await loop.run_in_executor(None, self._q_step, p_round.tensors)
        q_round = await self.group.allreduce(qs, 2 * round_id + 1)
        approx = await loop.run_in_executor(None, self._finish, q_round.tensors)
        excluded = {**p_round.excluded, **q_round.excluded}
        return AllReduceResult(approx, q_round.participants, round_id, p_round.attempts + q_round.attempts - 1,
                               excluded, p_round.bytes_sent + q_round.bytes_sent)

    def _p_step(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [state.p_step(to_matrix(t.detach().float(), state.shape)) for state, t in zip(self.states, tensors)]

    def _q_step(self, p_means: list[torch.Tensor]) -> list[torch.Tensor]:
        return [state.q_step(p.contiguous()) for state, p in zip(self.states, p_means)]

    def _finish(self, q_means: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_as_shape(state.finish(q.contiguous()), shape)
                for state, q, shape in zip(self.states, q_means, self.shapes)]


def _as_shape(approx: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The approximation (a fresh matrix) as the tensor's shape: a view unless it was padded."""
    numel = torch.Size(shape).numel()
    if approx.numel() == numel:
        return approx.view(shape)
    return from_matrix(approx, numel).view(shape)
