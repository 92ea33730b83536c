"""PowerSGD on top of any plain averager: rank-r compression of the matrix-shaped tensors, with
error feedback and warm start (ml.codecs.PowerSGD), in two averaging phases per round (P, then Q).

Tensors that fail the minimum-compression gate (small ones, 1-D biases and norms) travel uncompressed
with the P phase. Round r uses the inner averager's rounds 2r and 2r+1.
"""
from __future__ import annotations

import torch

from ml.codecs import PowerSGD, choose_codec, from_matrix, matrix_shape, to_matrix
from ml.registry.sharding import derive_seed
from ml.train.averaging import Averaged, Averager


class PowerSGDAverager:
    """Implements `Averager`; holds per-tensor PowerSGD state (error, Q) for one worker."""

    def __init__(self, inner: Averager, rank: int, seed: int):
        self.inner = inner
        self.rank = rank
        self.seed = seed
        self.codec_name = f"powersgd{rank}"
        self._states: list[PowerSGD | None] | None = None
        self._pending: list | None = None   # restored state, applied when the tensors are known

    def _setup(self, tensors: list[torch.Tensor]) -> list[PowerSGD | None]:
        states: list[PowerSGD | None] = []
        for index, t in enumerate(tensors):
            role = "weight" if t.dim() >= 2 else "bias"
            chosen = choose_codec(t.numel(), role, self.codec_name, tuple(t.shape))
            if chosen == self.codec_name:
                states.append(PowerSGD(matrix_shape(t.shape), self.rank,
                                       seed=derive_seed("powersgd-q", self.seed, index)))
            else:
                states.append(None)
        return states

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        if self._states is None:
            self._states = self._setup(tensors)
            if self._pending is not None:
                self._apply_saved(self._pending)
                self._pending = None
        states = self._states
        compressed = [(i, s) for i, s in enumerate(states) if s is not None]
        plain = [i for i, s in enumerate(states) if s is None]
        p_list = [s.p_step(to_matrix(tensors[i].float(), s.shape)) for i, s in compressed]
        first = await self.inner.average(p_list + [tensors[i] for i in plain], 2 * round_id)
        p_means = first.tensors[:len(compressed)]
        q_list = [s.q_step(p) for (_, s), p in zip(compressed, p_means)]
        second = await self.inner.average(q_list, 2 * round_id + 1)
        out = list(tensors)   # every entry is replaced: each tensor is either compressed or plain
        for (i, s), q_mean in zip(compressed, second.tensors):
            approx = s.finish(q_mean)
            out[i] = from_matrix(approx, tensors[i].numel()).view_as(tensors[i])
        for i, mean in zip(plain, first.tensors[len(compressed):]):
            out[i] = mean
        participants = first.participants if first.participants == second.participants else ()
        if not participants:
            raise RuntimeError(f"round {round_id}: P and Q phases had different participants")
        return Averaged(out, participants, first.bytes_sent + second.bytes_sent)

    def _apply_saved(self, saved: list) -> None:
        states = self._states
        assert states is not None   # set up from the first tensors before any saved state applies
        if len(saved) != len(states):
            raise ValueError(f"saved PowerSGD state has {len(saved)} tensors, expected {len(states)}")
        for s, entry in zip(states, saved):
            if (s is None) != (entry is None):
                raise ValueError("saved PowerSGD state does not match the model's tensors")
            if s is not None:
                s.q, s.error = entry["q"].clone(), entry["error"].clone()

    def state_dict(self) -> dict:
        states = self._states or []
        return {"powersgd": [None if s is None else {"q": s.q, "error": s.error} for s in states],
                "inner": self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}}

    def load_state_dict(self, state: dict) -> None:
        if self._states is None:
            self._pending = state["powersgd"] or None
        else:
            self._apply_saved(state["powersgd"])
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state["inner"])
