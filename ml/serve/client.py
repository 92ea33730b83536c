"""The serving client: chains block servers to run a decoder it holds only the ends of.

`plan_chain` picks servers whose ranges tile blocks 0..layers, the fastest chain by the client's own
measurements (`measure`), else the fewest hops. `RemoteGenerator` generates greedily token by token: it embeds
tokens locally, sends the hidden states through the chain (each server keeps the session's KV
cache), and reads the next token from the head. It records every chunk it sent each span; when a
server fails mid-generation, it re-plans that span's blocks over live servers (one with the same
range, or several) and sends them the recorded chunks plus the current one, so their caches hold
exactly what the dead one had and the output continues unchanged. `local_generate` runs the same chunks through a
whole local model: in bit-exact mode ("f32") both give the same tokens.

Parameters the client tuned (ml/serve/tuner.py) apply in generation with
`RemoteGenerator(tuned=...)`: adapters at every step, deep prompts sent at session open and added to
the first chunk.

Devices (docs/adr/0179): the client's ends, `local_generate`'s model and a spot check's part compute
where their weights are (CPU or CUDA); what goes over the wire and what is recorded stays on the CPU.
The bit-exact promise holds within one execution profile only, so every answer is recorded with its
server, and each server's profile (announced in the ledger, else told in "opened") is kept: a spot
check given its own profile compares only the answers of servers in that profile and lists the others
as unchecked, never accusing a server for computing in another profile.

With `push=True` (ADR 0181) a token goes down the chain in one pass: the client sends the first server
the input and asks every later server, at the same time, to run the step on the input its predecessor
pushes to it; it still receives (and records) every server's answer, checks that each pushed input is
the answer it received, and falls back to sending inputs itself for a hop where a push does not come.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ml.serve.adapters import ClientParams
from ml.serve.billing import ClientMeter, max_flops_per_token
from ml.serve.model import ServeDecoder
from ml.serve.protocol import Payer, PushMismatch, RemoteError, SpanClient, SpanUnavailable
from ml.serve.spot_check import SpotCheck, SpotChecker
from ml.serve.wire import Message
from ml.serve.wire import roundtrip as wire_roundtrip


class NoChain(RuntimeError):
    """No live servers cover all blocks (or a failed span has no replacement)."""


@dataclass(frozen=True)
class ServerInfo:
    peer_id: str
    start: int
    end: int
    profile: str = ""   # the execution profile it announces ("": not known before it is opened)


def plan_chain(servers: list[ServerInfo], layers: int, dead: set[str] | frozenset[str] = frozenset(),
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

    def rank(path: list[ServerInfo]) -> tuple[float, int, list[int]]:
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


async def measure(host: Any, servers: list[ServerInfo], width: int, tokens: int = 8) -> dict[str, float]:
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
                   tuned: ClientParams | None = None, device: str | None = None) -> list[int]:
    """Greedy tokens from the whole model, in the chunks the remote generator uses (prefix, then one
    token at a time), with the client's tuned parameters if any; on `device` (the model is moved
    there), by default where the model is."""
    if device is not None:
        model.to(device)
    tuned = tuned or ClientParams()
    offset = tuned.prompt_length
    caches = model.new_caches(1, offset + len(prompt) + max_new_tokens)
    deep, lora = _to(tuned.for_span(0, model.config.layers), model.device)
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


SpanArgs = tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]   # (deep prompts, LoRA)


def _to(span_args: SpanArgs, device: torch.device) -> SpanArgs:
    """A span's (deep prompts, LoRA) from `ClientParams.for_span` on `device`."""
    deep, lora = span_args
    return (None if deep is None else deep.to(device),
            None if lora is None else (lora[0].to(device), lora[1].to(device)))


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
    pushed: int = 0           # span steps whose input a server pushed (push mode)
    push_fallbacks: int = 0   # span steps the client had to send itself after asking for a push

    def add_traffic(self, client: SpanClient) -> None:
        self.bytes_sent += client.bytes_sent
        self.bytes_received += client.bytes_received


PUSH_WAIT_S = 5.0   # how long a server waits for a pushed input before the client sends it itself


class RemoteGenerator:
    def __init__(self, host: Any, ends: ServeDecoder, servers: list[ServerInfo], codec: str = "f32",
                 speed: dict[str, float] | None = None, tuned: ClientParams | None = None,
                 payer: Payer | None = None, push: bool = False, push_wait_s: float = PUSH_WAIT_S):
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
        self.max_length = 0                                         # positions the sessions were opened for
        self.payer = payer                                          # set: sign usage receipts (ADR 0174)
        self.meters: list[ClientMeter] = []                         # every billed stream, for evidence
        self.profiles: dict[str, str] = {}                          # peer id -> its profile (ADR 0179)
        self.push, self.push_wait_s = push, push_wait_s
        self.pushes: list[bool] | None = None   # per span: it pushes to the next one (None: to be routed)
        self.mispushed: set[str] = set()        # servers whose push differed from their answer: not used to push

    def _meter(self, server: ServerInfo) -> ClientMeter | None:
        if self.payer is None:
            return None
        meter = ClientMeter(self.payer.identity, self.payer.chain_id, self.payer.max_price_per_gflop,
                            max_flops_per_token(self.ends.config, server.end - server.start))
        self.meters.append(meter)
        return meter

    async def _open(self, server: ServerInfo) -> SpanClient:
        client = SpanClient(self.host, server.peer_id, server.start, server.end, meter=self._meter(server))
        deep, lora = self.tuned.for_span(server.start, server.end)
        try:
            await client.open(self.max_length, lora=lora, codec=self.codec, prompts=deep)
        except RemoteError:
            client.abort()
            raise
        self.profiles[server.peer_id] = server.profile or client.profile   # the ledger's word first
        return client

    async def start(self, max_length: int) -> None:
        """Open a session on each server of the best chain; a server that cannot be opened is marked
        dead and the chain planned again."""
        self.max_length = max_length
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
        self.pushes = None

    async def _step_span(self, index: int, hidden: torch.Tensor, step_id: int | None = None
                         ) -> tuple[torch.Tensor, int]:
        """Span `index`'s answer to `hidden` and the index of the span after it (a failed span may be
        replaced by several); `step_id`: the step's id in push mode."""
        client = self.chain[index]
        try:
            out = await client.step([hidden], self.codec, step=step_id)
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
            clients, histories, inputs = [], [], chunks
            answers: list[list[tuple[str, torch.Tensor | None]]] = []
            try:
                for position, server in enumerate(plan):
                    client = await self._open(server)
                    clients.append(client)
                    last = position == len(plan) - 1
                    outs = await self._replay(client, inputs, all_outputs=not last)
                    histories.append(inputs)
                    if last:   # its answers to the replayed chunks were not asked for
                        out = outs[-1]
                        answers.append([(client.peer_id, None)] * (len(inputs) - 1) + [(client.peer_id, out)])
                    else:   # the next server replays this one's answers to every chunk
                        inputs = outs
                        answers.append([(client.peer_id, o) for o in outs])
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
        self.pushes = None   # the chain changed: route it again
        return out, index + len(plan)

    async def _replay(self, client: SpanClient, chunks: list[torch.Tensor], all_outputs: bool) -> list[torch.Tensor]:
        """Send recorded chunks to `client` in one step and return its answers as a step-by-step run
        would have delivered them. The chunks go as the first server decoded them, in f32, and the
        answers are put through the codec one by one, because a lossy codec's blocks would otherwise
        straddle chunk boundaries: so the replay is exact in every codec."""
        sent = [wire_roundtrip(chunk, self.codec) for chunk in chunks]
        out = await client.step(sent, "f32", all_outputs=all_outputs)
        outs = list(torch.split(out, [c.shape[1] for c in chunks], dim=1)) if all_outputs else [out]
        return [wire_roundtrip(o, self.codec) for o in outs]

    async def _through_chain(self, hidden: torch.Tensor) -> torch.Tensor:
        """The chain's answer to `hidden` (from the ends' device, sent from the CPU), on the ends' device."""
        hidden = hidden.cpu()
        if self.push:
            hidden = await self._pushed_through_chain(hidden)
        else:
            index = 0
            while index < len(self.chain):
                hidden, index = await self._step_span(index, hidden)
        self.stats.steps += 1
        return hidden.to(self.ends.device)

    def _target(self, index: int) -> dict[str, Any]:
        """Span `index`'s server as a push target: peer, session and the addresses the client knows."""
        client = self.chain[index]
        addrs = [str(addr) for addr in self.host.peerbook.addrs(client.peer_id)][:8]
        return {"peer": client.peer_id, "session": client.session, "addrs": addrs}

    async def _route(self) -> None:
        """Tell each span's server who may push into its session and who it pushes to; record which
        hops can push (a server that cannot reach the next one, or does not push at all, ends a run)."""
        last = len(self.chain) - 1

        def pushes_to_next(index: int) -> bool:
            return index < last and self.chain[index].peer_id not in self.mispushed

        async def route(index: int) -> bool:
            client = self.chain[index]
            try:
                return await client.route(self.chain[index - 1].peer_id if index and pushes_to_next(index - 1)
                                          else None, self._target(index + 1) if pushes_to_next(index) else None)
            except (SpanUnavailable, RemoteError):
                return False
        self.pushes = list(await asyncio.gather(*(route(i) for i in range(len(self.chain)))))
        self.pushes[last] = False

    async def _pushed_through_chain(self, hidden: torch.Tensor) -> torch.Tensor:
        """One step in push mode: a span gets its input from the client, and the spans its run of pushes
        reaches are asked at the same time for the pushed input; every answer is checked and recorded
        in chain order, and a span whose push did not come (or failed) gets its input from the client,
        starting a run again."""
        step_id = self.stats.steps
        replies: dict[int, torch.Tensor | Message | BaseException | None] = {}
        index, previous_answered = 0, False
        while index < len(self.chain):
            client = self.chain[index]
            if id(client) not in replies:
                replies |= await self._ask_run(index, hidden, step_id)
            reply = replies.pop(id(client))
            if isinstance(reply, BaseException) and not isinstance(reply, (SpanUnavailable, RemoteError)):
                raise reply
            if reply is None:   # no push came: the client sends the input
                if previous_answered and self.pushes is not None:
                    self.stats.push_fallbacks += 1
                    self.pushes[index - 1] = False   # that hop does not push any more until the chain changes
                hidden, index = await self._step_span(index, hidden, step_id)
                previous_answered = False
                continue
            pushed_by_answered, previous_answered = previous_answered, False
            if isinstance(reply, BaseException):
                client.abort()
                self.stats.add_traffic(client)
                self.dead.add(client.peer_id)
                hidden, index = await self._recover(index, hidden)
                continue
            if isinstance(reply, Message):
                try:
                    out = await client.finish_pushed(reply, self.codec, hidden)
                except PushMismatch:   # its session ran another input: replay it in a fresh session
                    self.stats.push_fallbacks += 1
                    if pushed_by_answered:   # else the input came from a session replayed in this step
                        self.mispushed.add(self.chain[index - 1].peer_id)
                    self.stats.add_traffic(client)
                    hidden, index = await self._recover(index, hidden)
                    continue
                self.stats.pushed += 1
            else:
                out = reply
            self.history[index].append(hidden)
            self.outputs[index].append((client.peer_id, out))
            hidden, index, previous_answered = out, index + 1, True
        return hidden

    async def _ask_run(self, index: int, hidden: torch.Tensor, step_id: int
                       ) -> dict[int, torch.Tensor | Message | BaseException | None]:
        """Send span `index` the input `hidden` and ask the spans its pushes reach (while each pushes to
        the next) for step `step_id` on their pushed input, all at once: replies (or errors) by client."""
        if self.pushes is None:
            await self._route()
        assert self.pushes is not None
        end = index + 1
        while end < len(self.chain) and self.pushes[end - 1]:
            end += 1

        async def ask(position: int) -> torch.Tensor | Message | None:
            client = self.chain[position]
            push_to = self._target(position + 1) if position + 1 < end else None
            if position == index:
                return await client.step([hidden], self.codec, step=step_id, push_to=push_to)
            return await client.pushed_step(hidden.shape, self.codec, step_id, self.push_wait_s, push_to)
        asked = self.chain[index:end]
        replies = await asyncio.gather(*(ask(position) for position in range(index, end)), return_exceptions=True)
        return dict(zip(map(id, asked), replies, strict=True))

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

    def spot_check(self, index: int, part: ServeDecoder, profile: str | None = None) -> SpotCheck:
        """Span `index`'s recorded answers against `part`'s, the client's own copy of its blocks
        (blocking: torch): `SpotChecker.local`."""
        return SpotChecker(self).local(index, part, profile)

    async def spot_check_remote(self, index: int, referee: ServerInfo,
                                third: ServerInfo | ServeDecoder | None = None,
                                same_profile: bool = False) -> SpotCheck:
        """Span `index`'s recorded answers against `referee`'s replay of its chunks, `third` naming the
        liar when they differ: `SpotChecker.remote`."""
        return await SpotChecker(self).remote(index, referee, third, same_profile)

    async def replay_span(self, index: int, server: ServerInfo) -> tuple[list[torch.Tensor], ClientMeter | None]:
        """`server`'s answers to span `index`'s recorded chunks replayed in a fresh session, and the meter
        of that stream (its countersigned receipt covers the replay: evidence if the server lied)."""
        client = await self._open(server)
        try:
            answers = await self._replay(client, self.history[index], all_outputs=True)
        finally:
            await client.close()
        return answers, client.meter
