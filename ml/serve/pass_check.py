"""Recomputing a tuning pass (ADR 0183): what an honest server answers to a recorded forward or backward.

A pass record (billing.PassRecord, kept for a pass chosen to check) holds what the server decoded: the
resolved inputs "h", the output gradient "grad" of a backward, the deep prompts and LoRA adapters sent
with it, and "base", a delta forward's answer base in the client's book. `recompute_pass` runs the
server's own stateless `forward` / `backward` (ml/serve/server.py, pinned numerics in run_blocks) on
the checker's copy of the blocks and returns the answer as the client would have resolved it after
the wire codec, so an honest server in the same profile matches bit for bit.
"""
from __future__ import annotations

import torch

from ml.serve.model import ServeDecoder
from ml.serve.server import BlockServer
from ml.serve.wire import roundtrip


def recompute_pass(blocks: ServeDecoder, kind: str, codec: str,
                   sent: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The answer an honest server gives to the pass (blocking: torch): {"h"} for a forward, the
    gradients {"grad_h", ...} for a backward, each after the wire codec (and the delta base)."""
    server = BlockServer(blocks)
    lora = (sent["lora_a"], sent["lora_b"]) if "lora_a" in sent else None
    if kind == "forward":
        out = server.forward(sent["h"], sent.get("prompts"), lora)
        base = sent.get("base")
        return {"h": roundtrip(out, codec) if base is None else base + roundtrip(out - base, codec)}
    if kind == "backward":
        grads = server.backward(sent["h"], sent["grad"], sent.get("prompts"), lora)
        return {name: roundtrip(grad, codec) for name, grad in grads.items()}
    raise ValueError(f"a pass is forward or backward, not {kind!r}")


def same_answer(expected: dict[str, torch.Tensor], received: dict[str, torch.Tensor]) -> bool:
    return expected.keys() == received.keys() and all(torch.equal(expected[n], received[n]) for n in expected)
