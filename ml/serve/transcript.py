"""What a serving transcript commits to (ADR 0176): one link per inference step or tuning pass.

A link is sha256 over the canonical encoding of the step: the block range, the codec, the chunk
lengths, whether every chunk's answer was returned, the digest of the hidden states the server
decoded, the digest of the answer as the client decodes it, and the session's setup (its adapter
and deep prompts, ZERO without). The transcript a billing server
reports (and countersigns in receipts) is the chain sha256(previous || link), so a signed receipt
commits to every input and answer of the session: a referee holding the inputs can recompute a step
and see whether the server's answer was right, and nobody can claim other inputs than those served.

A fine-tuning pass (a stateless "forward" or "backward", ADR 0183) links under its own domain: its
kind, the block range, the codec, the digests of the inputs the server resolved (a delta's sum with its
base, not the delta), of the output gradient (ZERO for a forward), of the setup sent with it, of the
answer as the client resolves it (a forward's output; a backward's gradients, `grads_digest`) and of a
delta forward's answer base (ZERO otherwise: a referee recomputes base + codec(output - base)).
"""
from __future__ import annotations

import hashlib

import torch

from consensus.encoding import encode

ZERO = bytes(32)
LINK_DOMAIN = "dekube/serve-step/v1"
PASS_DOMAIN = "dekube/serve-pass/v1"
PASS_KINDS = ("forward", "backward")


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """sha256 of a tensor's shape and float32 bytes (contiguous, read on the CPU from any device)."""
    data = tensor.detach().to(torch.float32).cpu().contiguous()
    return hashlib.sha256(encode(list(data.shape)) + data.numpy().tobytes()).digest()


def setup_digest(lora: tuple[torch.Tensor, torch.Tensor] | None, prompts: torch.Tensor | None) -> bytes:
    """What a session was opened with beyond its blocks (the client's adapter and deep prompts, as the
    server decoded them): ZERO for a plain session."""
    if lora is None and prompts is None:
        return ZERO
    parts = [tensor_digest(t) if t is not None else ZERO for t in (*(lora or (None, None)), prompts)]
    return hashlib.sha256(b"".join(parts)).digest()


def step_link(start: int, end: int, codec: str, chunks: list[int], all_outputs: bool, inputs: bytes,
              answer: bytes, setup: bytes = ZERO) -> bytes:
    """The link of one step: blocks start..end, in a session opened with `setup` (setup_digest), ran
    `chunks` (lengths) of the hidden states whose digest is `inputs` and answered the states whose
    digest is `answer`."""
    return hashlib.sha256(encode([LINK_DOMAIN, start, end, codec, list(chunks), bool(all_outputs), inputs,
                                  answer, setup])).digest()


def grads_digest(grads: dict[str, torch.Tensor]) -> bytes:
    """sha256 over a backward's gradients, by name in sorted order."""
    names = sorted(grads)
    return hashlib.sha256(encode(names) + b"".join(tensor_digest(grads[name]) for name in names)).digest()


def pass_link(kind: str, start: int, end: int, codec: str, inputs: bytes, grad: bytes, answer: bytes,
              setup: bytes = ZERO, base: bytes = ZERO) -> bytes:
    """The link of one tuning pass (`kind` "forward" or "backward") over blocks start..end (`base`: the
    digest of a delta forward's answer base, which the resolved answer is base + decoded delta of)."""
    if kind not in PASS_KINDS:
        raise ValueError(f"a pass is one of {PASS_KINDS}, not {kind!r}")
    return hashlib.sha256(encode([PASS_DOMAIN, kind, start, end, codec, inputs, grad, answer, setup,
                                  base])).digest()


def extend(transcript: bytes, link: bytes) -> bytes:
    return hashlib.sha256(transcript + link).digest()


def chain(links: list[bytes], start: bytes = ZERO) -> bytes:
    value = start
    for link in links:
        value = extend(value, link)
    return value
