"""The server's end of `/dekube/serve/1.0.0` (ml/serve/protocol.py describes the requests): `ServeHandler`,
the Host stream handler, with one method per request type.

Each stream has a `StreamState` (its session, the usage of its stateless passes, the delta books of a
tuning client, its push links and, on a billing server, its meter); `ServeHandler.__call__` reads the
stream's frames and answers each with `on_<type>`, until the stream ends. Torch work runs in worker
threads, one compute at a time per server; a refused request is answered with an error frame and the
stream stays usable, a malformed frame ends it.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ml.serve.billing import ServerMeter
from ml.serve.delta import DeltaBook, check_ids
from ml.serve.protocol import PROTOCOL, Billing, read_frame
from ml.serve.push import PUSH_WAIT_MAX_S, Inbox, Pushed, PushLink, Target, peer_id, step_id
from ml.serve.server import BlockServer, ServeError, Usage
from ml.serve.transcript import ZERO, grads_digest, pass_link, setup_digest, step_link, tensor_digest
from ml.serve.wire import CODECS, Message, WireError, encode_frame, roundtrip
from node.admission import PeerClass
from node.p2p.errors import ProtocolError

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 300.0
MAX_CHUNKS = 4096
MAX_LINKS = 4              # push links one client stream may have its server hold

T = TypeVar("T")


def _codec(header: dict[str, Any]) -> str:
    codec = header.get("codec", "f32")
    if codec not in CODECS:
        raise ServeError(f"unknown codec {str(codec)[:20]!r}; known: {list(CODECS)}")
    return str(codec)


def _split_chunks(lengths: object, hidden: torch.Tensor | None) -> list[torch.Tensor]:
    """A step's tensor "h" (batch, total, width) cut into its chunks (header "chunks": lengths)."""
    if hidden is None or hidden.dim() != 3:
        raise ServeError("a step carries hidden states h of shape (batch, length, width)")
    if (not isinstance(lengths, list) or not 1 <= len(lengths) <= MAX_CHUNKS
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths)
            or sum(lengths) != hidden.shape[1]):
        raise ServeError(f"chunks must be 1..{MAX_CHUNKS} positive lengths summing to h's length")
    return list(torch.split(hidden, lengths, dim=1))


def _lora(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    if "lora_a" not in tensors and "lora_b" not in tensors:
        return None
    if "lora_a" not in tensors or "lora_b" not in tensors:
        raise ServeError("an adapter needs both lora_a and lora_b")
    return tensors["lora_a"], tensors["lora_b"]


def _send_delta(book: DeltaBook, ids: list[int], value: torch.Tensor,
                codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the delta to send for `value`, its base), after recording what the receiver will reconstruct."""
    base = book.bases(ids, tuple(value.shape[1:]))
    delta = value - base
    book.commit(ids, roundtrip(delta, codec))
    return delta, base


@dataclass
class StreamState:
    """What one client stream holds on the server."""

    peer: str
    ip: str
    peer_class: PeerClass
    meter: ServerMeter | None = None
    session: str = ""                                   # its inference session ("": none open)
    usage: Usage = field(default_factory=Usage)         # stateless passes and closed sessions
    inputs: DeltaBook = field(default_factory=DeltaBook)
    outputs: DeltaBook = field(default_factory=DeltaBook)
    links: dict[str, PushLink] = field(default_factory=dict)
    pushes: set[asyncio.Future[None]] = field(default_factory=set)
    pushed_into: set[str] = field(default_factory=set)  # sessions this stream pushed into


# a request's handler: (its message, the stream, the fields a receipt added) -> the reply frame
Request = Callable[[Message, StreamState, dict[str, Any]], Awaitable[bytes]]


class ServeHandler:
    """The Host stream handler serving `server`'s blocks as model `model_id` (billing its clients
    with receipts if `billing`; pushing answers to next servers over `host`, if given)."""

    def __init__(self, server: BlockServer, model_id: str, billing: Billing | None = None, host: Any = None) -> None:
        self.server, self.model_id, self.billing, self.host = server, model_id, billing, host
        self.compute = asyncio.Semaphore(1)
        self.inbox = Inbox(connected=self._connected)
        self.own_peer = str(getattr(host, "peer_id", ""))
        self.requests: dict[str, Request] = {
            "receipt": self.on_receipt, "info": self.on_info, "open": self.on_open, "route": self.on_route,
            "close": self.on_close, "push": self.on_push, "step": self.on_step, "forward": self.on_forward,
            "backward": self.on_backward}

    def _connected(self, peer: str) -> bool:
        return self.host is None or any(not c.closed for c in self.host.connections(peer))

    # ---- the stream
    async def __call__(self, stream: Any) -> None:
        remote = getattr(getattr(stream, "connection", None), "remote_addr", None)
        peer = str(getattr(stream, "remote_peer", ""))
        state = StreamState(peer, remote.parts[0][1] if remote is not None else "",
                            self.host.peer_class(peer) if self.host is not None else PeerClass.UNKNOWN)
        billing = self.billing
        if billing is not None:
            state.meter = ServerMeter(billing.identity, billing.chain_id, self.model_id, peer,
                                      billing.price_per_gflop, billing.book, billing.credit_tokens, billing.debts)
        try:
            while True:
                try:
                    msg = await read_frame(stream, IDLE_TIMEOUT_S)
                except WireError as exc:
                    await stream.write(encode_frame({"type": "error", "error": str(exc)[:300]}))
                    break
                if msg is None:
                    break
                try:
                    reply = await self.answer(msg, state)
                except (ServeError, WireError, ValueError, RuntimeError) as exc:   # RuntimeError: torch's
                    reply = encode_frame({"type": "error", "error": str(exc)[:300]})
                await stream.write(reply)
            await stream.close()
        except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError):
            stream.reset()
        finally:
            self._end(state)

    def _end(self, state: StreamState) -> None:
        for task in list(state.pushes):
            task.cancel()
        for link in state.links.values():
            link.close()
        for session_id in state.pushed_into:   # a previous server's push stream ended
            self.inbox.sender_gone(session_id, state.peer)
        if state.session:
            self.inbox.drop(state.session)
            self.server.close_session(state.session)
        if state.meter is not None:
            state.meter.end()

    async def answer(self, msg: Message, state: StreamState) -> bytes:
        """The reply to one request: a receipt it carries is taken first, then the request itself."""
        header = msg.header
        extra: dict[str, Any] = {}
        if "receipt" in header:
            if state.meter is None:
                raise ServeError("this server does not bill")
            extra["server_sig"] = await asyncio.to_thread(state.meter.accept, header["receipt"],
                                                          header.get("client_sig"))
            if state.session:
                self.server.mark_paid(state.session)   # a paid session holds a reserved slot (ADR 0186)
        kind = header.get("type")
        request = self.requests.get(kind) if isinstance(kind, str) else None
        if request is None:
            raise ServeError(f"unknown request type {str(kind)[:20]!r}")
        return await request(msg, state, extra)

    # ---- requests
    async def on_receipt(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        return encode_frame({"type": "receipt", **extra})

    async def on_info(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        server = self.server
        return encode_frame({"type": "info", "model": self.model_id, "start": server.start, "end": server.end,
                             "width": server.config.width, "layers": server.config.layers,
                             "profile": server.profile, "price": self.billing.price_per_gflop if self.billing else 0,
                             **extra})

    async def on_open(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header, tensors = msg.header, msg.tensors
        if state.session:
            raise ServeError("this stream already has a session")
        session_id = secrets.token_hex(8)
        await asyncio.to_thread(self.server.open_session, session_id, header.get("max_length"),  # type: ignore[arg-type]
                                header.get("batch", 1), _lora(tensors), state.peer, tensors.get("prompts"),  # it checks
                                state.ip, state.peer_class)
        state.session = session_id
        offer = {"billing": state.meter.offer()} if state.meter is not None else {}
        return encode_frame({"type": "opened", "session": session_id, "profile": self.server.profile, **offer,
                             **extra})

    async def on_route(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header = msg.header
        if not state.session:
            raise ServeError("open a session first")
        sender = header.get("push_from")
        self.inbox.route(state.session, None if sender is None else peer_id(sender, "push_from"))
        can_push = False
        if "push_to" in header and self.host is not None:
            try:
                await _link_to(self.host, state, Target.parse(header["push_to"], self.own_peer)).open()
                can_push = True
            except (TimeoutError, OSError, ProtocolError) as exc:
                log.info("cannot reach %s to push: %r", str(header["push_to"].get("peer"))[:16], exc)
        return encode_frame({"type": "routed", "push": can_push, **extra})

    async def on_close(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        self.inbox.drop(state.session)
        usage = self.server.close_session(state.session) or Usage()
        state.session = ""
        state.usage.tokens += usage.tokens
        state.usage.flops += usage.flops
        return encode_frame({"type": "closed", "usage": usage.as_dict(), **extra})

    async def on_push(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header, tensors = msg.header, msg.tensors
        codec = _codec(header)
        target_session = str(header.get("session", ""))
        session = self.server.sessions.get(target_session)
        if session is None:
            raise ServeError("a push names a session this server holds")
        pushed_step = step_id(header.get("step"))
        pushed = None
        if header.get("none") is not True:
            _split_chunks(header.get("chunks"), tensors.get("h"))
            pushed = Pushed(tuple(header["chunks"]), codec, tensors["h"])
        self.inbox.put(target_session, state.peer, pushed_step, pushed, session.batch, self.server.config.width)
        state.pushed_into.add(target_session)
        return encode_frame({"type": "pushed", "step": pushed_step})

    async def on_step(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header, tensors = msg.header, msg.tensors
        codec = _codec(header)
        if not state.session:
            raise ServeError("open a session first")
        step = step_id(header["step"]) if "step" in header else None
        target = Target.parse(header["push_to"], self.own_peer) if "push_to" in header else None
        hidden, digest = tensors.get("h"), None
        if header.get("push") is True:
            if step is None or hidden is not None:
                raise ServeError("a pushed step has a step id and no h")
            hidden = await self._pushed_input(header, state.session, step, codec)
            if hidden is None:
                if target is not None and self.host is not None:   # the next server need not wait for us
                    _start_push(self.host, state, target, step, None, codec)
                return encode_frame({"type": "need_input", "step": step, **extra})
            digest = (await asyncio.to_thread(tensor_digest, hidden)).hex()
        elif step is not None:
            self.inbox.settle(state.session, step)
        chunks = _split_chunks(header.get("chunks"), hidden)
        assert hidden is not None   # _split_chunks refuses a step without h
        self._guard(state, hidden)
        all_outputs = header.get("all") is True
        out = await self._run(self.server.step, state.session, chunks, all_outputs)
        if target is not None and step is not None and self.host is not None and not all_outputs:
            _start_push(self.host, state, target, step, out, codec)
        session = self.server.sessions.get(state.session)
        step_usage = session.usage.as_dict() if session is not None else {}
        extra |= await asyncio.to_thread(self._billed, state, (header["chunks"], all_outputs, hidden, out), codec)
        if digest is not None:
            extra["input"] = digest
        return await asyncio.to_thread(encode_frame, {"type": "hidden", "usage": step_usage, **extra}, {"h": out},
                                       codec)

    async def on_forward(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header, tensors = msg.header, msg.tensors
        codec = _codec(header)
        if "h" not in tensors:
            raise ServeError("forward needs tensor h")
        inputs, ids = tensors["h"], None
        if "ids" in header:   # h is a delta against the stored inputs of these examples
            ids = check_ids(header["ids"], inputs.shape[0])
            inputs = await asyncio.to_thread(state.inputs.commit, ids, inputs)
        self._guard(state, inputs)
        out = await self._run(self.server.forward, inputs, tensors.get("prompts"), _lora(tensors), state.usage)
        base = None
        if ids is not None:
            out, base = await asyncio.to_thread(_send_delta, state.outputs, ids, out, codec)
        if state.meter is not None:
            extra |= await asyncio.to_thread(self._pass_billed, state, "forward", codec, tensors, inputs, out, ids,
                                             base)
        return await asyncio.to_thread(encode_frame, {"type": "hidden", "usage": state.usage.as_dict(), **extra},
                                       {"h": out}, codec)

    async def on_backward(self, msg: Message, state: StreamState, extra: dict[str, Any]) -> bytes:
        header, tensors = msg.header, msg.tensors
        codec = _codec(header)
        if "grad" not in tensors:
            raise ServeError("backward needs tensor grad")
        if "h" in tensors:
            inputs = tensors["h"]
        elif "ids" in header:
            inputs = await asyncio.to_thread(state.inputs.stored, check_ids(header["ids"], tensors["grad"].shape[0]))
        else:
            raise ServeError("backward needs tensor h, or ids of a delta forward")
        self._guard(state, tensors["grad"])
        grads = await self._run(self.server.backward, inputs, tensors["grad"], tensors.get("prompts"),
                                _lora(tensors), state.usage)
        if state.meter is not None:
            extra |= await asyncio.to_thread(self._pass_billed, state, "backward", codec, tensors, inputs, grads)
        return await asyncio.to_thread(encode_frame, {"type": "grads", "usage": state.usage.as_dict(), **extra},
                                       grads, codec)

    # ---- compute, billing and pushes
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        async with self.compute:
            return await asyncio.to_thread(fn, *args)

    def _usage(self, state: StreamState) -> Usage:
        """What this stream was served: its stateless passes, closed sessions and its open session."""
        session = self.server.sessions.get(state.session)
        extra = session.usage if session is not None else Usage()
        return Usage(state.usage.tokens + extra.tokens, state.usage.flops + extra.flops)

    def _guard(self, state: StreamState, hidden: torch.Tensor | None) -> None:
        if state.meter is not None and hidden is not None and hidden.dim() >= 2:
            state.meter.guard(self._usage(state).tokens, hidden.shape[0] * hidden.shape[1])

    def _billed(self, state: StreamState, step: tuple[Any, bool, torch.Tensor, torch.Tensor] | None,
                codec: str, link: bytes | None = None) -> dict[str, Any]:
        """Reply header fields for billing after a compute (runs in a worker thread); `step`: an inference
        step's (chunk lengths, all, inputs as decoded, answer) for the transcript (`link`: a pass's)."""
        meter = state.meter
        if meter is None:
            return {}
        usage = self._usage(state)
        if step is not None:
            lengths, all_outputs, inputs, answer = step
            session = self.server.sessions.get(state.session)
            setup = ZERO if session is None else setup_digest(session.lora, session.prompts)
            link = step_link(self.server.start, self.server.end, codec, lengths, all_outputs, tensor_digest(inputs),
                             tensor_digest(roundtrip(answer, codec)), setup)
        return {**meter.report(usage.tokens, usage.flops, link), "billing": meter.offer()}

    def _pass_billed(self, state: StreamState, kind: str, codec: str, tensors: dict[str, torch.Tensor],
                     inputs: torch.Tensor, answer: torch.Tensor | dict[str, torch.Tensor],
                     ids: list[int] | None = None, base: torch.Tensor | None = None) -> dict[str, Any]:
        """`_billed` for a tuning pass (worker thread): its link commits to the resolved `inputs`, the
        decoded grad and setup, and the answer as the client resolves it (ADR 0183; with `ids`, a delta
        forward's answer is the sum the outputs book stored)."""
        grad = tensors.get("grad")
        if isinstance(answer, dict):
            answer_digest = grads_digest({name: roundtrip(g, codec) for name, g in answer.items()})
        else:
            answer_digest = tensor_digest(roundtrip(answer, codec) if ids is None else state.outputs.stored(ids))
        link = pass_link(kind, self.server.start, self.server.end, codec, tensor_digest(inputs),
                         ZERO if grad is None else tensor_digest(grad), answer_digest,
                         setup_digest(_lora(tensors), tensors.get("prompts")),
                         ZERO if base is None else tensor_digest(base))
        return self._billed(state, None, codec, link)

    async def _pushed_input(self, header: dict[str, Any], session_id: str, step: int,
                            codec: str) -> torch.Tensor | None:
        """The input pushed for a "push" step, if it came in time and matches the request."""
        wait = header.get("wait_s", 5.0)
        if type(wait) not in (int, float) or not 0 <= wait <= PUSH_WAIT_MAX_S:
            raise ServeError(f"wait_s is 0..{PUSH_WAIT_MAX_S:g} seconds")
        pushed = await self.inbox.take(session_id, step, float(wait))
        if pushed is None or list(pushed.chunks) != header.get("chunks") or pushed.codec != codec:
            return None
        return pushed.hidden


def _link_to(host: Any, state: StreamState, target: Target) -> PushLink:
    """The stream's push link to `target` (at most MAX_LINKS held: past that, all are closed)."""
    links = state.links
    if target.peer not in links and len(links) >= MAX_LINKS:
        for old in links.values():
            old.close()
        links.clear()
    return links.setdefault(target.peer, PushLink(host, target, PROTOCOL))


def _start_push(host: Any, state: StreamState, target: Target, step: int, out: torch.Tensor | None,
                codec: str) -> None:
    """Send `out` (as the reply to the client encodes it) to the next server, without waiting; None:
    tell it this step has no answer to push (it then asks the client at once)."""
    link = _link_to(host, state, target)

    async def push() -> None:
        header = {"type": "push", "session": target.session, "step": step, "codec": codec}
        if out is None:
            frame = encode_frame(header | {"none": True})
        else:
            frame = await asyncio.to_thread(encode_frame, header | {"chunks": [out.shape[1]]}, {"h": out}, codec)
        try:
            ack = await link.send(frame, read_frame)
        except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError, WireError) as exc:
            log.info("push of step %d to %s failed: %r", step, target.peer[:16], exc)
            return
        if ack.get("type") != "pushed":
            log.info("push of step %d refused by %s: %s", step, target.peer[:16], str(ack.get("error"))[:200])

    task = asyncio.ensure_future(push())
    state.pushes.add(task)
    task.add_done_callback(state.pushes.discard)
