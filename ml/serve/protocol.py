"""`/dekube/serve/1.0.0`: a client drives a block server over one stream of request/reply frames.

Frames are ml/serve/wire.py's (JSON header + tensors). Requests, by header "type":

- "info" -> {"type": "info", "model", "start", "end", "width", "layers", "profile"} ("profile": the
  execution profile the server computes in, docs/adr/0179; also in "opened")
- "open" {"max_length", "batch"} [+ "lora_a", "lora_b"] [+ "prompts"] -> {"type": "opened"}: one
  inference session per stream (with the client's adapter, if sent, applied at every step, and its
  deep prompts added to the first chunk), closed when the stream ends (or by "close", answered
  {"type": "closed", "usage"}).
- "step" {"codec", "chunks": [length, ...]} + tensor "h" (batch, sum of lengths, width) ->
  {"type": "hidden", "usage"} + tensor "h": the chunks run in order with the session's KV caches;
  the reply is the last chunk's output, or every chunk's with "all": true (several chunks replay a
  prefix; "all" lets a client feed a replay through a new chain of servers).
- Pushed steps (ADR 0181, ml/serve/push.py): "opened" names the session ("session"). "route" {"push_from":
  peer or null} [+ "push_to"] -> {"type": "routed", "push": bool}: the session takes pushes only from
  that peer; with "push_to" {peer, session, addrs} the server tries to open a stream to the next server
  and says whether it can push there. A "step" may carry "step" (a step id, increasing per session) and
  "push_to": after computing it, the server also sends its answer, encoded as in its reply, as
  {"type": "push", "session", "step", "chunks", "codec"} + "h" to that server (acknowledged {"type":
  "pushed"} or refused with an error; the sender's reply to the client does not wait). A "step" with
  "push": true carries no "h": the server runs it on the input pushed for that step id, waiting up to
  "wait_s" for it, and answers as usual plus "input" (the digest of the input it ran), or {"type":
  "need_input", "step"} if none came (or it did not match the request's chunks and codec): the client
  then sends the step with "h". A server that answers "need_input" to a step with "push_to" tells that
  server so ("push" with "none": true and no "h"), which then answers "need_input" without waiting;
  a step also stops waiting when the stream its named sender pushed on ends and that peer has no
  connection left (it died; a stream reset by a connection change is reopened by the sender).
- "forward" {"codec"} + "h" [+ "prompts"] [+ "lora_a", "lora_b"] -> "h": a stateless pass (fine-tuning).
  Every compute reply's "usage" is {"tokens", "flops"} served so far: the session's for "step", the
  stream's stateless passes (and closed sessions) for "forward"/"backward"; a billing server reports
  the whole stream's in every reply (what receipts cover). With "ids" (one example id per batch row),
  "h" and the answer are deltas against the examples' activations last time (ml/serve/delta.py; the
  stream keeps them, bounded), and a "backward" with ids and no "h" reuses the stored inputs.
- "backward" {"codec"} + "h", "grad" [+ "prompts"] [+ "lora_a", "lora_b"] -> "grad_h"
  [+ "grad_prompts"] [+ "grad_lora_a", "grad_lora_b"].
  On a billing stream each forward and backward extends the transcript with a pass link (ADR 0183:
  resolved inputs, grad, setup, answer as the client resolves it, a delta forward's base).

Billing (ADR 0174, ml/serve/billing.py): a server made with `Billing` offers {"billing": {session, server,
chain_id, model, price, credit_tokens}} in "opened" and stateless replies, reports "transcript" with
every compute reply, and refuses compute while more than credit_tokens are not covered by a receipt.
Any request may carry "receipt" + "client_sig" (the cumulative receipt of the previous reply); its
reply then carries "server_sig". "receipt" alone sends one (before a close).

Replies use the request's codec ("f32" bit-exact, "f16", "int8", "int4"). A refused request is answered
{"type": "error", "error": text} and the stream stays usable; a malformed frame gets the error and
the stream is closed. Torch work and tensor (de)coding run in worker threads, one compute at a time
per server. `ServeHandler` (ml/serve/handler.py) is the server's stream handler; `SpanClient` the client's end.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ml.serve.billing import BillingError, ClientMeter, DebtBook, PassRecord, ReceiptBook, StepRecord
from ml.serve.transcript import ZERO, setup_digest, tensor_digest
from ml.serve.wire import Message, WireError, decode_frame, encode_frame, frame_length, roundtrip
from node.p2p.errors import ProtocolError

log = logging.getLogger(__name__)

PROTOCOL = "/dekube/serve/1.0.0"
READ_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0


class RemoteError(RuntimeError):
    """The server refused a request (its answer is the message)."""


class SpanUnavailable(ConnectionError):
    """The server could not be reached, or its stream broke or timed out: a reason to fail over."""


class PushMismatch(SpanUnavailable):
    """A pushed step ran another input than the previous server answered the client: the session is
    out of step (the client replays it elsewhere)."""


async def read_frame(stream, timeout: float) -> Message | None:
    """The next frame from `stream`, or None if it ended cleanly before one began."""
    try:
        prefix = await asyncio.wait_for(stream.readexactly(4), timeout)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    length = frame_length(prefix)
    body = await asyncio.wait_for(stream.readexactly(length), READ_TIMEOUT_S)
    return await asyncio.to_thread(decode_frame, body)


@dataclass(frozen=True)
class Billing:
    """A server's terms: who signs (its Identity), on which chain, at what price per GFLOP."""
    identity: object
    chain_id: str
    price_per_gflop: int
    book: ReceiptBook
    credit_tokens: int = 1024
    debts: DebtBook = field(default_factory=DebtBook)   # unsigned tokens of ended streams, per client


@dataclass(frozen=True)
class Payer:
    """A client's terms: who signs, on which chain, the most it pays per GFLOP."""
    identity: object
    chain_id: str
    max_price_per_gflop: int


def _adapter(lora: tuple[torch.Tensor, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    return {} if lora is None else {"lora_a": lora[0], "lora_b": lora[1]}


def _decoded_setup(lora: tuple[torch.Tensor, torch.Tensor] | None, prompts: torch.Tensor | None,
                   codec: str) -> tuple[bytes, dict[str, torch.Tensor]]:
    """A session's setup digest and tensors as the server decodes them from an "open" in `codec`."""
    tensors = {name: roundtrip(t, codec) for name, t in _adapter(lora).items()}
    if prompts is not None:
        tensors["prompts"] = roundtrip(prompts, codec)
    decoded_lora = (tensors["lora_a"], tensors["lora_b"]) if lora is not None else None
    return setup_digest(decoded_lora, tensors.get("prompts")), tensors


def _pass_record(kind: str, start: int, end: int, codec: str, inputs: tuple[torch.Tensor | None, bool],
                 grad: torch.Tensor | None, prompts: torch.Tensor | None,
                 lora: tuple[torch.Tensor, torch.Tensor] | None,
                 answer: torch.Tensor | dict[str, torch.Tensor], base: torch.Tensor | None,
                 keep: bool) -> PassRecord:
    """The client's record of a tuning pass, with every tensor it sent as the server decodes it (and,
    if `keep`, those tensors and the answer for a spot check)."""
    hidden, sent_whole = inputs
    if hidden is None:
        raise ValueError("a pass record needs its inputs")
    setup, sent = _decoded_setup(lora, prompts, codec)
    sent["h"] = roundtrip(hidden, codec) if sent_whole else hidden
    if grad is not None:
        sent["grad"] = roundtrip(grad, codec)
    if base is not None:
        sent["base"] = base
        answer = base + answer if isinstance(answer, torch.Tensor) else answer
    return PassRecord.of(kind, start, end, codec, sent["h"], sent.get("grad"), setup, answer,
                         ZERO if base is None else tensor_digest(base), sent if keep else None)


class SpanClient:
    """The client's stream to one server holding blocks start..end."""

    def __init__(self, host, peer_id: str, start: int, end: int, timeout: float = REQUEST_TIMEOUT_S,
                 meter: ClientMeter | None = None):
        self.host, self.peer_id, self.start, self.end, self.timeout = host, peer_id, start, end, timeout
        self.meter = meter            # set: sign usage receipts for this stream (ADR 0174)
        self.setup = ZERO             # the session's adapter and prompts as the server decoded them (ADR 0176)
        self.profile = ""             # the execution profile the server says it computes in ("opened", ADR 0179)
        self.check_passes: frozenset[int] = frozenset()   # tuning passes whose tensors to keep (ADR 0183)
        self._stream: Any = None   # the HostStream, opened at the first request
        self._client_sig = b""     # the client's signature on the receipt sent with the last request
        self.session = ""          # the server's session id (named to the previous server for pushes)
        self.bytes_sent = 0
        self.bytes_received = 0

    def __repr__(self) -> str:
        return f"SpanClient({self.peer_id[:12]}.., {self.start}:{self.end})"

    async def request(self, header: dict, tensors: dict[str, torch.Tensor] | None = None,
                      codec: str = "f32", tokens: int = 0, answer: str | None = None) -> Message:
        """One request and its reply (`tokens`: positions sent for compute, `answer`: the reply tensor of an
        inference step, which the transcript covers with the step's input "h"; both for billing)."""
        reply = await self.exchange(header, tensors, codec)
        inputs = None if tensors is None or answer is None else tensors.get("h")
        await self.account(header, reply, codec, tokens, answer, inputs)
        return reply

    async def exchange(self, header: dict, tensors: dict[str, torch.Tensor] | None = None,
                       codec: str = "f32") -> Message:
        """Send one request and read its reply, checking the server's countersignature and offer; a
        compute reply is then for `account` (which `request` calls at once)."""
        receipt, self._client_sig = self.meter.attach() if self.meter is not None else ({}, b"")
        frame = await asyncio.to_thread(encode_frame, {**header, **receipt, "codec": codec}, tensors, codec)
        try:
            if self._stream is None:
                self._stream = await asyncio.wait_for(self.host.open_stream(self.peer_id, PROTOCOL), self.timeout)
            await self._stream.write(frame)
            self.bytes_sent += len(frame)
            reply = await read_frame(self._stream, self.timeout)
        except WireError as exc:
            self.abort()
            raise SpanUnavailable(f"{self}: malformed reply: {exc}") from None
        except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError) as exc:
            self.abort()
            raise SpanUnavailable(f"{self}: {exc!r}") from None
        if reply is None:
            self.abort()
            raise SpanUnavailable(f"{self}: stream ended")
        self.bytes_received += reply.nbytes
        if reply.header.get("type") == "error":
            raise RemoteError(f"{self}: {str(reply.header.get('error'))[:300]}")
        if self.meter is not None:
            try:
                self.meter.on_countersign(reply.header, self._client_sig)
                if "billing" in reply.header:
                    self.meter.accept_offer(reply.header["billing"], self.peer_id)
            except BillingError as exc:
                self.abort()
                raise SpanUnavailable(f"{self}: billing: {exc}") from None
        return reply

    async def account(self, header: dict, reply: Message, codec: str, tokens: int, answer: str | None,
                      inputs: torch.Tensor | None) -> None:
        """Bill a compute reply: check its usage and extend the transcript with the step (`inputs`: the
        hidden states the step ran, sent by the client or pushed to the server; `answer`: the reply
        tensor answering them)."""
        if self.meter is None or header.get("type") not in ("step", "forward", "backward"):
            return
        try:
            step = None
            if answer is not None and answer in reply.tensors and inputs is not None:
                step = await asyncio.to_thread(
                    StepRecord.of, self.start, self.end, codec, header["chunks"], header.get("all") is True,
                    roundtrip(inputs, codec), reply.tensors[answer], self.setup)
            self.meter.on_reply(reply.header, tokens, step)
        except BillingError as exc:
            self.abort()
            raise SpanUnavailable(f"{self}: billing: {exc}") from None

    async def info(self) -> dict:
        return (await self.request({"type": "info"})).header

    async def open(self, max_length: int, batch: int = 1, lora: tuple[torch.Tensor, torch.Tensor] | None = None,
                   codec: str = "f32", prompts: torch.Tensor | None = None) -> None:
        tensors = _adapter(lora) | ({} if prompts is None else {"prompts": prompts})
        reply = await self.request({"type": "open", "max_length": max_length, "batch": batch}, tensors, codec)
        self.profile = str(reply.header.get("profile", ""))[:96]
        self.session = str(reply.header.get("session", ""))
        if self.meter is not None and (lora is not None or prompts is not None):   # the transcript commits to it
            self.setup, self.meter.setup = await asyncio.to_thread(_decoded_setup, lora, prompts, codec)

    async def step(self, chunks: list[torch.Tensor], codec: str, all_outputs: bool = False,
                   step: int | None = None, push_to: dict | None = None) -> torch.Tensor:
        """The answer to the last chunk (`all_outputs`: to every chunk, concatenated on dim 1); with
        `step` (its id) and `push_to`, the server also pushes its answer to that next server."""
        lengths = [c.shape[1] for c in chunks]
        hidden = torch.cat(chunks, 1)
        header = {"type": "step", "chunks": lengths, "all": all_outputs}
        header |= ({} if step is None else {"step": step}) | ({} if push_to is None else {"push_to": push_to})
        reply = await self.request(header, {"h": hidden}, codec, tokens=hidden.shape[0] * hidden.shape[1], answer="h")
        return self._tensor(reply, "h", hidden.shape if all_outputs else chunks[-1].shape)

    async def route(self, push_from: str | None, push_to: dict | None) -> bool:
        """Name the peer that may push into this session, and the next server (None: none); whether this
        server can push to it."""
        header = {"type": "route", "push_from": push_from} | ({} if push_to is None else {"push_to": push_to})
        return (await self.request(header)).header.get("push") is True

    async def pushed_step(self, shape: torch.Size, codec: str, step: int, wait_s: float,
                          push_to: dict | None = None) -> Message | None:
        """Ask for step `step` on the input the previous server pushes (of `shape`); the reply, to
        `finish_pushed` once the input is known, or None when the server got no push in `wait_s`."""
        header = {"type": "step", "chunks": [shape[1]], "push": True, "step": step, "wait_s": wait_s}
        reply = await self.exchange(header | ({} if push_to is None else {"push_to": push_to}), None, codec)
        if reply.header.get("type") == "need_input":
            return None
        self._tensor(reply, "h", shape)
        return reply

    async def finish_pushed(self, reply: Message, codec: str, inputs: torch.Tensor) -> torch.Tensor:
        """The answer of a pushed step whose input was `inputs` (as the client received it from the
        previous server): billed, after checking the server ran exactly that input."""
        digest = await asyncio.to_thread(lambda: tensor_digest(roundtrip(inputs, codec)))   # both off the loop
        if reply.header.get("input") != digest.hex():
            self.abort()
            raise PushMismatch(f"{self}: the input pushed to it is not what the previous server answered")
        header = {"type": "step", "chunks": [inputs.shape[1]], "all": False}
        await self.account(header, reply, codec, inputs.shape[0] * inputs.shape[1], "h", inputs)
        return reply.tensors["h"]

    async def forward(self, hidden: torch.Tensor, prompts: torch.Tensor | None, codec: str,
                      lora: tuple[torch.Tensor, torch.Tensor] | None = None, ids: list[int] | None = None,
                      seen: torch.Tensor | None = None, base: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks' output. With `ids`, `hidden` and the answer are deltas (ml/serve/delta.py): `seen`
        is the input the server resolves and `base` the answer's base in the client's book, so that the
        transcript's link commits to the resolved input and answer (`base` + the delta, ADR 0183)."""
        tensors = {"h": hidden} | ({} if prompts is None else {"prompts": prompts}) | _adapter(lora)
        header = {"type": "forward"} | ({} if ids is None else {"ids": ids})
        reply = await self.exchange(header, tensors, codec)
        out = self._tensor(reply, "h", hidden.shape)
        inputs = (hidden, True) if seen is None else (seen, False)
        await self.account_pass("forward", reply, codec, hidden.shape[0] * hidden.shape[1], inputs, None,
                                prompts, lora, out, base)
        return out

    async def backward(self, hidden: torch.Tensor | None, grad: torch.Tensor, prompts: torch.Tensor | None,
                       codec: str, lora: tuple[torch.Tensor, torch.Tensor] | None = None,
                       ids: list[int] | None = None, seen: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """{"grad_h", and "grad_prompts" / "grad_lora_a", "grad_lora_b" for what was sent}. Without
        `hidden`, the server uses the inputs it stored for `ids` in the last delta forward: `seen`, as
        the client resolved them (for the transcript, ADR 0183)."""
        if hidden is None and seen is None and self.meter is not None:
            raise ValueError("a billed backward without hidden states needs the inputs the server stored (seen)")
        tensors = ({"grad": grad} | ({} if hidden is None else {"h": hidden})
                   | ({} if prompts is None else {"prompts": prompts}) | _adapter(lora))
        header = {"type": "backward"} | ({} if ids is None else {"ids": ids})
        reply = await self.exchange(header, tensors, codec)
        expected = {"grad_h": grad.shape}
        if prompts is not None:
            expected["grad_prompts"] = prompts.shape
        if lora is not None:
            expected["grad_lora_a"], expected["grad_lora_b"] = lora[0].shape, lora[1].shape
        grads = {name: self._tensor(reply, name, shape) for name, shape in expected.items()}
        inputs = (hidden, True) if hidden is not None else (seen, False)
        await self.account_pass("backward", reply, codec, grad.shape[0] * grad.shape[1], inputs, grad,
                                prompts, lora, grads, None)
        return grads

    async def account_pass(self, kind: str, reply: Message, codec: str, tokens: int,
                           inputs: tuple[torch.Tensor | None, bool], grad: torch.Tensor | None,
                           prompts: torch.Tensor | None, lora: tuple[torch.Tensor, torch.Tensor] | None,
                           answer: torch.Tensor | dict[str, torch.Tensor], base: torch.Tensor | None) -> None:
        """Bill a tuning pass and extend the transcript with its link (`inputs`: the hidden states and
        whether they were sent whole, so the server decoded them in `codec`, or are already resolved;
        `base`: a delta forward's answer base). A pass numbered in `check_passes` keeps its tensors."""
        if self.meter is None:
            return
        try:
            keep = len(self.meter.passes) in self.check_passes
            record = await asyncio.to_thread(_pass_record, kind, self.start, self.end, codec, inputs, grad, prompts,
                                             lora, answer, base, keep)
            self.meter.on_reply(reply.header, tokens, record)
        except BillingError as exc:
            self.abort()
            raise SpanUnavailable(f"{self}: billing: {exc}") from None

    def _tensor(self, reply: Message, name: str, shape: torch.Size) -> torch.Tensor:
        if name not in reply.tensors or reply.tensors[name].shape != shape:
            self.abort()
            raise SpanUnavailable(f"{self}: reply lacks tensor {name} of shape {list(shape)}")
        return reply.tensors[name]

    async def settle(self) -> None:
        """Send the receipt covering the last reply, if one is pending (before closing)."""
        if self.meter is not None and self.meter.pending is not None and self._stream is not None:
            with contextlib.suppress(SpanUnavailable, RemoteError):
                await self.request({"type": "receipt"})

    async def close(self) -> None:
        await self.settle()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stream.close(), 5.0)
            self._stream = None

    def abort(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.reset()
            self._stream = None
