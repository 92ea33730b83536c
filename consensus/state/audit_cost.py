"""What a task's audits cost against its work, and the surcharge a task with too few segments pays
(docs/adr/0212).

Each committed worker gets ``audits_per_worker`` slots per epoch (a task without epochs is one; ADR 0230);
each replays one of the epoch's segments, twice with probability ``audit_double_bps``. So the audits replay,
in expectation, a share m x (1 + p) x E / K of the job's work (K segments in E epochs). A task whose share is
above ``max_audit_share_bps`` pays the excess, as that share of its price, on top of the price: the surcharge
is escrowed at submit and goes to the verifier pool at finalize. A job cut into enough segments (the CLI picks
them so) pays none. No I/O.
"""
from __future__ import annotations

from consensus.genesis import Params


def audit_share_bps(params: Params, segments: int, epochs: int = 1) -> int:
    """The share of a task's work its audits replay in expectation, in basis points (rounded up): each of
    its ``epochs`` is audited on its own (docs/adr/0230)."""
    replays = params.audits_per_worker * (10_000 + params.audit_double_bps) * max(1, epochs)
    return -(-replays // max(1, segments))


def audit_surcharge(params: Params, price: int, segments: int, epochs: int = 1) -> int:
    """What the owner of a task of ``price`` cut into ``segments`` in ``epochs`` pays on top for its audits:
    the part of the audit share above ``max_audit_share_bps``, as a share of the price (0 when within it)."""
    excess = audit_share_bps(params, segments, epochs) - params.max_audit_share_bps
    return price * excess // 10_000 if excess > 0 else 0


def min_segments(params: Params) -> int:
    """The fewest segments (per epoch) at which a task's audit share stays within ``max_audit_share_bps``."""
    replays = params.audits_per_worker * (10_000 + params.audit_double_bps)
    return max(1, -(-replays // max(1, params.max_audit_share_bps)))


DEFAULT_SEGMENT_STEPS = 10   # what a data-parallel spec uses when nothing says otherwise (ml/train/spec.py)


def segment_steps_for(params: Params, steps: int) -> int:
    """The segment length a client picks for a data-parallel job of ``steps`` steps when its user names
    none: ``DEFAULT_SEGMENT_STEPS``, or shorter so the job has at least 4/3 of ``min_segments`` segments
    (the quarter left over covers each replay's fixed cost: loading the checkpoint, building the model;
    docs/adr/0212). A job shorter than that gets one step a segment and pays the surcharge."""
    target = -(-min_segments(params) * 4 // 3)
    return max(1, min(DEFAULT_SEGMENT_STEPS, steps // target))
