"""The serving client: chains block servers to run a decoder it holds only the ends of.

`plan_chain` picks servers whose ranges tile blocks 0..layers, the fastest chain by the client's own
measurements (`measure`), else the fewest hops. `RemoteGenerator` generates greedily token by token: it embeds
tokens locally, sends the hidden states through the chain (each server keeps the session's KV
cache), and reads the next token from the head. It records every chunk it sent each span; when a
server fails mid-generation, it re-plans that span's blocks over live servers (one with the same
range, or several) and sends them the recorded chunks plus the current one, so their caches hold
exactly what the dead one had and the output continues unchanged. `local_generate` runs the same chunks through a
whole local model: in bit-exact mode ("f32") both give the same tokens.

`RemoteTuner` fine-tunes parameters the client owns (an input soft prompt, deep prompts added
before every block, LoRA adapters on every block's qkv projection) with forward and backward passes
through the servers; what it learnt can then be used for generation (`RemoteGenerator(tuned=...)`:
adapters applied at every step, deep prompts sent at session open and added to the first chunk).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ml.serve.adapters import ClientParams
from ml.serve.delta import DeltaBook
from ml.serve.model import ServeDecoder
from ml.serve.protocol import RemoteError, SpanClient, SpanUnavailable
from ml.serve.wire import roundtrip as wire_roundtrip


class NoChain(RuntimeError):
    """No live servers cover all blocks (or a failed span has no replacement)."""


@dataclass(frozen=True)
class ServerInfo:
    peer_id: str
    start: int
    end: int


def plan_chain(servers: list[ServerInfo], layers: int, dead: set[str] = frozenset(),
               speed: dict[str, float] | None = None, start: int = 0) -> list[ServerInfo]:
    """Servers whose ranges tile blocks start..layers: the least estimated time per token first (the
    sum of 1 / `speed`, the measured tokens/s of each hop, latency included; a server measured at 0
    counts as unusable, one not measured as free), then the fewest hops, then the order given."""
    live = [s for s in servers if s.peer_id not in dead and start <= s.start < s.end <= layers]
    order = {id(s): i for i, s in enumerate(live)}
    speed = speed or {}

    def hop_time(peer_id: str) -> float:
        if peer_id not in speed:
            return 0.0
        return 1.0 / speed[peer_id] if speed[peer_id] > 0 else float("inf")

    def rank(path: list[ServerInfo]) -> tuple:
        return sum(hop_time(s.peer_id) for s in path), len(path), [order[id(s)] for s in path]

    best: dict[int, list[ServerInfo]] = {start: []}
    for position in range(start, layers):          # best tiling by dynamic programming over start positions
        if position not in best:
            continue
        for server in (s for s in live if s.start == position):
            path = best[position] + [server]
            if server.end not in best or rank(path) < rank(best[server.end]):
                best[server.end] = path
    if layers not in best:
        raise NoChain(f"no live servers cover blocks {start}:{layers}")
    return best[layers]


async def measure(host, servers: list[ServerInfo], width: int, tokens: int = 8) -> dict[str, float]:
    """Tokens per second each server answers for a stateless forward of `tokens` positions
    (latency included): the client's own measurement, not the server's claim."""
    speed = {}
    for server in servers:
        client = SpanClient(host, server.peer_id, server.start, server.end, timeout=15.0)
        try:
            began = time.perf_counter()
            await client.forward(torch.zeros(1, tokens, width), None, "f16")
            speed[server.peer_id] = tokens / (time.perf_counter() - began)
        except (SpanUnavailable, RemoteError):
            speed[server.peer_id] = 0.0
        finally:
            await client.close()
    return speed


def greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits[0, -1]))


def local_generate(model: ServeDecoder, prompt: list[int], max_new_tokens: int,
                   tuned: ClientParams | None = None) -> list[int]:
    """Greedy tokens from the whole model, in the chunks the remote generator uses (prefix, then one
    token at a time), with the client's tuned parameters if any."""
    tuned = tuned or ClientParams()
    offset = tuned.prompt_length
    caches = model.new_caches(1, offset + len(prompt) + max_new_tokens)
    deep, lora = tuned.for_span(0, model.config.layers)
    out: list[int] = []
    with torch.no_grad():
        hidden = first_chunk(model, tuned, prompt)
        hidden = model.run_blocks(hidden, caches, prompts=deep, lora=lora)
        for step in range(max_new_tokens):
            out.append(greedy(model.logits(hidden)))
            if step + 1 < max_new_tokens:
                position = offset + len(prompt) + step
                hidden = model.run_blocks(model.embed_tokens(torch.tensor([[out[-1]]]), position), caches, lora=lora)
    return out


def first_chunk(ends: ServeDecoder, tuned: ClientParams, prompt: list[int]) -> torch.Tensor:
    """The hidden states of the first step: the soft prompt (if any), then the embedded prompt."""
    embedded = ends.embed_tokens(torch.tensor([prompt]), tuned.prompt_length)
    prefix = tuned.prefix(ends)
    return embedded if prefix is None else torch.cat([prefix, embedded], 1)


@dataclass
class GenerationStats:
    replays: int = 0
    recover_s: list[float] = field(default_factory=list)
    steps: int = 0
    bytes_sent: int = 0       # frames to servers, replays included
    bytes_received: int = 0

    def add_traffic(self, client: SpanClient) -> None:
        self.bytes_sent += client.bytes_sent
        self.bytes_received += client.bytes_received


@dataclass(frozen=True)
class SpotCheck:
    span: int
    blocks: tuple[int, int]
    ok: bool
    first_bad_step: int | None     # the first chunk whose answer differs
    culprit: str | None            # the server that gave it


class RemoteGenerator:
    def __init__(self, host, ends: ServeDecoder, servers: list[ServerInfo], codec: str = "f32",
                 speed: dict[str, float] | None = None, tuned: ClientParams | None = None):
        if not ends.has_ends:
            raise ValueError("the client needs the model's ends (embeddings, norm, head)")
        self.host, self.ends, self.servers, self.codec, self.speed = host, ends, list(servers), codec, speed
        self.tuned = (tuned or ClientParams()).check(ends.config)   # the client's adapters and prompts
        self.dead: set[str] = set()
        self.stats = GenerationStats()
        self.chain: list[SpanClient] = []
        self.spans: list[tuple[int, int]] = []
        self.history: list[list[torch.Tensor]] = []                 # per span: the chunks sent, in order
        self.outputs: list[list[tuple[str, torch.Tensor | None]]] = []   # per span: (server, answer) per chunk
        self._max_length = 0

    async def _open(self, server: ServerInfo) -> SpanClient:
        client = SpanClient(self.host, server.peer_id, server.start, server.end)
        deep, lora = self.tuned.for_span(server.start, server.end)
        try:
            await client.open(self._max_length, lora=lora, codec=self.codec, prompts=deep)
        except RemoteError:
            client.abort()
            raise
        return client

    async def start(self, max_length: int) -> None:
        """Open a session on each server of the best chain; a server that cannot be opened is marked
        dead and the chain planned again."""
        self._max_length = max_length
        while True:
            plan = plan_chain(self.servers, self.ends.config.layers, self.dead, self.speed)
            opened: list[SpanClient] = []
            try:
                for server in plan:
                    opened.append(await self._open(server))
            except (SpanUnavailable, RemoteError):
                self.dead.add(plan[len(opened)].peer_id)
                await asyncio.gather(*(client.close() for client in opened), return_exceptions=True)
                continue
            break
        self.chain = opened
        self.spans = [(s.start, s.end) for s in plan]
        self.history = [[] for _ in plan]
        self.outputs = [[] for _ in plan]

    async def _step_span(self, index: int, hidden: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Span `index`'s answer to `hidden` and the index of the span after it (a failed span may be
        replaced by several)."""
        client = self.chain[index]
        try:
            out = await client.step([hidden], self.codec)
        except (SpanUnavailable, RemoteError):
            client.abort()
            self.stats.add_traffic(client)
            self.dead.add(client.peer_id)
            return await self._recover(index, hidden)
        self.history[index].append(hidden)
        self.outputs[index].append((client.peer_id, out))
        return out, index + 1

    async def _recover(self, index: int, hidden: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Replace the failed span `index` by live servers tiling its blocks (one with the same range
        if any, else several) and replay its recorded chunks plus `hidden` through them."""
        began = time.perf_counter()
        start, end = self.spans[index]
        chunks = self.history[index] + [hidden]
        while True:
            plan = plan_chain(self.servers, end, self.dead, self.speed, start=start)
            clients, histories, answers, inputs = [], [], [], chunks
            try:
                for position, server in enumerate(plan):
                    client = await self._open(server)
                    clients.append(client)
                    last = position == len(plan) - 1
                    out = await client.step(inputs, self.codec, all_outputs=not last)
                    histories.append(inputs)
                    if last:   # its answers to the replayed chunks were not asked for
                        answers.append([(client.peer_id, None)] * (len(inputs) - 1) + [(client.peer_id, out)])
                    else:   # the next server replays this one's answers to every chunk
                        inputs = list(torch.split(out, [c.shape[1] for c in inputs], dim=1))
                        answers.append([(client.peer_id, o) for o in inputs])
            except (SpanUnavailable, RemoteError):
                failed = clients[-1] if len(clients) > len(histories) else None
                for client in clients:
                    client.abort()
                    self.stats.add_traffic(client)
                self.dead.add(failed.peer_id if failed is not None else plan[len(clients)].peer_id)
                continue
            break
        # the replaced span's earlier answers stay on record (with the server that gave them) for the
        # first new span only when the range is unchanged; otherwise the new spans' replies are the record
        if len(plan) == 1:
            answers[0] = self.outputs[index] + answers[0][-1:]
        self.chain[index:index + 1] = clients
        self.spans[index:index + 1] = [(s.start, s.end) for s in plan]
        self.history[index:index + 1] = histories
        self.outputs[index:index + 1] = answers
        self.stats.replays += 1
        self.stats.recover_s.append(time.perf_counter() - began)
        return out, index + len(plan)

    async def _through_chain(self, hidden: torch.Tensor) -> torch.Tensor:
        index = 0
        while index < len(self.chain):
            hidden, index = await self._step_span(index, hidden)
        self.stats.steps += 1
        return hidden

    async def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        if not prompt or max_new_tokens < 1:
            raise ValueError("need a non-empty prompt and max_new_tokens >= 1")
        offset = self.tuned.prompt_length
        total = offset + len(prompt) + max_new_tokens
        if total > self.ends.config.context:
            raise ValueError(f"{total} positions exceed the model's context of {self.ends.config.context}")
        await self.start(total)
        try:
            out: list[int] = []
            with torch.no_grad():
                hidden = await self._through_chain(first_chunk(self.ends, self.tuned, prompt))
                for step in range(max_new_tokens):
                    out.append(greedy(self.ends.logits(hidden)))
                    if step + 1 < max_new_tokens:
                        embedded = self.ends.embed_tokens(torch.tensor([[out[-1]]]), offset + len(prompt) + step)
                        hidden = await self._through_chain(embedded)
            return out
        finally:
            await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.chain), return_exceptions=True)
        for client in self.chain:
            self.stats.add_traffic(client)
        self.chain = []   # history and outputs stay for spot checks

    def spot_check(self, index: int, part: ServeDecoder) -> SpotCheck:
        """Rerun span `index`'s recorded chunks through `part` (the client's own copy of those blocks,
        in the same profile) and compare every answer the servers gave, bit for bit after the wire
        codec: an honest server in the same profile matches exactly in every codec."""
        start, end = self.spans[index]
        if (part.start, part.end) != (start, end):
            raise ValueError(f"span {index} is blocks {start}:{end}, the part holds {part.start}:{part.end}")
        caches = part.new_caches(1, self._max_length)
        deep, lora = self.tuned.for_span(start, end)
        if deep is not None:
            deep = wire_roundtrip(deep, self.codec)
        if lora is not None:
            lora = (wire_roundtrip(lora[0], self.codec), wire_roundtrip(lora[1], self.codec))
        with torch.no_grad():
            for step, (chunk, (peer_id, answer)) in enumerate(zip(self.history[index], self.outputs[index])):
                received = wire_roundtrip(chunk, self.codec)      # what the server decoded
                out = part.run_blocks(received, caches, prompts=deep if step == 0 else None, lora=lora)
                expected = wire_roundtrip(out, self.codec)
                if answer is not None and not torch.equal(expected, answer):
                    return SpotCheck(index, (start, end), False, step, peer_id)
        return SpotCheck(index, (start, end), True, None, None)



class RemoteTuner:
    """Fine-tuning through block servers of parameters the client owns: with `prompt_length` P > 0 an
    input soft prompt (P, width) prepended to the embedded tokens and deep prompts (layers, P, width)
    added to the first P positions before each block; with `lora_rank` r > 0 LoRA adapters on every
    block's qkv projection (A (layers, r, width), B (layers, 3 width, r), B starting at zero). The
    servers run forward and backward passes and return the gradients; only these parameters change."""

    def __init__(self, host, ends: ServeDecoder, servers: list[ServerInfo], prompt_length: int = 4,
                 lora_rank: int = 0, codec: str = "f32", lr: float = 1e-2, seed: int = 0):
        config = ends.config
        if prompt_length < 0 or lora_rank < 0 or prompt_length + lora_rank == 0:
            raise ValueError("tune prompts (prompt_length > 0), adapters (lora_rank > 0) or both")
        self.host, self.ends, self.codec, self.prompt_length = host, ends, codec, prompt_length
        self.servers, self.dead, self.failovers = list(servers), set(), 0
        self.chain = [SpanClient(host, s.peer_id, s.start, s.end) for s in plan_chain(servers, config.layers)]
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
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)
        for param in ends.parameters():
            param.requires_grad_(False)

    @property
    def tuned(self) -> ClientParams:
        """The current parameters (detached), for generation or saving."""
        return ClientParams(**{name: p.detach().clone() for name, p in self.params.items()})

    def _inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.ends.embed_tokens(tokens[:, :-1], offset=self.prompt_length)
        if not self.prompt_length:
            return embedded
        prompt = self.params["input_prompt"].detach().expand(tokens.shape[0], -1, -1)
        return torch.cat([prompt + self.ends.position[:self.prompt_length], embedded], 1)

    def _span_args(self, span: SpanClient, batch: int):
        return ClientParams(**{name: p.detach() for name, p in self.params.items()}).for_span(span.start, span.end,
                                                                                             batch)

    def _loss(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.ends.logits(hidden)[:, self.prompt_length:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

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
        leaf = hidden.detach().requires_grad_(True)
        loss = self._loss(leaf, tokens)
        loss.backward()
        grad = leaf.grad
        grads = {name: torch.zeros_like(p) for name, p in self.params.items()}
        for index in reversed(range(len(self.chain))):
            span = self.chain[index]
            deep, lora = self._span_args(span, batch)
            got = await self._backward(index, inputs[index], grad, deep, lora, ids)
            grad = got["grad_h"]
            if deep is not None:
                grads["deep_prompts"][span.start:span.end] = got["grad_prompts"].sum(1)
            if lora is not None:
                grads["lora_a"][span.start:span.end] = got["grad_lora_a"]
                grads["lora_b"][span.start:span.end] = got["grad_lora_b"]
        if self.prompt_length:
            grads["input_prompt"] = grad[:, :self.prompt_length].sum(0)
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
            return float(self._loss(hidden, tokens))

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
                return seen, received.commit(ids, await span.forward(delta, deep, self.codec, lora, ids=ids))
            except (SpanUnavailable, RemoteError):
                self._failover(index)

    async def _backward(self, index: int, span_input: torch.Tensor, grad: torch.Tensor, deep, lora,
                        ids: list[int] | None) -> dict[str, torch.Tensor]:
        fresh = False   # a replacement server has no stored activations: send them
        while True:
            span = self.chain[index]
            try:
                if ids is not None and not fresh:
                    return await span.backward(None, grad, deep, self.codec, lora, ids=ids)
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
        self.chain[index] = SpanClient(self.host, spare.peer_id, spare.start, spare.end)
        self.books[index] = (DeltaBook(), DeltaBook())
        self.failovers += 1

    async def close(self) -> None:
        await asyncio.gather(*(span.close() for span in self.chain), return_exceptions=True)
