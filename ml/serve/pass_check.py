"""Recomputing a tuning pass (ADR 0183): what an honest server answers to a recorded forward or backward.

A pass record (billing.PassRecord, kept for a pass chosen to check) holds what the server decoded: the
resolved inputs "h", the output gradient "grad" of a backward, the deep prompts and LoRA adapters sent
with it, and "base", a delta forward's answer base in the client's book. `recompute_pass` runs the
server's own stateless `forward` / `backward` (ml/serve/server.py, pinned numerics in run_blocks) on
the checker's copy of the blocks and returns the answer as the client would have resolved it after
the wire codec, so an honest server in the same profile matches bit for bit.

A pass is disputed with a **pass bundle** (`encode_pass_bundle`, one wire frame like a step bundle):
the pass's kind, blocks, codec and answer digest and those tensors, which must hash to the disputed
link; a referee recomputes the pass and votes the digest of the honest answer (`pass_bundle_output`).
The claim on chain is the step claim's (ADR 0176): the link alone says it is a pass.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ml.serve.billing import PassRecord
from ml.serve.model import ServeDecoder
from ml.serve.server import BlockServer
from ml.serve.transcript import PASS_KINDS, ZERO, grads_digest, pass_link, setup_digest, tensor_digest
from ml.serve.wire import CODECS, encode_frame, roundtrip

if TYPE_CHECKING:
    from ml.serve.dispute import Claim


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


PASS_BUNDLE = "dispute-pass"
PASS_TENSORS = ("h", "grad", "prompts", "lora_a", "lora_b", "base")


def encode_pass_bundle(model: str, record: PassRecord) -> bytes:
    """The dispute bundle of one tuning pass (a kept one: PassRecord.sent), one wire frame with its length
    prefix: a header naming the model, the pass's kind, blocks, codec and answer digest, and the tensors
    the server decoded (f32), which hash to the pass's link."""
    if record.sent is None:
        raise ValueError("only a pass kept for checking (check_passes) can be disputed")
    header = {"type": PASS_BUNDLE, "model": model, "kind": record.kind, "start": record.start, "end": record.end,
              "codec": record.codec, "answer": record.answer.hex()}
    return encode_frame(header, dict(record.sent), "f32")


def pass_bundle_output(header: dict[str, Any], tensors: dict[str, torch.Tensor], claim: Claim,
                       blocks: ServeDecoder) -> bytes:
    """A referee's output for a pass bundle (blocking: torch): the bundle must be for the claim's model
    and blocks, its tensors must hash to the claim's link and its answer be the claim's; then the pass
    is recomputed (`recompute_pass`) and the digest of the honest answer returned. Raises ValueError
    for a bundle that does not check out."""
    kind, codec = header.get("kind"), header.get("codec")
    if (header.get("model") != claim.model or kind not in PASS_KINDS or codec not in CODECS
            or header.get("start") != claim.start or header.get("end") != claim.end):
        raise ValueError("pass bundle names another model or blocks, or no pass kind or codec")
    if set(tensors) - set(PASS_TENSORS) or "h" not in tensors or ("lora_a" in tensors) != ("lora_b" in tensors):
        raise ValueError("pass bundle tensors are not a pass's inputs and setup")
    if ("grad" in tensors) != (kind == "backward") or ("base" in tensors and kind != "forward"):
        raise ValueError("a backward carries its grad, only a forward a base")
    try:
        answer = bytes.fromhex(str(header.get("answer", "")))
    except ValueError:
        raise ValueError("pass bundle answer is not hex") from None
    lora = (tensors["lora_a"], tensors["lora_b"]) if "lora_a" in tensors else None
    digest = {name: tensor_digest(tensors[name]) if name in tensors else ZERO for name in ("h", "grad", "base")}
    link = pass_link(kind, claim.start, claim.end, codec, digest["h"], digest["grad"], answer,
                     setup_digest(lora, tensors.get("prompts")), digest["base"])
    if link != claim.link or answer != claim.answer:
        raise ValueError("pass bundle does not hash to the disputed link and answer")
    try:
        honest = recompute_pass(blocks, kind, codec, tensors)
    except (RuntimeError, ValueError, IndexError) as exc:   # shapes the server refuses or torch cannot run
        raise ValueError(f"pass bundle does not run on the blocks: {str(exc)[:200]}") from None
    return grads_digest(honest) if kind == "backward" else tensor_digest(honest["h"])
