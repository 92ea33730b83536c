"""Server-to-server push of inference steps (ADR 0181): the receiving inbox and the sending links.

In a pushed step the client sends the first server of a run its input, naming the next server's peer
and session ("push_to"); that server answers the client and also sends its encoded answer straight to
the next server ("push" frames on `/dekube/serve/1.0.0`), which the client asked, at the same time,
to run step k on the input pushed to it. The latency of a token is then one pass down the chain
instead of a round trip per server.

`Inbox` (sans I/O, one per server) holds pushed inputs per session until the session's step asks for
them: a session takes pushes only from the peer its client named ("route"), only for steps it has not
settled yet, at most `MAX_PENDING` ahead, each checked for shape and chunk lengths before it is kept.
`PushLink` is a server's stream to the next server, one per (client stream, next peer); pushes on it
go in order and each is acknowledged.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ml.serve.server import ServeError
from node.p2p.errors import ProtocolError

MAX_PENDING = 4            # pushed steps a session holds ahead of its client's requests
PUSH_WAIT_MAX_S = 30.0     # the longest a step waits for its pushed input
PUSH_TIMEOUT_S = 10.0      # opening a link or having a push acknowledged
MAX_ADDRS = 8              # addresses a client may give for the next server
MAX_ID = 100               # peer ids and session ids, characters
SENDER_POLL_S = 0.1        # how often a step whose sender's push stream ended looks whether it is still connected


@dataclass(frozen=True)
class Pushed:
    """A pushed input: chunk lengths, codec and the decoded hidden states."""
    chunks: tuple[int, ...]
    codec: str
    hidden: torch.Tensor


@dataclass
class _Box:
    sender: str | None                  # the peer allowed to push (None: nobody)
    settled: int = -1                   # the highest step id whose input is settled
    gone: bool = False                  # the sender's push stream into this session ended
    pending: dict[int, Pushed | None] = field(default_factory=dict)   # None: the sender has no input for it
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


def step_id(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ServeError("a step id is an integer >= 0")
    return value


def peer_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID:
        raise ServeError(f"{what} is a peer id of 1-{MAX_ID} characters")
    return value


@dataclass(frozen=True)
class Target:
    """Where a server pushes its answer: the next server's peer, its session, addresses to dial it."""
    peer: str
    session: str
    addrs: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: object, own_peer: str) -> Target:
        if not isinstance(value, dict):
            raise ServeError("push_to is {peer, session, addrs}")
        peer = peer_id(value.get("peer"), "push_to.peer")
        if peer == own_peer:
            raise ServeError("push_to names this server")
        session, addrs = value.get("session"), value.get("addrs", [])
        if not isinstance(session, str) or not 1 <= len(session) <= MAX_ID:
            raise ServeError("push_to.session is 1-100 characters")
        if (not isinstance(addrs, list) or len(addrs) > MAX_ADDRS
                or not all(isinstance(a, str) and 1 <= len(a) <= 400 for a in addrs)):
            raise ServeError(f"push_to.addrs is at most {MAX_ADDRS} multiaddrs")
        return cls(peer, session, tuple(addrs))

    def as_json(self) -> dict:
        return {"peer": self.peer, "session": self.session, "addrs": list(self.addrs)}


class Inbox:
    """Pushed inputs of a server's sessions."""

    def __init__(self, max_pending: int = MAX_PENDING, connected: Callable[[str], bool] = lambda peer: True):
        self.max_pending = max_pending
        self.connected = connected   # whether a peer has a live connection to this server
        self._boxes: dict[str, _Box] = {}

    def route(self, session: str, sender: str | None) -> None:
        """Session `session` takes pushes from `sender` from now on (its client said so)."""
        box = self._boxes.setdefault(session, _Box(sender))
        box.sender, box.gone = sender, False

    def sender_gone(self, session: str, sender: str) -> None:
        """`sender`'s stream that pushed into `session` ended: it may have died (then a step waiting for
        its push stops waiting once it has no connection left) or moved to another connection."""
        box = self._boxes.get(session)
        if box is not None and box.sender == sender:
            box.gone = True
            box.arrived.set()

    def drop(self, session: str) -> None:
        box = self._boxes.pop(session, None)
        if box is not None:
            box.arrived.set()   # a step still waiting ends now (it finds nothing)

    def put(self, session: str, sender: str, step: int, pushed: Pushed | None, batch: int, width: int) -> None:
        """Keep a push for `session`'s step `step` from `sender` (None: the sender says it will have no
        answer to push for that step, so the step need not wait), or refuse it (ServeError)."""
        box = self._boxes.get(session)
        if box is None or box.sender is None:
            raise ServeError(f"session {session[:16]} takes no pushes")
        if sender != box.sender:
            raise ServeError(f"peer {sender[:16]}.. was not named to push into session {session[:16]}")
        hidden = None if pushed is None else pushed.hidden
        if hidden is not None and (hidden.dim() != 3 or hidden.shape[0] != batch or hidden.shape[2] != width):
            raise ServeError(f"a pushed input is (batch {batch}, length, width {width}), got {list(hidden.shape)}")
        if step <= box.settled or step in box.pending:
            raise ServeError(f"step {step} of session {session[:16]} is already settled")
        if len(box.pending) >= self.max_pending:
            raise ServeError(f"session {session[:16]} already holds {self.max_pending} pushed steps")
        box.pending[step] = pushed
        box.gone = False
        box.arrived.set()

    def settle(self, session: str, step: int) -> None:
        """The client sent step `step`'s input itself: pushes up to it are stale."""
        box = self._boxes.get(session)
        if box is not None:
            box.settled = max(box.settled, step)
            for old in [s for s in box.pending if s <= step]:
                del box.pending[old]

    async def take(self, session: str, step: int, wait: float) -> Pushed | None:
        """The input pushed for `step`, waiting up to `wait` seconds for it (less if the sender's push
        stream ended and it has no connection left); None if it did not come (the step is settled either
        way: a later push for it is refused)."""
        box = self._boxes.get(session)
        if box is None:
            return None
        if step <= box.settled:
            raise ServeError(f"step {step} of session {session[:16]} is already settled")
        deadline = asyncio.get_running_loop().time() + wait
        while step not in box.pending and self._boxes.get(session) is box:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            if box.gone:
                if box.sender is None or not self.connected(box.sender):
                    break
                left = min(left, SENDER_POLL_S)   # its connection may still be closing: look again soon
            box.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.arrived.wait(), left)
        pushed = box.pending.get(step)
        self.settle(session, step)
        return pushed


class PushLink:
    """A stream from this server to the next one, carrying pushes in order."""

    def __init__(self, host, target: Target, protocol: str):
        self.host, self.peer, self.protocol = host, target.peer, protocol
        self._lock = asyncio.Lock()
        self._stream: Any = None
        # the client's addresses for the next server are used only for a peer this Host knows no way to:
        # a client must not displace what the node learned itself (its peer book keeps a few per peer)
        if not host.peerbook.addrs(target.peer) and not host.connections(target.peer):
            for addr in target.addrs:
                with contextlib.suppress(ValueError, ProtocolError):   # not a multiaddr, or another peer's
                    host.peerbook.add_addrs(target.peer, [addr])

    async def open(self) -> Any:
        """The link's stream, opened now if it is not yet."""
        if self._stream is None:
            self._stream = await asyncio.wait_for(self.host.open_stream(self.peer, self.protocol), PUSH_TIMEOUT_S)
        return self._stream

    async def send(self, frame: bytes, read_reply) -> dict:
        """Send one push frame and return the acknowledgement's header (raises on any failure). A stream
        that breaks is opened again once: the Host may have moved the peer to another connection (a
        relayed one retired after a hole punch resets its streams)."""
        async with self._lock:
            for attempt in (1, 2):
                try:
                    stream = await self.open()
                    await stream.write(frame)
                    reply = await read_reply(stream, PUSH_TIMEOUT_S)
                    if reply is None:
                        raise ConnectionError("push stream ended")
                    return reply.header
                except TimeoutError:   # no acknowledgement in time: not worth another wait
                    self.close()
                    raise
                except (OSError, asyncio.IncompleteReadError, ProtocolError):
                    self.close()
                    if attempt == 2:
                        raise
                except BaseException:
                    self.close()
                    raise
            raise AssertionError("unreachable")

    def close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.reset()
            self._stream = None
