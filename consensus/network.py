"""The consensus driver's network port, and its production implementation over the node's ``Host``.

``ConsensusNetwork`` is all the driver needs from a network: ``start(deliver)`` (from then on each
received payload is passed to ``deliver(peer, payload)``, which raises ``MessageError`` for a bad
one), ``send(peer, payload)`` (never blocks; may drop) and ``await stop()``. ``HostNetwork`` carries
payloads on protocol ``/dekube/consensus/1.0.0`` as frames ``len u32 | payload`` over one
long-lived outbound stream per peer (bounded ``PeerSender`` queues, oldest dropped: gossip recovers
them); a malformed or oversized frame closes that stream only. ``admits(peer, payload)`` says which
peers may send what (the driver lets committee members send anything and other peers only sync
requests: protocol access by role); a refused frame closes that stream. ``prune(keep)`` closes the
senders of peers no longer gossiped with. The deterministic simulator (``devtools.consensus_sim``)
plugs in its own implementation.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable
from typing import Protocol

from consensus.messages import MAX_PROPOSAL_VALUE_BYTES, MessageError
from node.p2p.peer_sender import PeerSender

PROTOCOL = "/dekube/consensus/1.0.0"
MAX_CERTIFICATE_VOTES = 1024
MAX_FRAME_BYTES = MAX_PROPOSAL_VALUE_BYTES + 256 * MAX_CERTIFICATE_VOTES
_LEN = struct.Struct(">I")
log = logging.getLogger(__name__)

Deliver = Callable[[str | None, bytes], None]
Admits = Callable[[str | None, bytes], bool]


class FrameError(MessageError):
    """A frame on the consensus protocol is malformed or too large."""


class ConsensusNetwork(Protocol):
    def start(self, deliver: Deliver) -> None: ...

    def send(self, peer: str, payload: bytes) -> None: ...

    async def stop(self) -> None: ...

    def prune(self, keep: set[str]) -> None: ...


def frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


async def read_frame(stream, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One frame's payload; ``asyncio.IncompleteReadError`` at a clean end of stream."""
    (length,) = _LEN.unpack(await stream.readexactly(4))
    if length == 0 or length > max_bytes:
        raise FrameError(f"frame of {length} bytes outside 1..{max_bytes}")
    return await stream.readexactly(length)


class HostNetwork:
    """``ConsensusNetwork`` over a ``Host``: ``set_handler``/``remove_handler``/``open_stream``."""

    def __init__(self, host, max_send_queue: int = 1024, open_timeout: float = 3.0,
                 admits: Admits | None = None) -> None:
        self.host = host
        self.max_send_queue = max_send_queue
        self.open_timeout = open_timeout
        self.admits = admits
        self._deliver: Deliver | None = None
        self._senders: dict[str, PeerSender] = {}
        self.rejected_frames = 0
        self.refused_frames = 0

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self.host.set_handler(PROTOCOL, self._handle_stream)

    def send(self, peer: str, payload: bytes) -> None:
        sender = self._senders.get(peer)
        if sender is None:
            sender = self._senders[peer] = PeerSender(self.host, peer, PROTOCOL, self.max_send_queue,
                                                      self.open_timeout)
        sender.send(frame(payload))

    async def stop(self) -> None:
        self.host.remove_handler(PROTOCOL)
        for sender in list(self._senders.values()):
            await sender.close()
        self._senders.clear()

    def prune(self, keep: set[str]) -> None:
        """Close the senders of peers not in ``keep`` whose queue is empty (a pending sync reply
        to a non-member still goes out; its sender is pruned at a later call)."""
        for peer in [p for p, sender in self._senders.items() if p not in keep and sender.queue.empty()]:
            asyncio.get_running_loop().create_task(self._senders.pop(peer).close())

    async def _handle_stream(self, stream) -> None:
        peer = getattr(stream, "remote_peer", None)
        admits, deliver = self.admits, self._deliver
        if deliver is None:   # the handler is set by start(), after _deliver
            return
        try:
            while True:
                payload = await read_frame(stream)
                if admits is not None and not admits(peer, payload):
                    self.refused_frames += 1
                    log.info("closing consensus stream from %s: not a committee member", peer)
                    return
                deliver(peer, payload)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except MessageError as exc:
            self.rejected_frames += 1
            log.info("closing consensus stream from %s: %s", peer, exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
