"""PowerSGD (Vogels et al. 2019): rank-r compression of a gradient matrix, with error feedback and
warm start, in two phases because P and Q must each be averaged across peers.

    p = peer.p_step(grad)          # P = (M + E) Q                  -> average P across peers
    q = peer.q_step(p_mean)        # P^ = orth(P_mean), Q = (M+E)^T P^  -> average Q across peers
    approx = peer.finish(q_mean)   # approx = P^ Q_mean^T, E = (M + E) - approx, Q kept (warm start)

Everything computed from averaged (shared) inputs -- orthonormalization and the final outer product
-- uses only element-wise IEEE operations in a fixed order (no BLAS, no threaded reductions), so every
peer gets the same bits from the same P_mean and Q_mean whatever its CPU or thread count. The initial Q
comes from integer draws of a seeded generator, identical on every peer for the same seed.
`error` and `q` are replaced each round, never modified in place, so references kept by a checkpoint
stay valid; the replaced error matrix is reused for the next round's M + E only when nothing else
holds it (saves allocating and faulting in a fresh matrix each round; the class makes no lasting
views of it, and a checkpoint holds the tensor itself). Results are always new matrices: callers
keep views of them. `matrix_shape`/`to_matrix`/`from_matrix` view any tensor as a matrix and `worthwhile` is the
minimum-compression gate: tensors that would not shrink enough should go as fp16 instead.
"""
from __future__ import annotations

import math
import sys

import torch

from .base import CodecError, all_finite, chunk_values

DEFAULT_MIN_COMPRESSION = 4.0


def matrix_shape(shape: tuple[int, ...] | torch.Size) -> tuple[int, int]:
    """Matrix view of a tensor shape: (dim0, rest) for >= 2-D; near-square (padded) for 1-D."""
    shape = tuple(shape)
    if len(shape) >= 2:
        return shape[0], math.prod(shape[1:])
    numel = math.prod(shape)
    rows = math.isqrt(numel - 1) + 1 if numel > 1 else 1  # ceil(sqrt(numel))
    return rows, max(1, -(-numel // rows))


def to_matrix(x: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """x (any shape, float32) as a `shape` matrix, zero-padding the flattened values if needed."""
    rows, cols = shape
    flat = x.reshape(-1)
    if flat.numel() > rows * cols:
        raise CodecError(f"{flat.numel()} values do not fit a {rows}x{cols} matrix")
    if flat.numel() == rows * cols:
        return flat.view(rows, cols)
    padded = torch.zeros(rows * cols, dtype=torch.float32)
    padded[: flat.numel()] = flat
    return padded.view(rows, cols)


def from_matrix(mat: torch.Tensor, numel: int) -> torch.Tensor:
    """The first `numel` values of a matrix made by `to_matrix`, as a new 1-D tensor."""
    return mat.reshape(-1)[:numel].clone()


def compression_ratio(shape: tuple[int, int], rank: int) -> float:
    """Values of the matrix per value sent (P and Q)."""
    rows, cols = shape
    return rows * cols / (rank * (rows + cols))


def worthwhile(shape: tuple[int, int], rank: int, min_compression: float = DEFAULT_MIN_COMPRESSION) -> bool:
    """The gate: use PowerSGD only if rank < both sides and it compresses at least min_compression x."""
    rows, cols = shape
    return 0 < rank < min(rows, cols) and compression_ratio(shape, rank) >= min_compression


def _ordered_sum(v: torch.Tensor) -> torch.Tensor:
    """Sum of a 1-D float64 tensor by a fixed pairwise tree of element-wise adds (bit-reproducible)."""
    n = v.numel()
    size = 1 << max(0, (n - 1).bit_length())
    if size != n:
        v = torch.cat([v, v.new_zeros(size - n)])
    while v.numel() > 1:
        v = v[0::2] + v[1::2]
    return v[0] if n else v.new_zeros(())


def orthonormalize(p: torch.Tensor) -> torch.Tensor:
    """Columns of p made orthonormal by Gram-Schmidt in float64 with ordered sums; a column that
    vanishes becomes zero. Bit-reproducible on any CPU. Returns float32."""
    cols = [p[:, j].to(torch.float64) for j in range(p.shape[1])]
    done: list[torch.Tensor] = []
    for col in cols:
        for prev in done:
            col = col - prev * _ordered_sum(prev * col)
        norm = torch.sqrt(_ordered_sum(col * col))
        col = col / norm if float(norm) > 0.0 else torch.zeros_like(col)
        done.append(col)
    return torch.stack(done, dim=1).to(torch.float32)


def outer_sum(p: torch.Tensor, q: torch.Tensor, subtract_from: torch.Tensor | None = None) -> torch.Tensor:
    """p @ q.T for thin p [n, r], q [m, r] as r element-wise multiply-adds in order (bit-reproducible),
    a block of rows at a time so the partial sums stay in cache. If given, `subtract_from` [n, m] has
    the result subtracted from it in place, block by block while the block is still in cache."""
    rows, cols, rank = p.shape[0], q.shape[0], p.shape[1]
    out = torch.empty(rows, cols, dtype=torch.float32)
    step = max(1, chunk_values() // max(1, cols))
    scratch = torch.empty(min(step, rows), cols, dtype=torch.float32)
    q_rows = [q[:, k][None, :] for k in range(rank)]
    for start in range(0, rows, step):
        block = out[start : start + step]
        torch.mul(p[start : start + step, 0:1], q_rows[0], out=block)
        tmp = scratch[: block.shape[0]]
        for k in range(1, rank):
            torch.mul(p[start : start + step, k : k + 1], q_rows[k], out=tmp)
            block += tmp
        if subtract_from is not None:
            subtract_from[start : start + step] -= block
    return out


def _initial_q(cols: int, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, 1 << 24, (cols, rank), generator=gen, dtype=torch.int64)
    return orthonormalize(draws.to(torch.float32) / float(1 << 23) - 1.0)


class PowerSGD:
    """Per-tensor PowerSGD state for a `shape` = (rows, cols) float32 gradient matrix."""

    def __init__(
        self,
        shape: tuple[int, int],
        rank: int,
        seed: int,
        min_compression: float = DEFAULT_MIN_COMPRESSION,
    ):
        rows, cols = shape
        if rows < 1 or cols < 1 or not 1 <= rank <= min(rows, cols):
            raise ValueError(f"rank {rank} does not fit a {rows}x{cols} matrix")
        self.shape = (rows, cols)
        self.rank = rank
        self.min_compression = min_compression
        self.q = _initial_q(cols, rank, seed)
        self.error = torch.zeros(rows, cols, dtype=torch.float32)
        self._spare: torch.Tensor | None = None   # the error matrix of two rounds ago, for reuse
        self._corrected: torch.Tensor | None = None
        self._p_hat: torch.Tensor | None = None

    @property
    def worthwhile(self) -> bool:
        return worthwhile(self.shape, self.rank, self.min_compression)

    def _check(self, t: torch.Tensor, shape: tuple[int, int], what: str, finite: bool = True) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape:
            got = (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
            raise CodecError(f"PowerSGD {what}: expected float32 {shape}, got {got}")
        if finite and not all_finite(t):
            raise CodecError(f"PowerSGD {what} contains NaN or Inf")

    def p_step(self, m: torch.Tensor) -> torch.Tensor:
        """Phase 1: P = (M + E) Q, to be averaged across peers."""
        self._check(m, self.shape, "gradient", finite=False)  # NaN/Inf in m shows in m + E
        spare, self._spare = self._spare, None
        if spare is not None and sys.getrefcount(spare) == 2:  # only `spare` refers to it: safe to overwrite
            corrected = torch.add(m, self.error, out=spare)
        else:
            corrected = m + self.error
        if not all_finite(corrected):
            raise CodecError("PowerSGD gradient contains NaN or Inf (or overflows with the carried error)")
        self._corrected = corrected
        self._p_hat = None
        return corrected @ self.q

    def q_step(self, p_mean: torch.Tensor) -> torch.Tensor:
        """Phase 2: orthonormalize P_mean, Q = (M + E)^T P^, to be averaged across peers."""
        if self._corrected is None:
            raise RuntimeError("q_step before p_step")
        self._check(p_mean, (self.shape[0], self.rank), "P mean")
        self._p_hat = orthonormalize(p_mean)
        return self._corrected.T @ self._p_hat

    def finish(self, q_mean: torch.Tensor) -> torch.Tensor:
        """Phase 3: approx = P^ Q_mean^T (same bits on every peer); keep the error and Q_mean."""
        if self._corrected is None or self._p_hat is None:
            raise RuntimeError("finish before q_step")
        self._check(q_mean, (self.shape[1], self.rank), "Q mean")
        approx = outer_sum(self._p_hat, q_mean, subtract_from=self._corrected)
        self._spare, self.error = self.error, self._corrected
        self.q = q_mean.clone()
        self._corrected = None
        self._p_hat = None
        return approx
