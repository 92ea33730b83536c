"""Fine-tuning through block servers of parameters the client owns (ADR 0172).

`RemoteTuner` holds an input soft prompt, deep prompts and/or LoRA adapters, runs the chain of
servers forward (stateless passes), the head and loss locally, the chain backward, and steps Adam;
the servers return gradients and never change their weights. A failed server is swapped for a spare
with the same blocks. With example ids, activations travel as deltas (ml/serve/delta.py). The
parameters, the ends, the head and the loss live on the ends' device (CPU or CUDA, docs/adr/0179);
what goes to and comes from the servers is on the CPU.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ml.serve.adapters import ClientParams
from ml.serve.billing import ClientMeter, max_flops_per_token, pass_evidence
from ml.serve.client import NoChain, ServerInfo, plan_chain
from ml.serve.delta import DeltaBook
from ml.serve.model import ServeDecoder
from ml.serve.pass_check import recompute_pass, same_answer
from ml.serve.protocol import Payer, RemoteError, SpanClient, SpanUnavailable
from ml.serve.wire import roundtrip as wire_roundtrip


@dataclass(frozen=True)
class PassCheck:
    """A tuning spot check's outcome for one span: the first kept pass whose answer differs from the
    local recompute (its number in its server's stream, its kind), that server and its evidence
    (billing.pass_evidence: the countersigned receipt covering the wrong answer)."""
    span: int
    blocks: tuple[int, int]
    ok: bool
    checked: int                    # kept passes compared
    wrong_pass: int | None = None
    kind: str | None = None
    culprit: str | None = None
    evidence: dict | None = None


class RemoteTuner:
    """Fine-tuning through block servers of parameters the client owns: with `prompt_length` P > 0 an
    input soft prompt (P, width) prepended to the embedded tokens and deep prompts (layers, P, width)
    added to the first P positions before each block; with `lora_rank` r > 0 LoRA adapters on every
    block's qkv projection (A (layers, r, width), B (layers, 3 width, r), B starting at zero). The
    servers run forward and backward passes and return the gradients; only these parameters change.

    With a `payer`, every pass extends its server's countersigned transcript (ADR 0183), and the passes
    numbered in `check_passes` (per server stream: forward and backward alternate, 0-based) keep what
    was sent and received, for `spot_check`."""

    def __init__(self, host, ends: ServeDecoder, servers: list[ServerInfo], prompt_length: int = 4,
                 lora_rank: int = 0, codec: str = "f32", lr: float = 1e-2, seed: int = 0, payer: Payer | None = None,
                 check_passes: frozenset[int] = frozenset()):
        config = ends.config
        self.payer = payer   # set: sign usage receipts for every server (ADR 0174)
        self.check_passes = frozenset(check_passes)
        self.streams: list[SpanClient] = []   # every server stream opened, failed-over ones included
        if prompt_length < 0 or lora_rank < 0 or prompt_length + lora_rank == 0:
            raise ValueError("tune prompts (prompt_length > 0), adapters (lora_rank > 0) or both")
        self.host, self.ends, self.codec, self.prompt_length = host, ends, codec, prompt_length
        self.servers, self.failovers = list(servers), 0
        self.dead: set[str] = set()
        self.chain = [self._span(s) for s in plan_chain(servers, config.layers)]
        self.books = [(DeltaBook(), DeltaBook()) for _ in self.chain]   # per span: inputs sent, outputs received
        gen = torch.Generator().manual_seed(seed)
        self.params: dict[str, torch.nn.Parameter] = {}
        if prompt_length:
            self.params["input_prompt"] = torch.nn.Parameter(0.02 * torch.randn(prompt_length, config.width,
                                                                                generator=gen))
            self.params["deep_prompts"] = torch.nn.Parameter(torch.zeros(config.layers, prompt_length, config.width))
        if lora_rank:
            scale = 1.0 / config.width ** 0.5
            self.params["lora_a"] = torch.nn.Parameter(scale * torch.randn(config.layers, lora_rank, config.width,
                                                                           generator=gen))
            self.params["lora_b"] = torch.nn.Parameter(torch.zeros(config.layers, 3 * config.width, lora_rank))
        self.device = ends.device   # initialised on the CPU (the same values on any device), then moved
        self.params = {name: torch.nn.Parameter(p.detach().to(self.device)) for name, p in self.params.items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)
        for param in ends.parameters():
            param.requires_grad_(False)

    @property
    def tuned(self) -> ClientParams:
        """The current parameters (detached), for generation or saving."""
        return ClientParams(**{name: p.detach().cpu().clone() for name, p in self.params.items()})

    def _inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first span's input (on the CPU)."""
        embedded = self.ends.embed_tokens(tokens[:, :-1], offset=self.prompt_length)
        if not self.prompt_length:
            return embedded.cpu()
        prompt = self.params["input_prompt"].detach().expand(tokens.shape[0], -1, -1)
        return torch.cat([prompt + self.ends.position[:self.prompt_length], embedded], 1).cpu()

    def _span_args(self, span: SpanClient, batch: int):
        """The span's (deep prompts, LoRA), on the CPU for the wire."""
        return ClientParams(**{name: p.detach().cpu() for name, p in self.params.items()}).for_span(
            span.start, span.end, batch)

    def _loss(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.ends.logits(hidden)[:, self.prompt_length:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1).to(logits.device))

    async def step(self, tokens: torch.Tensor, ids: list[int] | None = None) -> float:
        """One optimizer step on `tokens` (batch, length + 1): next-token loss on the real positions.
        With `ids` (one per example, stable across steps), activations travel as deltas against the
        example's previous ones (ml/serve/delta.py), and the backward reuses the server's copy."""
        batch = tokens.shape[0]
        hidden, inputs = self._inputs(tokens), []
        for index, span in enumerate(self.chain):
            deep, lora = self._span_args(span, batch)
            seen, hidden = await self._forward(index, hidden, deep, lora, ids)
            inputs.append(seen)
        leaf = hidden.detach().to(self.device).requires_grad_(True)
        loss = self._loss(leaf, tokens)
        loss.backward()
        assert leaf.grad is not None   # the loss depends on the servers' output
        grad = leaf.grad.cpu()
        grads = {name: torch.zeros_like(p) for name, p in self.params.items()}
        for index in reversed(range(len(self.chain))):
            span = self.chain[index]
            deep, lora = self._span_args(span, batch)
            got = await self._backward(index, inputs[index], grad, deep, lora, ids)
            grad = got["grad_h"]
            if deep is not None:
                grads["deep_prompts"][span.start:span.end] = got["grad_prompts"].sum(1).to(self.device)
            if lora is not None:
                grads["lora_a"][span.start:span.end] = got["grad_lora_a"].to(self.device)
                grads["lora_b"][span.start:span.end] = got["grad_lora_b"].to(self.device)
        if self.prompt_length:
            grads["input_prompt"] = grad[:, :self.prompt_length].sum(0).to(self.device)
        self.optimizer.zero_grad()
        for name, param in self.params.items():
            param.grad = grads[name]
        self.optimizer.step()
        return float(loss.detach())

    async def loss(self, tokens: torch.Tensor) -> float:
        """The loss without a step (forward passes only, activations sent whole)."""
        hidden = self._inputs(tokens)
        with torch.no_grad():
            for index, span in enumerate(self.chain):
                deep, lora = self._span_args(span, tokens.shape[0])
                _, hidden = await self._forward(index, hidden, deep, lora, None)
            return float(self._loss(hidden.to(self.device), tokens))

    async def _forward(self, index: int, hidden: torch.Tensor, deep, lora,
                       ids: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the input as the server has it, its output) for span `index`, failing over if needed."""
        while True:
            span = self.chain[index]
            try:
                if ids is None:
                    return hidden, await span.forward(hidden, deep, self.codec, lora)
                sent, received = self.books[index]
                delta = sent.delta(ids, hidden)
                seen = sent.commit(ids, wire_roundtrip(delta, self.codec))
                base = received.bases(ids, tuple(hidden.shape[1:]))
                out = await span.forward(delta, deep, self.codec, lora, ids=ids, seen=seen, base=base)
                return seen, received.commit(ids, out)
            except (SpanUnavailable, RemoteError):
                self._failover(index)

    async def _backward(self, index: int, span_input: torch.Tensor, grad: torch.Tensor, deep, lora,
                        ids: list[int] | None) -> dict[str, torch.Tensor]:
        fresh = False   # a replacement server has no stored activations: send them
        while True:
            span = self.chain[index]
            try:
                if ids is not None and not fresh:
                    return await span.backward(None, grad, deep, self.codec, lora, ids=ids, seen=span_input)
                return await span.backward(span_input, grad, deep, self.codec, lora)
            except (SpanUnavailable, RemoteError):
                self._failover(index)
                fresh = True

    def _failover(self, index: int) -> None:
        """Replace span `index` by a live server with the same blocks (passes are stateless)."""
        span = self.chain[index]
        span.abort()
        self.dead.add(span.peer_id)
        spare = next((s for s in self.servers if (s.start, s.end) == (span.start, span.end)
                      and s.peer_id not in self.dead), None)
        if spare is None:
            raise NoChain(f"no live server for blocks {span.start}:{span.end}")
        self.chain[index] = self._span(spare)
        self.books[index] = (DeltaBook(), DeltaBook())
        self.failovers += 1

    def _span(self, server: ServerInfo) -> SpanClient:
        meter = None if self.payer is None else ClientMeter(
            self.payer.identity, self.payer.chain_id, self.payer.max_price_per_gflop,
            max_flops_per_token(self.ends.config, server.end - server.start))
        span = SpanClient(self.host, server.peer_id, server.start, server.end, meter=meter)
        span.check_passes = self.check_passes
        self.streams.append(span)
        return span

    def spot_check(self, index: int, part: ServeDecoder) -> PassCheck:
        """Recompute the kept passes (`check_passes`) of every stream that served span `index` with
        `part` (the client's own copy of those blocks, in the servers' profile) through the server's own
        forward/backward, and compare the answers bit for bit (blocking: torch; call it after `close`,
        which has the last pass's receipt countersigned)."""
        start, end = self.chain[index].start, self.chain[index].end
        if (part.start, part.end) != (start, end):
            raise ValueError(f"span {index} is blocks {start}:{end}, the part holds {part.start}:{part.end}")
        checked = 0
        for stream in (s for s in self.streams if (s.start, s.end) == (start, end) and s.meter is not None):
            assert stream.meter is not None
            for number, record in enumerate(stream.meter.passes):
                if record.sent is None or record.received is None:
                    continue
                checked += 1
                if not same_answer(recompute_pass(part, record.kind, record.codec, record.sent), record.received):
                    return PassCheck(index, (start, end), False, checked, number, record.kind, stream.peer_id,
                                     pass_evidence(stream.meter, number))
        return PassCheck(index, (start, end), True, checked)

    async def close(self) -> None:
        await asyncio.gather(*(span.close() for span in self.chain), return_exceptions=True)


async def time_lora_tuning(host, ends, servers, codec: str, lr: float, steps: int) -> dict:
    """What the serving benchmarks report for fine-tuning: a rank-4 LoRA adapter fitted through
    `servers` to a repeating 16-byte text; loss before and after `steps` steps and seconds per step."""
    tuner = RemoteTuner(host, ends, servers, prompt_length=0, lora_rank=4, codec=codec, lr=lr)
    text = torch.tensor(list(b"serve the blocks") * 8)
    batch = torch.stack([text[i:i + 65] for i in range(0, 16, 4)])
    try:
        result = {"tune_loss_before": round(await tuner.loss(batch), 4)}
        began = time.perf_counter()
        for _ in range(steps):
            await tuner.step(batch)
        result["tune_step_s"] = round((time.perf_counter() - began) / steps, 4)
        result["tune_loss_after"] = round(await tuner.loss(batch), 4)
        return result
    finally:
        await tuner.close()
