"""Activation deltas for repeated examples (the idea of AQ-SGD): send the change of an example's
activations since the last time, compressed, instead of the activations.

Sender and receiver each keep a `DeltaBook`: per example id, the activations as the receiver
reconstructed them last time. The sender sends `value - base` in a lossy codec; both add the decoded
delta to the base and store the sum, so the two books stay bit-identical and the quantisation error
does not accumulate (each delta corrects the previous error). An id seen for the first time, or with
another shape, has a zero base. Bounded in ids and bytes; DeltaError past the bounds.
"""
from __future__ import annotations

import torch

MAX_IDS = 1024
MAX_BYTES = 64 << 20
MAX_ID = 1 << 31


class DeltaError(ValueError):
    """Bad example ids, or a book past its bounds."""


def check_ids(ids: object, batch: int) -> list[int]:
    if (not isinstance(ids, list) or len(ids) != batch or len(set(ids)) != len(ids)
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_ID for i in ids)):
        raise DeltaError(f"ids must be {batch} distinct integers in 0..{MAX_ID - 1}")
    return ids


class DeltaBook:
    def __init__(self, max_ids: int = MAX_IDS, max_bytes: int = MAX_BYTES) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        self.max_ids, self.max_bytes = max_ids, max_bytes

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.rows.values())

    def bases(self, ids: list[int], shape: tuple[int, ...]) -> torch.Tensor:
        """The stored rows of `ids` (zeros where absent or shaped otherwise), stacked: (batch, *shape)."""
        zero = torch.zeros(shape)
        return torch.stack([self.rows[i] if i in self.rows and tuple(self.rows[i].shape) == shape else zero
                            for i in ids])

    def delta(self, ids: list[int], value: torch.Tensor) -> torch.Tensor:
        """What the sender sends for `value` (batch, ...)."""
        return value - self.bases(ids, tuple(value.shape[1:]))

    def commit(self, ids: list[int], received: torch.Tensor) -> torch.Tensor:
        """Add the delta as the receiver decoded it to the bases, store and return the result."""
        value = self.bases(ids, tuple(received.shape[1:])) + received
        new = [i for i in ids if i not in self.rows]
        row_bytes = value[0].numel() * value.element_size()
        if len(self.rows) + len(new) > self.max_ids or self.nbytes() + len(new) * row_bytes > self.max_bytes:
            raise DeltaError(f"activation cache full ({self.max_ids} examples, {self.max_bytes} bytes)")
        for index, example in enumerate(ids):
            self.rows[example] = value[index].clone()
        return value

    def stored(self, ids: list[int]) -> torch.Tensor:
        missing = [i for i in ids if i not in self.rows]
        if missing:
            raise DeltaError(f"no stored activations for examples {missing[:5]}")
        return torch.stack([self.rows[i] for i in ids])
