"""The QUIC transport: ``/ip4|ip6/<ip>/udp/<port>/quic-v1`` (libp2p/specs quic/README.md) on aioquic.

aioquic's ``QuicConnection`` is sans-I/O; this module is its driver. A ``QuicEndpoint`` owns one
UDP socket, routes datagrams to sessions by destination connection ID, accepts QUIC v1 Initials
when listening (at most ``max_pending`` handshakes at once, each given ``handshake_timeout``) and
dials from the same socket (the listening port, as a hole punch needs). A ``QuicSession`` is one
connection: TLS 1.3 with ALPN ``libp2p`` and the libp2p certificate of node/p2p/tls_cert.py both
ways (the server asks for the client's), verified after the handshake, the dialer also checking
the peer ID it expected. There is no noise or yamux: each QUIC bidirectional stream is a libp2p
stream (node/p2p/quic_stream.py), and the session offers the calls the Host makes on a secured
connection (``remote_peer``, ``close``, ``is_closed``, ``tcp.peername``...) and on a muxer
(``start``, ``open_stream``, ``ping``, ``closed``, ``num_streams``), so the Host registers it as a
``Connection`` and its protocol handlers run unchanged. A keepalive ping every ``KEEPALIVE_S``
keeps NAT mappings and the idle timer alive.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicPacketType, QuicProtocolVersion, pull_quic_header

from node.identity import Identity

from .errors import HandshakeTimeout, ProtocolError
from .muxer import MuxerClosedError, StreamResetError
from .quic_stream import QuicStream
from .tls_cert import CertificateError, make_certificate, verify_loaded_certificate

ALPN = "libp2p"
CID_LENGTH = 8
IDLE_TIMEOUT_S = 30.0
KEEPALIVE_S = 10.0
MAX_DATA = 16 << 20          # connection flow-control window we grant
MAX_STREAM_DATA = 4 << 20    # per-stream window we grant
MIN_INITIAL_BYTES = 1200     # RFC 9000 14.1: a client Initial is padded to at least this
ERROR_PEER_REFUSED = 0x100   # application close code for a failed libp2p identity check

StreamHandler = Callable[[QuicStream], Awaitable[None]]
log = logging.getLogger(__name__)


class _Connection(QuicConnection):
    """aioquic's QuicConnection with receive windows that follow the application's reads.

    aioquic doubles a stream's (and the connection's) window whenever the peer has sent half of
    it, read or not, so a peer could make us buffer without bound. Here a stream's window ends
    ``MAX_STREAM_DATA`` past what its reader consumed and the connection's ``MAX_DATA`` past all
    consumed: at most that much is ever buffered. (Overrides two private hooks, aioquic 1.x; the
    memory bound is checked by tests/p2p/test_quic.py.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumed: dict[int, int] = {}   # stream id -> bytes its reader took
        self.consumed_total = 0

    def _write_stream_limits(self, builder: Any, space: Any, stream: Any) -> None:
        if stream.max_stream_data_local:
            target = self.consumed.get(stream.stream_id, 0) + MAX_STREAM_DATA
            if target - stream.max_stream_data_local >= MAX_STREAM_DATA // 2:
                stream.max_stream_data_local = target
        receiver = stream.receiver
        highest, receiver.highest_offset = receiver.highest_offset, 0   # disarm aioquic's doubling
        try:
            super()._write_stream_limits(builder, space, stream)
        finally:
            receiver.highest_offset = highest

    def _write_connection_limits(self, builder: Any, space: Any) -> None:
        max_data = self._local_max_data
        max_data.value = max(max_data.value, self.consumed_total + MAX_DATA)
        used, max_data.used = max_data.used, 0   # disarm aioquic's doubling
        try:
            super()._write_connection_limits(builder, space)
        finally:
            max_data.used = used


class _ServerConnection(_Connection):
    """A server-side connection that asks the client for its certificate (aioquic only does so
    behind a private flag of its TLS context, set as soon as that context exists)."""

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self.tls._request_client_certificate = True


class QuicTls:
    """Our libp2p certificate and the aioquic configurations that present it."""

    def __init__(self, identity: Identity) -> None:
        self.certificate, self.private_key = make_certificate(identity)

    def configuration(self, is_client: bool) -> QuicConfiguration:
        config = QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN], connection_id_length=CID_LENGTH,
                                   idle_timeout=IDLE_TIMEOUT_S, max_data=MAX_DATA,
                                   max_stream_data=MAX_STREAM_DATA, verify_mode=ssl.CERT_NONE,
                                   supported_versions=[QuicProtocolVersion.VERSION_1])
        config.certificate = self.certificate
        config.private_key = self.private_key
        return config


class QuicSession:
    """One QUIC connection, driven over its endpoint's socket."""

    def __init__(self, endpoint: QuicEndpoint, quic: _Connection, addr: tuple[str, int], *,
                 is_initiator: bool, expected_peer: str | None) -> None:
        self._endpoint = endpoint
        self._quic = quic
        self._addr = addr
        self._loop = asyncio.get_running_loop()
        self.is_initiator = is_initiator
        self._expected_peer = expected_peer
        self.remote_peer = ""
        self.handshake: asyncio.Future[None] = self._loop.create_future()
        self.connection_lost_callbacks: list[Callable[[], None]] = []
        self._streams: dict[int, QuicStream] = {}
        self._handler: StreamHandler | None = None
        self._backlog: list[QuicStream] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._progress: asyncio.Future[None] | None = None   # woken when acks or MAX_STREAMS arrive
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._ping_uid = 0
        self._closed = False
        self.going_away = asyncio.Event()   # set when a graceful close starts (QUIC has no GoAway to send)
        self._keepalive: asyncio.TimerHandle | None = None
        self._unsignalled = 0   # bytes read since we last sent window updates
        self._transmit_handle: asyncio.Handle | None = None
        self.answered: asyncio.Future[None] = self._loop.create_future()   # a first datagram came back

    # ---- the secured-connection face (what Connection and Host read)
    @property
    def tcp(self) -> QuicSession:
        """The Host reads peername/sockname/connection_lost_callbacks from ``secure.tcp``."""
        return self

    @property
    def peername(self) -> tuple[str, int] | None:
        return self._addr

    @property
    def sockname(self) -> tuple[str, int] | None:
        return self._endpoint.sockname

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    async def close(self, *, drain_timeout: float = 0.0) -> None:
        """Close the connection; with ``drain_timeout``, open streams get that long to finish first
        (the muxer's graceful close: QUIC has no GoAway, the Host routes new streams elsewhere)."""
        deadline = self._loop.time() + drain_timeout
        self.going_away.set()
        while self._streams and not self._closed and self._loop.time() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - self._loop.time())))
        if not self._closed:
            self._quic.close(error_code=0, reason_phrase="")
            self._transmit()
            self._terminate(ConnectionResetError("connection closed"))
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def abort(self, reason: str, error: ProtocolError | None = None) -> None:
        """Close with the libp2p refusal code; a pending handshake fails with ``error``
        (default: CertificateError, a failed identity check)."""
        if not self._closed:
            self._quic.close(error_code=ERROR_PEER_REFUSED, reason_phrase=reason[:100])
            self._transmit()
            self._terminate(error or CertificateError(reason))

    # ---- the muxer face
    async def start(self) -> None:
        """Hand inbound streams to the handler from now on (those that arrived before go first)."""
        if self._handler is None:
            raise RuntimeError("set_stream_handler first")
        backlog, self._backlog = self._backlog, []
        for stream in backlog:
            self._spawn_handler(stream)

    def set_stream_handler(self, handler: StreamHandler) -> None:
        self._handler = handler

    async def open_stream(self) -> QuicStream:
        while True:
            if self._closed:
                raise MuxerClosedError("quic connection closed")
            stream_id = self._quic.get_next_available_stream_id()
            # the peer's MAX_STREAMS credit (aioquic would refuse the first send past it)
            if stream_id // 4 < getattr(self._quic, "_remote_max_streams_bidi", 1 << 60):
                break
            await self._wait_progress()
        stream = QuicStream(self, stream_id)
        self._streams[stream_id] = stream
        # a zero-length send creates the stream in aioquic, so the next ID is not handed out twice
        self._quic.send_stream_data(stream_id, b"", end_stream=False)
        return stream

    async def ping(self) -> float:
        if self._closed:
            raise MuxerClosedError("quic connection closed")
        self._ping_uid += 1
        uid = self._ping_uid
        waiter = self._loop.create_future()
        self._pings[uid] = waiter
        start = time.monotonic()
        self._quic.send_ping(uid)
        self._transmit()
        try:
            await waiter
        finally:
            self._pings.pop(uid, None)
        return time.monotonic() - start

    # ---- stream calls (from QuicStream)
    def _send(self, stream_id: int, data: bytes, *, end: bool) -> None:
        if self._closed:
            raise MuxerClosedError("quic connection closed")
        self._quic.send_stream_data(stream_id, data, end_stream=end)
        self._transmit_soon()

    def _reset(self, stream_id: int) -> None:
        if self._closed:
            return
        with contextlib.suppress(ValueError, AssertionError):  # a direction already finished
            self._quic.reset_stream(stream_id, error_code=0)
        with contextlib.suppress(ValueError, AssertionError):
            self._quic.stop_stream(stream_id, error_code=0)
        self._transmit()

    def _stream_progress(self, stream: QuicStream) -> None:
        if stream.finished:
            self._drop(stream)

    def _drop(self, stream: QuicStream) -> None:
        self._streams.pop(stream.stream_id, None)
        self._quic.consumed.pop(stream.stream_id, None)
        self._quic.consumed_total += stream._discard()   # unread bytes give their credit back

    def _consumed(self, stream_id: int, n: int) -> None:
        """The reader took ``n`` bytes: the windows move on (sent once a quarter window is read)."""
        if stream_id in self._quic.consumed or stream_id in self._streams:
            self._quic.consumed[stream_id] = self._quic.consumed.get(stream_id, 0) + n
        self._quic.consumed_total += n
        self._unsignalled += n
        if self._unsignalled >= MAX_STREAM_DATA // 4 and not self._closed:
            self._unsignalled = 0
            self._transmit()

    async def _wait_send_room(self, stream: QuicStream, high_water: int) -> None:
        while self._unacked(stream.stream_id) > high_water:
            if stream._error is not None:
                raise stream._error
            await self._wait_progress()

    def _unacked(self, stream_id: int) -> int:
        quic_stream = getattr(self._quic, "_streams", {}).get(stream_id)
        sender = getattr(quic_stream, "sender", None)
        if sender is None:
            return 0
        return max(0, int(sender._buffer_stop) - int(sender._buffer_start))

    async def _wait_progress(self) -> None:
        if self._closed:
            raise MuxerClosedError("quic connection closed")
        if self._progress is None or self._progress.done():
            self._progress = self._loop.create_future()
        await asyncio.shield(self._progress)

    def _wake_progress(self) -> None:
        if self._progress is not None and not self._progress.done():
            self._progress.set_result(None)

    # ---- the driver
    def connect(self) -> None:
        self._quic.connect(self._addr, now=self._loop.time())
        self._transmit()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._closed:
            return
        if not self.answered.done():
            self.answered.set_result(None)
        self._quic.receive_datagram(data, addr, now=self._loop.time())
        self._process_events()
        self._transmit_soon()   # one flight for all the datagrams this loop iteration delivers
        self._wake_progress()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed:
            return
        self._quic.handle_timer(now=self._loop.time())
        self._process_events()
        self._transmit()

    def _transmit_soon(self) -> None:
        if self._transmit_handle is None:
            self._transmit_handle = self._loop.call_soon(self._transmit)

    def _transmit(self) -> None:
        if self._transmit_handle is not None:
            self._transmit_handle.cancel()
            self._transmit_handle = None
        if self._endpoint.transport is None:
            return
        for data, addr in self._quic.datagrams_to_send(now=self._loop.time()):
            self._endpoint.transport.sendto(data, addr)
        timer_at = self._quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None and not self._closed:
            self._timer = self._loop.call_at(timer_at, self._on_timer)
        self._timer_at = timer_at

    def _send_keepalive(self) -> None:
        self._keepalive = None
        if self._closed:
            return
        self._quic.send_ping(0)
        self._transmit()
        self._keepalive = self._loop.call_later(KEEPALIVE_S, self._send_keepalive)

    def _process_events(self) -> None:
        while (event := self._quic.next_event()) is not None:
            if isinstance(event, events.ConnectionIdIssued):
                self._endpoint._route(event.connection_id, self)
            elif isinstance(event, events.ConnectionIdRetired):
                self._endpoint._unroute(event.connection_id)
            elif isinstance(event, events.HandshakeCompleted):
                self._on_handshake(event)
            elif isinstance(event, events.StreamDataReceived):
                self._on_stream_data(event)
            elif isinstance(event, events.StreamReset):
                stream = self._streams.get(event.stream_id)
                if stream is not None:
                    stream._fail(_reset_error(event.stream_id))
                    self._drop(stream)
            elif isinstance(event, events.StopSendingReceived):
                stream = self._streams.get(event.stream_id)
                with contextlib.suppress(ValueError, AssertionError):
                    self._quic.reset_stream(event.stream_id, error_code=0)
                if stream is not None:
                    stream._fail(_reset_error(event.stream_id))
                    self._stream_progress(stream)
            elif isinstance(event, events.PingAcknowledged):
                waiter = self._pings.get(event.uid)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif isinstance(event, events.ConnectionTerminated):
                self._terminate(ConnectionResetError(
                    f"quic connection terminated: {event.error_code:#x} {event.reason_phrase}"))
                return

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        tls = self._quic.tls
        try:
            if event.alpn_protocol != ALPN:
                raise CertificateError(f"ALPN {event.alpn_protocol!r}, not {ALPN!r}")
            certificate = getattr(tls, "_peer_certificate", None)
            if certificate is None or getattr(tls, "_peer_certificate_chain", []):
                raise CertificateError("the peer must present exactly one certificate")
            peer = verify_loaded_certificate(certificate)
            if self._expected_peer is not None and peer != self._expected_peer:
                raise CertificateError(f"dialed {self._expected_peer}, reached {peer}")
        except CertificateError as exc:
            log.debug("quic handshake with %s refused: %s", self._addr, exc)
            self.abort(str(exc))
            return
        self.remote_peer = peer
        self._keepalive = self._loop.call_later(KEEPALIVE_S, self._send_keepalive)
        if not self.handshake.done():
            self.handshake.set_result(None)

    def _on_stream_data(self, event: events.StreamDataReceived) -> None:
        stream_id = event.stream_id
        stream = self._streams.get(stream_id)
        if stream is None:
            remote_bidi = (stream_id & 0x2) == 0 and bool(stream_id & 0x1) == self.is_initiator
            if not remote_bidi or not self.handshake.done():
                # unidirectional streams carry nothing in libp2p; a stream we already dropped
                with contextlib.suppress(ValueError, AssertionError):
                    self._quic.stop_stream(stream_id, error_code=0)
                return
            stream = QuicStream(self, stream_id)
            self._streams[stream_id] = stream
            if self._handler is None:
                self._backlog.append(stream)
            else:
                self._spawn_handler(stream)
        stream._feed(event.data, event.end_stream)
        self._stream_progress(stream)   # a FIN after our own close() ends it

    def _spawn_handler(self, stream: QuicStream) -> None:
        handler = self._handler
        assert handler is not None

        async def run() -> None:
            await handler(stream)
        task = self._loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _terminate(self, error: BaseException) -> None:
        if self._closed:
            return
        self._closed = True
        for handle in (self._timer, self._keepalive, self._transmit_handle):
            if handle is not None:
                handle.cancel()
        self._endpoint._forget(self)
        if not self.handshake.done():
            self.handshake.set_exception(error if isinstance(error, ProtocolError)
                                         else ConnectionResetError(str(error)))
            self.handshake.exception()  # mark retrieved: the dialer re-raises it itself
        for waiter in self._pings.values():
            if not waiter.done():
                waiter.set_exception(MuxerClosedError("quic connection closed"))
        self._wake_progress()
        for stream in list(self._streams.values()) + self._backlog:
            stream._connection_lost()
        self._streams.clear()
        self._backlog.clear()
        for task in list(self._tasks):
            task.cancel()
        callbacks, self.connection_lost_callbacks = self.connection_lost_callbacks, []
        for callback in callbacks:
            callback()


def _reset_error(stream_id: int) -> ConnectionError:
    return StreamResetError(f"quic stream {stream_id} was reset by the peer")


class QuicEndpoint(asyncio.DatagramProtocol):
    """One UDP socket: sessions routed by connection ID; inbound QUIC accepted when ``on_inbound``."""

    def __init__(self, tls: QuicTls, on_inbound: Callable[[QuicSession], None] | None = None, *,
                 handshake_timeout: float = 10.0, max_pending: int = 256) -> None:
        self._tls = tls
        self._on_inbound = on_inbound
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending
        self.transport: asyncio.DatagramTransport | None = None
        self._routes: dict[bytes, QuicSession] = {}
        self._sessions: set[QuicSession] = set()
        self._pending: set[QuicSession] = set()
        self._server_config = tls.configuration(is_client=False) if on_inbound is not None else None

    @classmethod
    async def open(cls, host: str, port: int, tls: QuicTls, on_inbound: Callable[[QuicSession], None] | None = None,
                   **kwargs: Any) -> QuicEndpoint:
        endpoint = cls(tls, on_inbound, **kwargs)
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: endpoint, local_addr=(host, port))
        return endpoint

    @property
    def sockname(self) -> tuple[str, int] | None:
        if self.transport is None:
            return None
        name = self.transport.get_extra_info("sockname")
        return (name[0], name[1]) if name else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for session in list(self._sessions):
            session._terminate(ConnectionResetError("quic socket closed"))

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=CID_LENGTH)
        except ValueError:
            return
        session = self._routes.get(header.destination_cid)
        if session is None:
            session = self._accept(data, header.packet_type, header.version, header.destination_cid, addr)
            if session is None:
                return
        session.datagram_received(data, addr[:2])

    def _accept(self, data: bytes, packet_type: QuicPacketType, version: int | None, destination_cid: bytes,
                addr: tuple[str, int]) -> QuicSession | None:
        if (self._server_config is None or packet_type != QuicPacketType.INITIAL
                or version != QuicProtocolVersion.VERSION_1 or len(data) < MIN_INITIAL_BYTES):
            return None
        if len(self._pending) >= self._max_pending:
            log.debug("quic handshake from %s dropped: %d pending", addr, len(self._pending))
            return None
        quic = _ServerConnection(configuration=self._server_config,
                                 original_destination_connection_id=destination_cid)
        session = QuicSession(self, quic, (addr[0], addr[1]), is_initiator=False, expected_peer=None)
        self._add(session, [destination_cid, quic.host_cid])
        session.handshake.add_done_callback(lambda fut: self._on_accepted(session, fut))
        return session

    def _on_accepted(self, session: QuicSession, fut: asyncio.Future[None]) -> None:
        self._pending.discard(session)
        if fut.cancelled() or fut.exception() is not None:
            return
        assert self._on_inbound is not None
        self._on_inbound(session)

    def _add(self, session: QuicSession, cids: list[bytes]) -> None:
        self._sessions.add(session)
        for cid in cids:
            self._routes[cid] = session
        if not session.is_initiator:   # a dial keeps its own time
            self._pending.add(session)
            asyncio.get_running_loop().call_later(self._handshake_timeout, self._handshake_deadline, session)

    def _handshake_deadline(self, session: QuicSession) -> None:
        if not session.handshake.done():
            session.abort("handshake timeout", HandshakeTimeout("quic handshake timeout"))
        self._pending.discard(session)

    async def dial(self, addr: tuple[str, int], expected_peer: str | None, timeout: float, *,
                   answer_timeout: float | None = None, on_answer: Callable[[], None] | None = None) -> QuicSession:
        """A verified session to ``addr`` from this socket; CertificateError when it is not
        ``expected_peer``. ``answer_timeout`` bounds the wait for the peer's first datagram (the
        TCP connect's analogue: a dead address fails fast; ConnectionError), ``on_answer`` is
        called when it comes; ``timeout`` bounds the whole handshake (HandshakeTimeout)."""
        if self.transport is None:
            raise ConnectionError("quic socket closed")
        quic = _Connection(configuration=self._tls.configuration(is_client=True))
        session = QuicSession(self, quic, addr, is_initiator=True, expected_peer=expected_peer)
        self._add(session, [quic.host_cid])
        session.connect()
        try:
            async with asyncio.timeout(timeout):
                if answer_timeout is not None:
                    try:
                        await asyncio.wait_for(asyncio.shield(session.answered), answer_timeout)
                    except TimeoutError:
                        raise ConnectionError(f"no QUIC answer from {addr} within {answer_timeout} s") from None
                if on_answer is not None:
                    on_answer()
                await asyncio.shield(session.handshake)
        except TimeoutError:
            session.abort("handshake timeout", HandshakeTimeout("quic handshake timeout"))
            raise HandshakeTimeout(f"quic handshake with {addr} took longer than {timeout} s") from None
        except BaseException:
            session.abort("dial abandoned", HandshakeTimeout("dial abandoned"))
            raise
        return session

    @property
    def listening(self) -> bool:
        """Whether this socket accepts inbound QUIC (a hole punch's server side needs one)."""
        return self._server_config is not None and self.transport is not None

    def send_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        """Send one raw datagram from this socket (the hole punch's NAT-opening packets)."""
        if self.transport is None:
            raise ConnectionError("quic socket closed")
        self.transport.sendto(data, addr)

    def _route(self, cid: bytes, session: QuicSession) -> None:
        if not session.closed:
            self._routes[cid] = session

    def _unroute(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def _forget(self, session: QuicSession) -> None:
        self._sessions.discard(session)
        self._pending.discard(session)
        for cid in [cid for cid, s in self._routes.items() if s is session]:
            del self._routes[cid]

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._sessions)), return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
