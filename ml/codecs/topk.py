"""Top-k sparsification: the k = ceil(ratio * numel) largest-magnitude values, with their indices.

Meant to run inside `ErrorFeedback`, which carries what is not sent to later steps. Selection never
sorts the whole tensor: a threshold estimated from a fixed-seed random sample keeps a few times k
candidates, and an exact k-th value among the candidates finishes it. The chosen set is canonical
(largest |x|, ties to the lower index; zeros are never sent, so fewer than k values go when fewer are
nonzero), hence deterministic bytes. Layout after the header (flags = index format):
    count: u32 | indices | values: count x fp16 (saturating at +-65504), in index order
Index formats, whichever is smaller for count and numel:
    0 segmented: per 65536-value segment a u32 count, then count x u16 offsets within segments
    1 bitmap: ceil(numel / 8) bytes, bit i (little-endian bit order) set if index i is sent
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .base import (
    CODEC_IDS,
    HEADER_SIZE,
    CodecError,
    all_finite,
    check_input,
    chunk_values,
    pack_header,
    read_header,
    register_codec,
    require_length,
    tensor_bytes,
    view_array,
)

SEGMENT = 1 << 16
SEGMENTED, BITMAP = 0, 1
_SAMPLE_SIZE = 1 << 16
_CANDIDATE_MARGINS = (1.5, 4.0, 16.0)  # candidates wanted, in multiples of k, before falling back
_FP16_MAX = 65504.0


def index_bytes(fmt: int, count: int, numel: int) -> int:
    if fmt == BITMAP:
        return (numel + 7) // 8
    return 4 * (-(-numel // SEGMENT)) + 2 * count


def _index_format(count: int, numel: int) -> int:
    return BITMAP if index_bytes(BITMAP, count, numel) < index_bytes(SEGMENTED, count, numel) else SEGMENTED


class TopKCodec:
    """Sends the k largest-magnitude values; k = ceil(ratio * numel), at least 1 for a non-empty tensor."""

    name = "topk"

    def __init__(self, ratio: float = 0.01):
        if not 0.0 < ratio <= 1.0:
            raise ValueError("ratio must be in (0, 1]")
        self.ratio = ratio
        self._id = CODEC_IDS["topk"]

    def __repr__(self) -> str:
        return f"TopKCodec(ratio={self.ratio})"

    def k(self, numel: int) -> int:
        return min(numel, max(1, math.ceil(self.ratio * numel))) if numel else 0

    def max_encoded_size(self, numel: int) -> int:
        k = self.k(numel)
        return HEADER_SIZE + 4 + min(index_bytes(BITMAP, k, numel), index_bytes(SEGMENTED, k, numel)) + 2 * k

    # -- encode ---------------------------------------------------------------------------------

    def _select(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Ascending indices of the canonical top-k of |x| among its nonzero values."""
        numel = x.numel()
        if numel <= _SAMPLE_SIZE:
            sample = x.abs()
        else:  # fixed-seed positions: deterministic, and no aliasing with periodic layouts
            positions = torch.randint(0, numel, (_SAMPLE_SIZE,), generator=torch.Generator().manual_seed(numel))
            sample = x[positions].abs_()
        candidates = None
        for margin in (*_CANDIDATE_MARGINS, None):
            threshold = 0.0
            if margin is not None:
                below = sample.numel() - math.ceil(min(1.0, margin * k / numel) * sample.numel())
                if below >= 1:
                    threshold = float(torch.kthvalue(sample, below).values)
            candidates = _at_least(x, threshold)
            if candidates.numel() >= k or threshold <= 0.0:
                break
        assert candidates is not None   # the loop runs at least once
        values = x[candidates].abs_()
        if values.numel() <= k:
            return candidates
        kth = torch.kthvalue(values, values.numel() - k + 1).values
        chosen = values > kth
        missing = k - int(chosen.sum())
        ties = (values == kth).nonzero().squeeze(1)[:missing]
        chosen[ties] = True
        return candidates[chosen]

    def encode(self, x: torch.Tensor) -> bytes:
        numel = check_input(x)
        x = x.detach()
        if not all_finite(x):
            raise CodecError("tensor contains NaN or Inf")
        k = self.k(numel)
        indices = self._select(x, k) if k else torch.zeros(0, dtype=torch.int64)
        count = indices.numel()
        values = x[indices].clamp_(-_FP16_MAX, _FP16_MAX).to(torch.float16)
        fmt = _index_format(count, numel)
        index_part: bytes | memoryview
        if fmt == BITMAP:
            mask = torch.zeros(numel, dtype=torch.bool)
            mask[indices] = True
            index_part = np.packbits(mask.numpy(), bitorder="little").data
        else:
            counts = torch.bincount(indices >> 16, minlength=-(-numel // SEGMENT)).to(torch.int32)
            offsets = (indices & (SEGMENT - 1)).numpy().astype("<u2")
            index_part = b"".join([tensor_bytes(counts), offsets.data])
        return b"".join(
            [pack_header(self._id, fmt, 0, numel), count.to_bytes(4, "little"), index_part, tensor_bytes(values)]
        )

    # -- decode ---------------------------------------------------------------------------------

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        fmt, param = read_header(data, self._id, numel)
        if fmt not in (SEGMENTED, BITMAP) or param != 0:
            raise CodecError(f"topk: unknown index format {fmt} / parameter {param}")
        if len(data) < HEADER_SIZE + 4:
            raise CodecError("topk: truncated before the value count")
        count = int.from_bytes(bytes(data[HEADER_SIZE : HEADER_SIZE + 4]), "little")
        if count > self.k(numel):
            raise CodecError(f"topk: {count} values for numel {numel}, at most {self.k(numel)}")
        if fmt != _index_format(count, numel):
            raise CodecError("topk: index format is not the smaller one for this count")
        idx_bytes = index_bytes(fmt, count, numel)
        require_length(data, HEADER_SIZE + 4 + idx_bytes + 2 * count)
        offset = HEADER_SIZE + 4
        indices = (_read_bitmap if fmt == BITMAP else _read_segmented)(data, offset, count, numel)
        values = view_array(data, np.dtype("<f2"), offset + idx_bytes, count).view(torch.float16)
        values = values.to(torch.float32)
        if not all_finite(values):
            raise CodecError("topk: values contain NaN or Inf")
        out = torch.zeros(numel, dtype=torch.float32)
        out[indices] = values
        return out


def _at_least(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Ascending indices where |x| >= threshold (> 0 when threshold is 0), a cache-sized chunk of
    |x| at a time so no full-size temporary is written."""
    mask = torch.empty(x.numel(), dtype=torch.bool)
    chunk = chunk_values()
    scratch = torch.empty(min(chunk, x.numel()), dtype=torch.float32)
    for start in range(0, x.numel(), chunk):
        stop = min(start + chunk, x.numel())
        magnitude = torch.abs(x[start:stop], out=scratch[: stop - start])
        if threshold > 0.0:
            torch.ge(magnitude, threshold, out=mask[start:stop])
        else:
            torch.gt(magnitude, 0.0, out=mask[start:stop])
    return torch.from_numpy(np.flatnonzero(mask.numpy()))


def _read_bitmap(data: bytes | memoryview, offset: int, count: int, numel: int) -> torch.Tensor:
    packed = np.frombuffer(data, dtype=np.uint8, count=(numel + 7) // 8, offset=offset)
    if numel % 8 and packed[-1] >> (numel % 8):
        raise CodecError("topk: bitmap padding bits must be 0")
    bits = np.unpackbits(packed, count=numel, bitorder="little")
    indices = torch.from_numpy(np.flatnonzero(bits))
    if indices.numel() != count:
        raise CodecError(f"topk: bitmap has {indices.numel()} bits set, count says {count}")
    return indices


def _read_segmented(data: bytes | memoryview, offset: int, count: int, numel: int) -> torch.Tensor:
    n_segments = -(-numel // SEGMENT)
    counts = view_array(data, np.dtype("<u4"), offset, n_segments).to(torch.int64)
    if int(counts.sum()) != count:
        raise CodecError("topk: segment counts do not add up to the value count")
    offsets = view_array(data, np.dtype("<u2"), offset + 4 * n_segments, count).to(torch.int64)
    bases = torch.repeat_interleave(torch.arange(n_segments, dtype=torch.int64) * SEGMENT, counts)
    indices = bases + offsets
    if count and (int(indices[-1]) >= numel or not bool((indices[1:] > indices[:-1]).all())):
        raise CodecError("topk: indices out of range or not strictly increasing")
    return indices


def _topk(ratio: float = 0.01) -> TopKCodec:
    return TopKCodec(ratio)


register_codec("topk", _topk)
