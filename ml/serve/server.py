"""A block server: blocks a..b of a decoder, inference sessions with KV caches, stateless forward and
backward for clients that fine-tune parameters they own.

Pure compute and bookkeeping, no I/O: the protocol driver (ml/serve/protocol.py) calls these
methods from a worker thread. The server's weights never change (they do not require grad; a
backward pass differentiates only the inputs and the client's deep prompts and LoRA adapters, sent
with the request). Sessions are bounded in count (overall and per client), in KV-cache memory
(reserved at open for their whole `max_length`) and expire when idle. Their slots are a scoped pool
(node/admission.py, ADR 0186): clients without stake or business share half of them (a quarter
per address prefix); a client's session in use is never evicted, and a full pool evicts an idle
session of the most-represented client (or one idle past `grace_s`) instead of refusing; a paid
session (`mark_paid`), staked clients and the committee use the reserved half. Each session counts the
tokens it sent through the blocks and an estimate of the FLOPs spent.

The server computes where its model's weights are (`device`, docs/adr/0179): its KV caches are
allocated there, and its methods take and return CPU tensors (what the wire decodes and encodes),
moving them to and from the device in the worker thread that calls them. `profile` is the execution
profile it computes in (ml/serve/device.py), told to clients in "info" and "opened".
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ml.serve.model import KVCache, ServeDecoder, cache_bytes
from node.admission import PeerClass, Pool, PoolLimits

MAX_SESSIONS = 64
MAX_SESSIONS_PER_OWNER = 8
SESSION_GRACE_S = 30.0   # a session idle this long may be evicted by any newcomer when the server is full
MAX_CACHE_BYTES = 2 << 30
SESSION_TTL_S = 300.0
MAX_BATCH = 16
MAX_RANK = 64

Adapter = tuple[torch.Tensor, torch.Tensor]   # LoRA (A, B) for the served blocks


class ServeError(ValueError):
    """A request the server refuses (unknown or busy session, bad shape, out of room)."""


@dataclass
class Usage:
    tokens: int = 0
    flops: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"tokens": self.tokens, "flops": self.flops}


@dataclass
class Session:
    session_id: str
    batch: int
    caches: list[KVCache]
    reserved: int
    last_used: float
    usage: Usage = field(default_factory=Usage)
    busy: bool = False
    lora: Adapter | None = None
    prompts: torch.Tensor | None = None   # deep prompts, applied to the session's first chunk
    owner: str = ""

    @property
    def length(self) -> int:
        return self.caches[0].length if self.caches else 0


class BlockServer:
    def __init__(self, model: ServeDecoder, *, max_sessions: int = MAX_SESSIONS,
                 max_sessions_per_owner: int = MAX_SESSIONS_PER_OWNER, max_cache_bytes: int = MAX_CACHE_BYTES,
                 ttl_s: float = SESSION_TTL_S, clock: Callable[[], float] = time.monotonic,
                 lie_after: int | None = None, profile: str = "", grace_s: float = SESSION_GRACE_S,
                 unknown_sessions: int | None = None) -> None:
        if model.start == model.end:
            raise ValueError("a block server needs at least one block")
        model.eval()
        for param in model.parameters():
            param.requires_grad_(False)
        self.model, self.device, self.profile = model, model.device, profile
        self.config = model.config
        self.start, self.end = model.start, model.end
        self.max_sessions, self.max_cache_bytes, self.ttl_s = max_sessions, max_cache_bytes, ttl_s
        self.max_sessions_per_owner = max_sessions_per_owner
        self._clock = clock
        self._lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        unknown = min(max_sessions, unknown_sessions or max(1, max_sessions // 2))   # the rest is reserved
        self._slots = Pool(PoolLimits(total=max_sessions, per_peer=max_sessions_per_owner, unknown_pool=unknown,
                                      per_prefix=max(max_sessions_per_owner, unknown // 2), grace=grace_s), clock)
        self.totals = Usage()
        # adversary mode for tests and benchmarks (ADR 0176): after this many steps, every step's answer
        # is nudged (one value + 0.5), a lying server that spot checks catch and referees convict
        self.lie_after, self.steps_served = lie_after, 0

    # ---- sessions
    def cache_in_use(self) -> int:
        return sum(s.reserved for s in self.sessions.values())

    def open_session(self, session_id: str, max_length: int, batch: int = 1, lora: Adapter | None = None,
                     owner: str = "", prompts: torch.Tensor | None = None, ip: str = "",
                     owner_class: PeerClass = PeerClass.UNKNOWN) -> Session:
        """A new session (`owner`: the peer that opened it, limited to `max_sessions_per_owner`; `ip`
        its address, `owner_class` its admission class), with the client's adapter applied at every
        step and its deep prompts (blocks, batch, P, width) added to the first P positions of the first
        chunk. A full server may evict another client's idle session to make room (module docstring)."""
        if not isinstance(session_id, str) or not 1 <= len(session_id) <= 64:
            raise ServeError("a session id is 1-64 characters")
        if not isinstance(max_length, int) or not 1 <= max_length <= self.config.context:
            raise ServeError(f"max_length must be 1..{self.config.context}")
        if not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise ServeError(f"batch must be 1..{MAX_BATCH}")
        self.check_lora(lora)
        if prompts is not None:
            self._check_prompts(torch.empty(batch, max_length, self.config.width), prompts)
            prompts = prompts.to(self.device)
        lora = self._on_device(lora)
        reserved = cache_bytes(self.config, self.end - self.start, batch, max_length)
        with self._lock:
            self._expire_locked()
            if session_id in self.sessions:
                raise ServeError(f"session {session_id} is already open")
            if self._slots.count(peer=owner) >= self.max_sessions_per_owner:
                raise ServeError(f"{self.max_sessions_per_owner} sessions per client at most")
            if self.cache_in_use() + reserved > self.max_cache_bytes:
                raise ServeError(f"no room for a KV cache of {reserved} bytes")
            decision = self._slots.admit(session_id, owner, ip or owner, owner_class)
            if not decision.admitted:
                raise ServeError(f"server is full ({self.max_sessions} sessions): {decision.reason}")
            for victim in decision.evict:
                self.sessions.pop(str(victim), None)
            session = Session(session_id, batch, self.model.new_caches(batch, max_length), reserved, self._clock(),
                              lora=lora, prompts=prompts, owner=owner)
            self.sessions[session_id] = session
            return session

    def close_session(self, session_id: str) -> Usage | None:
        with self._lock:
            session = self.sessions.pop(session_id, None)
            self._slots.release(session_id)
        return None if session is None else session.usage

    def mark_paid(self, session_id: str) -> None:
        """The session's client has paid (a countersigned receipt): it holds a reserved slot now."""
        with self._lock:
            self._slots.promote(session_id, PeerClass.BUSINESS)

    def expire(self) -> list[str]:
        with self._lock:
            return self._expire_locked()

    def _expire_locked(self) -> list[str]:
        now = self._clock()
        gone = [sid for sid, s in self.sessions.items() if not s.busy and now - s.last_used > self.ttl_s]
        for sid in gone:
            del self.sessions[sid]
            self._slots.release(sid)
        return gone

    # ---- compute (blocking: call from a worker thread)
    def _check_hidden(self, hidden: torch.Tensor, batch: int | None = None) -> None:
        if hidden.dim() != 3 or hidden.shape[2] != self.config.width or hidden.shape[1] < 1:
            raise ServeError(f"hidden states must be (batch, length>=1, {self.config.width}), "
                             f"got {list(hidden.shape)}")
        if batch is not None and hidden.shape[0] != batch:
            raise ServeError(f"session has batch {batch}, got {hidden.shape[0]}")
        if not 1 <= hidden.shape[0] <= MAX_BATCH or hidden.shape[1] > self.config.context:
            raise ServeError("batch or length out of bounds")

    def _flops(self, batch: int, past: int, length: int) -> int:
        blocks = self.end - self.start
        attention = 4 * self.config.width * sum(past + i + 1 for i in range(length))
        return batch * blocks * (2 * self.config.block_params() * length + attention)

    def step(self, session_id: str, chunks: list[torch.Tensor], all_outputs: bool = False) -> torch.Tensor:
        """Run `chunks` (each (batch, length, width)) in order through the blocks with the session's
        caches and return the last chunk's output (`all_outputs`: every chunk's, concatenated). One
        chunk is a step; several replay a prefix."""
        if not chunks:
            raise ServeError("a step needs at least one chunk")
        with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise ServeError(f"no open session {session_id}")
            if session.busy:
                raise ServeError(f"session {session_id} is busy")
            for chunk in chunks:
                self._check_hidden(chunk, session.batch)
            if session.prompts is not None and session.length == 0 and chunks[0].shape[1] < session.prompts.shape[2]:
                raise ServeError(f"the first chunk must cover the {session.prompts.shape[2]} prompt positions")
            total = sum(c.shape[1] for c in chunks)
            if session.length + total > session.caches[0].max_length:
                raise ServeError(f"session of {session.caches[0].max_length} positions cannot take {total} more "
                                 f"after {session.length}")
            session.busy = True
            self._slots.set_busy(session_id, True)
        try:
            outs = []
            with torch.no_grad():
                for chunk in (c.to(self.device) for c in chunks):
                    past = session.length
                    prompts = session.prompts if past == 0 else None
                    outs.append(self.model.run_blocks(chunk, session.caches, prompts=prompts, lora=session.lora))
                    self._count(session.usage, chunk.shape[0], past, chunk.shape[1])
            out = (torch.cat(outs, 1) if all_outputs else outs[-1]).cpu()
            self.steps_served += 1
            if self.lie_after is not None and self.steps_served > self.lie_after:
                out = out.clone()
                out[0, -1, 0] += 0.5
            return out
        finally:
            with self._lock:
                session.busy = False
                session.last_used = self._clock()
                self._slots.set_busy(session_id, False)

    def _count(self, usage: Usage, batch: int, past: int, length: int, factor: int = 1) -> None:
        flops = factor * self._flops(batch, past, length)
        for total in (usage, self.totals):
            total.tokens += batch * length
            total.flops += flops

    def _check_prompts(self, hidden: torch.Tensor, prompts: torch.Tensor | None) -> None:
        if prompts is None:
            return
        blocks = self.end - self.start
        if (prompts.dim() != 4 or prompts.shape[0] != blocks or prompts.shape[1] != hidden.shape[0]
                or prompts.shape[3] != self.config.width or not 1 <= prompts.shape[2] <= hidden.shape[1]):
            raise ServeError(f"prompts must be ({blocks}, batch, P<=length, {self.config.width}), "
                             f"got {list(prompts.shape)}")

    def _on_device(self, lora: Adapter | None) -> Adapter | None:
        return None if lora is None else (lora[0].to(self.device), lora[1].to(self.device))

    def check_lora(self, lora: Adapter | None) -> None:
        if lora is None:
            return
        a, b = lora
        blocks, width = self.end - self.start, self.config.width
        if (a.dim() != 3 or b.dim() != 3 or a.shape[0] != blocks or b.shape[0] != blocks
                or a.shape[2] != width or b.shape[1] != 3 * width or not 1 <= a.shape[1] == b.shape[2] <= MAX_RANK):
            raise ServeError(f"lora must be A ({blocks}, r, {width}) and B ({blocks}, {3 * width}, r), "
                             f"1 <= r <= {MAX_RANK}")

    def forward(self, hidden: torch.Tensor, prompts: torch.Tensor | None = None, lora: Adapter | None = None,
                usage: Usage | None = None) -> torch.Tensor:
        """A stateless pass over whole sequences (fine-tuning's forward)."""
        self._check_hidden(hidden)
        self._check_prompts(hidden, prompts)
        self.check_lora(lora)
        with torch.no_grad():
            out = self.model.run_blocks(hidden.to(self.device), prompts=None if prompts is None else
                                        prompts.to(self.device), lora=self._on_device(lora))
        self._count(usage or Usage(), hidden.shape[0], 0, hidden.shape[1])
        return out.cpu()

    def backward(self, hidden: torch.Tensor, grad_output: torch.Tensor, prompts: torch.Tensor | None = None,
                 lora: Adapter | None = None, usage: Usage | None = None) -> dict[str, torch.Tensor]:
        """Recompute the pass over `hidden` and return the gradients of <output, grad_output> with
        respect to the hidden states ("grad_h"), the prompts ("grad_prompts") and the adapters
        ("grad_lora_a", "grad_lora_b"); the server's weights get no gradient."""
        self._check_hidden(hidden)
        self._check_prompts(hidden, prompts)
        self.check_lora(lora)
        if grad_output.shape != hidden.shape:
            raise ServeError(f"grad must have the shape of the hidden states {list(hidden.shape)}")
        leaves = {"grad_h": hidden}
        if prompts is not None:
            leaves["grad_prompts"] = prompts
        if lora is not None:
            leaves["grad_lora_a"], leaves["grad_lora_b"] = lora
        leaves = {name: t.detach().to(self.device, copy=True).requires_grad_(True) for name, t in leaves.items()}
        adapter = None if lora is None else (leaves["grad_lora_a"], leaves["grad_lora_b"])
        with torch.enable_grad():   # run_blocks pins this thread's numerics for the backward too
            out = self.model.run_blocks(leaves["grad_h"], prompts=leaves.get("grad_prompts"), lora=adapter)
            grads = torch.autograd.grad(out, list(leaves.values()), grad_outputs=grad_output.to(self.device))
        self._count(usage or Usage(), hidden.shape[0], 0, hidden.shape[1], factor=3)   # recompute + backward ~ 3x
        return {name: grad.cpu() for name, grad in zip(leaves, grads)}
