"""Sans-I/O yamux (`/yamux/1.0.0`) session: frame codec, stream state machine and flow control.

Bytes from the peer go in through `YamuxSession.receive_data`, which returns events; commands
(`open_stream`, `send_data`, `end_stream`, `reset_stream`, `acknowledge_received`, `send_ping`,
`go_away`) queue frames that `data_to_send` hands out. No sockets, no asyncio, no clock: callers
pass `now` (seconds from any monotonic origin) where time matters.

Wire format: the hashicorp yamux spec as libp2p uses it: a 12-byte big-endian header (version 0,
type Data/WindowUpdate/Ping/GoAway, flags SYN/ACK/FIN/RST, stream id, length), odd stream ids for
the connection initiator and even ones for the responder, 256 KiB initial window per stream.

Flow control: the peer may never have more than our advertised window in flight on a stream, so the
unread data the caller buffers per stream is bounded by that window; a data frame beyond it is a
protocol error that terminates the session. Consumed bytes are credited back in batches (once half
of the window is consumed). Auto-tuning is per session, so concurrent streams share fairly: the
session keeps one tuned window, doubled (up to `max_window`) when a stream using it consumes it
within a few round trips, like go-yamux; every stream moves to the tuned window at its next window
update, capped at its fair share of the session's growth budget (the budget split evenly among the
streams that have sent a window update, i.e. moved at least half a window). A stream above its
share shrinks by withholding credit, never by revoking it. Per-stream doubling instead lets the
first fast streams take the whole budget and starve the others: with the window deciding each
stream's share of a shared bottleneck, 8 flows on one connection then had a Jain index of 0.26-0.44.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

PROTOCOL_ID = "/yamux/1.0.0"

HEADER = struct.Struct(">BBHII")
HEADER_SIZE = HEADER.size
VERSION = 0

TYPE_DATA = 0x0
TYPE_WINDOW_UPDATE = 0x1
TYPE_PING = 0x2
TYPE_GO_AWAY = 0x3

FLAG_SYN = 0x1
FLAG_ACK = 0x2
FLAG_FIN = 0x4
FLAG_RST = 0x8

GO_AWAY_NORMAL = 0x0
GO_AWAY_PROTOCOL_ERROR = 0x1
GO_AWAY_INTERNAL_ERROR = 0x2

MAX_UINT32 = 0xFFFFFFFF
INITIAL_WINDOW = 256 * 1024
MAX_WINDOW = 16 * 1024 * 1024
DEFAULT_MAX_FRAME_PAYLOAD = 256 * 1024  # rust-yamux drops connections sending data frames > 1 MiB
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_WINDOW_GROWTH_BUDGET = 64 * 1024 * 1024

# A window consumed faster than this many round trips is too small for the stream: double it.
_GROW_WITHIN_RTTS = 4
# RTT assumed before the first pong, and the floor for measured ones (event-loop jitter dominates).
_MIN_TUNING_RTT = 0.001
_MAX_OUTSTANDING_PINGS = 16
# While streams move data, the RTT used for tuning is re-measured by a ping at most this often: one
# sample from connection set-up (taken amid handshakes, 1-15 ms on a loaded host) would otherwise
# decide every growth, so connections through the same bottleneck got very different windows.
RTT_REFRESH_INTERVAL = 0.25
# Bodies read from a memoryview are handed out as views (no copy) when at least this large and at
# least 1/_MAX_PIN_RATIO of that read, else as bytes: a view keeps its whole read buffer alive, so
# unread data can pin at most _MAX_PIN_RATIO times its size.
_VIEW_AT_LEAST = 16 * 1024
_MAX_PIN_RATIO = 16


class YamuxError(Exception):
    """Base class of every error this module raises."""


class YamuxProtocolError(YamuxError):
    """The peer's bytes violate the yamux protocol; the session is terminated with a GoAway."""

    code = GO_AWAY_PROTOCOL_ERROR


class YamuxSessionClosed(YamuxError):
    """The session was terminated, or a GoAway forbids opening streams."""


class YamuxStreamLimitError(YamuxError):
    """Opening the stream would exceed the session's stream limit."""


class YamuxStreamError(YamuxError):
    """A command named a stream that cannot take it (unknown, reset, or closed for writing)."""


class FrameHeader(NamedTuple):
    frame_type: int
    flags: int
    stream_id: int
    length: int


def encode_header(frame_type: int, flags: int, stream_id: int, length: int) -> bytes:
    """Encode one 12-byte yamux header; raises ValueError on out-of-range fields."""
    if not 0 <= frame_type <= TYPE_GO_AWAY:
        raise ValueError(f"unknown yamux frame type {frame_type}")
    if not 0 <= flags <= 0xFFFF:
        raise ValueError(f"yamux flags out of range: {flags}")
    if not 0 <= stream_id <= MAX_UINT32 or not 0 <= length <= MAX_UINT32:
        raise ValueError("yamux stream id and length must fit in 32 bits")
    return HEADER.pack(VERSION, frame_type, flags, stream_id, length)


def decode_header(data: bytes | memoryview, offset: int = 0) -> FrameHeader:
    """Decode the header at `offset`; raises YamuxProtocolError if short, wrong version or type."""
    if len(data) - offset < HEADER_SIZE:
        raise YamuxProtocolError(f"truncated yamux header: {len(data) - offset} of {HEADER_SIZE} bytes")
    version, frame_type, flags, stream_id, length = HEADER.unpack_from(data, offset)
    if version != VERSION:
        raise YamuxProtocolError(f"unsupported yamux version {version}")
    if frame_type > TYPE_GO_AWAY:
        raise YamuxProtocolError(f"unknown yamux frame type {frame_type}")
    return FrameHeader(frame_type, flags, stream_id, length)


@dataclass(slots=True)
class StreamOpened:
    """The peer opened a stream and we accepted it (the ACK is queued)."""

    stream_id: int


@dataclass(slots=True)
class DataReceived:
    """Payload bytes for a stream; one data frame may arrive as several of these."""

    stream_id: int
    data: bytes | memoryview


@dataclass(slots=True)
class StreamEnded:
    """The peer half-closed the stream (FIN): no more data will arrive on it."""

    stream_id: int


@dataclass(slots=True)
class StreamReset:
    """The peer reset the stream (RST), or refused a stream we opened."""

    stream_id: int


@dataclass(slots=True)
class SendWindowOpened:
    """The peer granted more send window on a stream: blocked writers may proceed."""

    stream_id: int


@dataclass(slots=True)
class PongReceived:
    """The peer answered our ping `opaque`; `rtt` is in the caller's time unit."""

    opaque: int
    rtt: float


@dataclass(slots=True)
class GoAwayReceived:
    """The peer will accept no new streams; existing streams continue."""

    code: int


YamuxEvent = (StreamOpened | DataReceived | StreamEnded | StreamReset | SendWindowOpened | PongReceived
              | GoAwayReceived)


class _Stream:
    """Per-stream flow-control and half-close state."""

    __slots__ = ("inbound", "send_window", "recv_window", "recv_credit", "consumed",
                 "epoch_start", "sharing", "local_fin", "remote_fin")

    def __init__(self, inbound: bool) -> None:
        self.inbound = inbound
        self.send_window = INITIAL_WINDOW  # bytes we may still send
        self.recv_window = INITIAL_WINDOW  # window size we advertise (grows by auto-tuning)
        self.recv_credit = INITIAL_WINDOW  # bytes the peer may still send before our next update
        self.consumed = 0  # bytes the caller consumed since our last window update
        self.epoch_start: float | None = None  # when the current window epoch began
        self.sharing = False  # has had a window update: counts in the growth budget's split
        self.local_fin = False
        self.remote_fin = False


class WindowTuner:
    """Receive-window auto-tuning state: the tuned window and a growth budget split fairly.

    Each session has a private one by default; a host passes one shared tuner to all its sessions,
    so that connections through one bottleneck (circuits through a relay, bulk connections) get
    the same windows and the budget bounds the receive memory of the whole host.
    """

    __slots__ = ("tuned_window", "growth_budget", "growth", "sharing")

    def __init__(self, growth_budget: int = DEFAULT_WINDOW_GROWTH_BUDGET) -> None:
        if growth_budget < 0:
            raise ValueError("growth_budget must not be negative")
        self.tuned_window = INITIAL_WINDOW  # the window every busy stream moves to
        self.growth_budget = growth_budget  # bytes of window beyond INITIAL_WINDOW, all streams
        self.growth = 0  # sum over streams of (recv_window - INITIAL_WINDOW)
        self.sharing = 0  # streams that have had a window update (the budget is split among them)

    def fair_share(self) -> int:
        """The largest window a sharing stream may hold."""
        return INITIAL_WINDOW + self.growth_budget // max(self.sharing, 1)


class YamuxSession:
    """One yamux session (one connection's worth of streams), without I/O."""

    def __init__(
        self,
        is_initiator: bool,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        max_window: int = MAX_WINDOW,
        max_frame_payload: int = DEFAULT_MAX_FRAME_PAYLOAD,
        window_growth_budget: int = DEFAULT_WINDOW_GROWTH_BUDGET,
        window_tuner: WindowTuner | None = None,
    ) -> None:
        """``window_tuner``: auto-tuning state shared with other sessions (then its budget applies
        and ``window_growth_budget`` is unused); by default a private one with that budget."""
        if max_streams < 1 or max_frame_payload < 1:
            raise ValueError("max_streams and max_frame_payload must be positive")
        if not INITIAL_WINDOW <= max_window <= MAX_UINT32:
            raise ValueError(f"max_window must be in [{INITIAL_WINDOW}, {MAX_UINT32}]")
        self.is_initiator = is_initiator
        self.max_streams = max_streams
        self.max_window = max_window
        self.max_frame_payload = max_frame_payload
        self.window_tuner = window_tuner or WindowTuner(window_growth_budget)
        self.rtt: float | None = None  # last measured ping round trip
        self.local_go_away = False
        self.remote_go_away: int | None = None  # the peer's GoAway code, once received
        self.terminated = False
        self._next_stream_id = 1 if is_initiator else 2
        self._streams: dict[int, _Stream] = {}
        self._inbound = 0
        self._outbound = 0
        self._out: list[bytes | memoryview] = []
        self._out_size = 0
        self._pings: dict[int, float] = {}
        self._last_ping_at: float | None = None
        self._next_ping = 0
        # Parser state: a partial header, or the rest of a data frame's body.
        self._partial_header = b""
        self._body_left = 0
        self._body_stream_id = 0
        self._body_stream: _Stream | None = None  # None: discard the body
        self._body_flags = 0

    # ------------------------------------------------------------------ queries

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def outbound_size(self) -> int:
        """Bytes queued for `data_to_send`."""
        return self._out_size

    def has_stream(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def send_window(self, stream_id: int) -> int:
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.send_window

    def receive_window(self, stream_id: int) -> int:
        """The window size we currently advertise on a stream (0 if unknown)."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.recv_window

    def data_to_send(self) -> bytes:
        """Take all queued frames as one buffer (b"" if none)."""
        out = self.data_to_send_parts()
        if len(out) == 1 and type(out[0]) is bytes:
            return out[0]
        return b"".join(out)

    def data_to_send_parts(self) -> list[bytes | memoryview]:
        """Take all queued frames as a list of buffers (headers and payload views, in order),
        for a writer that sends a list without joining it ([] if none)."""
        out = self._out
        if out:
            self._out = []
            self._out_size = 0
        return out

    # ----------------------------------------------------------------- commands

    def open_stream(self) -> int:
        """Open an outbound stream (queues a SYN) and return its id."""
        if self.terminated or self.local_go_away:
            raise YamuxSessionClosed("yamux session is closed")
        if self.remote_go_away is not None:
            raise YamuxSessionClosed(f"peer sent GoAway (code {self.remote_go_away})")
        if self._outbound >= self.max_streams:
            raise YamuxStreamLimitError(f"stream limit reached ({self.max_streams} outbound streams)")
        stream_id = self._next_stream_id
        if stream_id > MAX_UINT32:
            raise YamuxSessionClosed("yamux stream ids exhausted")
        self._next_stream_id = stream_id + 2
        self._streams[stream_id] = _Stream(inbound=False)
        self._outbound += 1
        self._queue(TYPE_WINDOW_UPDATE, FLAG_SYN, stream_id, 0)
        return stream_id

    def send_data(self, stream_id: int, data: bytes | memoryview) -> int:
        """Queue as much of `data` as the send window allows; return how many bytes were queued.

        `data` must not change while queued: it is referenced, not copied, until `data_to_send`
        joins the queued frames or the writer of `data_to_send_parts` has sent them.
        """
        stream = self._writable_stream(stream_id)
        size = min(len(data), stream.send_window)
        if size <= 0:
            return 0
        view = data if size == len(data) else memoryview(data)[:size]
        limit = self.max_frame_payload
        pos = 0
        while pos < size:
            take = min(size - pos, limit)
            self._out.append(HEADER.pack(VERSION, TYPE_DATA, 0, stream_id, take))
            self._out.append(view if take == size else memoryview(view)[pos:pos + take])
            self._out_size += HEADER_SIZE + take
            pos += take
        stream.send_window -= size
        return size

    def end_stream(self, stream_id: int) -> None:
        """Half-close our side of the stream (FIN)."""
        stream = self._writable_stream(stream_id)
        stream.local_fin = True
        self._queue(TYPE_WINDOW_UPDATE, FLAG_FIN, stream_id, 0)
        if stream.remote_fin:
            self._remove(stream_id)

    def reset_stream(self, stream_id: int) -> None:
        """Abort the stream in both directions (RST); a no-op for streams already gone."""
        if self.terminated or stream_id not in self._streams:
            return
        self._queue(TYPE_WINDOW_UPDATE, FLAG_RST, stream_id, 0)
        self._remove(stream_id)

    def acknowledge_received(self, stream_id: int, size: int, now: float) -> None:
        """Tell the session the caller consumed `size` received bytes of a stream.

        Credits them back to the peer with a window update once half of the window is consumed,
        moving the stream's window to the session's tuned window (doubled first when this window
        was the tuned one and was consumed within a few round trips), capped at its fair share of
        the growth budget.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_fin or size <= 0:
            return
        stream.consumed += size
        window = stream.recv_window
        consumed = stream.consumed
        if consumed < window // 2:
            return
        tuner = self.window_tuner
        if not stream.sharing:
            stream.sharing = True
            tuner.sharing += 1
        epoch_start = stream.epoch_start
        rtt = max(self.rtt or 0.0, _MIN_TUNING_RTT)
        if (window >= tuner.tuned_window and epoch_start is not None
                and now - epoch_start < _GROW_WITHIN_RTTS * rtt):
            tuner.tuned_window = max(tuner.tuned_window, min(self.max_window, 2 * window))
        target = min(tuner.tuned_window, tuner.fair_share(), self.max_window)
        if target > window:  # grow, within what the budget has left
            target = window + max(0, min(target - window, tuner.growth_budget - tuner.growth))
        elif target < window:  # shrink by withholding at most the credit now due
            target = max(target, window - consumed)
        if target != window:
            tuner.growth += target - window
            stream.recv_window = target
        delta = consumed + target - window
        stream.epoch_start = now
        stream.consumed = 0
        if delta > 0:
            stream.recv_credit += delta
            self._queue(TYPE_WINDOW_UPDATE, 0, stream_id, delta)
        if self._last_ping_at is None or now - self._last_ping_at >= RTT_REFRESH_INTERVAL:
            self.send_ping(now)  # the pong, queued behind the peer's data, refreshes self.rtt

    def send_ping(self, now: float) -> int:
        """Queue a ping and return its opaque value; the pong arrives as PongReceived."""
        if self.terminated:
            raise YamuxSessionClosed("yamux session is closed")
        opaque = self._next_ping
        self._next_ping = (opaque + 1) & MAX_UINT32
        if len(self._pings) >= _MAX_OUTSTANDING_PINGS:
            del self._pings[next(iter(self._pings))]
        self._pings[opaque] = now
        self._last_ping_at = now
        self._queue(TYPE_PING, FLAG_SYN, 0, opaque)
        return opaque

    def go_away(self, code: int = GO_AWAY_NORMAL) -> None:
        """Tell the peer we accept no new streams (existing streams continue)."""
        if self.local_go_away or self.terminated:
            return
        self.local_go_away = True
        self._queue(TYPE_GO_AWAY, 0, 0, code)

    # ------------------------------------------------------------------ receive

    def receive_data(self, data: bytes | memoryview, now: float) -> list[YamuxEvent]:
        """Feed bytes from the peer; return the events they complete, in order.

        A data frame's body is handed out as slices of ``data``: memoryviews of a memoryview
        ``data`` when large (no copy; they keep ``data``'s buffer alive), bytes when small or a
        small part of ``data`` (so a little unread data never pins a large buffer).

        Raises YamuxProtocolError on a protocol violation (a GoAway with the protocol-error code is
        then queued and the session is terminated), and YamuxSessionClosed once terminated.
        """
        if self.terminated:
            raise YamuxSessionClosed("yamux session is closed")
        if type(data) is not bytes and type(data) is not memoryview:
            data = bytes(data)
        events: list[YamuxEvent] = []
        try:
            self._parse(data, now, events)
        except YamuxProtocolError:
            self._terminate(GO_AWAY_PROTOCOL_ERROR)
            raise
        return events

    def _parse(self, data: bytes | memoryview, now: float, events: list[YamuxEvent]) -> None:
        end = len(data)
        pos = 0
        if self._partial_header:
            need = HEADER_SIZE - len(self._partial_header)
            if end < need:
                self._partial_header += bytes(data)
                return
            header = self._partial_header + bytes(data[:need])
            self._partial_header = b""
            pos = need
            self._handle_header(header, 0, now, events)
        while pos < end:
            left = self._body_left
            if left:
                take = end - pos
                if take > left:
                    take = left
                if self._body_stream is not None:
                    if take == end:
                        chunk = data
                    elif type(data) is memoryview and (take < _VIEW_AT_LEAST or take * _MAX_PIN_RATIO < end):
                        chunk = bytes(data[pos:pos + take])
                    else:
                        chunk = data[pos:pos + take]
                    events.append(DataReceived(self._body_stream_id, chunk))
                pos += take
                self._body_left = left - take
                if not self._body_left:
                    self._finish_data_frame(events)
                continue
            if end - pos < HEADER_SIZE:
                self._partial_header = bytes(data[pos:])
                return
            self._handle_header(data, pos, now, events)
            pos += HEADER_SIZE

    def _handle_header(self, data: bytes | memoryview, pos: int, now: float, events: list[YamuxEvent]) -> None:
        frame_type, flags, stream_id, length = decode_header(data, pos)
        if frame_type == TYPE_DATA or frame_type == TYPE_WINDOW_UPDATE:
            if stream_id == 0:
                raise YamuxProtocolError("stream frame on stream id 0")
            stream = self._streams.get(stream_id)
            if flags & FLAG_SYN:
                stream = self._accept_stream(stream_id, events)
            if frame_type == TYPE_WINDOW_UPDATE:
                if stream is not None:
                    if length:
                        window = stream.send_window + length
                        if window > MAX_UINT32:
                            raise YamuxProtocolError(f"stream {stream_id}: send window overflows 32 bits")
                        stream.send_window = window
                        events.append(SendWindowOpened(stream_id))
                    self._apply_close_flags(stream_id, stream, flags, events)
                return
            if stream is None:
                # A stream we reset, refused or never knew: skip the body, within sane bounds.
                if length > self.max_window:
                    raise YamuxProtocolError(f"{length}-byte data frame exceeds the maximum window")
            elif length:
                if stream.remote_fin:
                    raise YamuxProtocolError(f"stream {stream_id}: data after FIN")
                if length > stream.recv_credit:
                    raise YamuxProtocolError(
                        f"stream {stream_id}: {length}-byte data frame exceeds the receive window "
                        f"({stream.recv_credit} bytes)")
                stream.recv_credit -= length
                if stream.epoch_start is None:
                    stream.epoch_start = now
            if length:
                self._body_left = length
                self._body_stream_id = stream_id
                self._body_stream = stream
                self._body_flags = flags
            elif stream is not None:
                self._apply_close_flags(stream_id, stream, flags, events)
        elif frame_type == TYPE_PING:
            if flags & FLAG_SYN:
                self._queue(TYPE_PING, FLAG_ACK, 0, length)
            elif flags & FLAG_ACK:
                sent_at = self._pings.pop(length, None)
                if sent_at is not None:
                    self.rtt = max(now - sent_at, 0.0)
                    events.append(PongReceived(length, self.rtt))
        else:  # TYPE_GO_AWAY (decode_header rejected unknown types)
            self.remote_go_away = length
            events.append(GoAwayReceived(length))

    def _finish_data_frame(self, events: list[YamuxEvent]) -> None:
        stream = self._body_stream
        self._body_stream = None
        if stream is not None:
            self._apply_close_flags(self._body_stream_id, stream, self._body_flags, events)

    def _accept_stream(self, stream_id: int, events: list[YamuxEvent]) -> _Stream | None:
        if stream_id in self._streams:
            raise YamuxProtocolError(f"SYN for stream {stream_id}, which is already open")
        if (stream_id & 1 == 1) == self.is_initiator:
            raise YamuxProtocolError(f"peer opened stream {stream_id}, an id of our parity")
        if self.local_go_away or self._inbound >= self.max_streams:
            self._queue(TYPE_WINDOW_UPDATE, FLAG_RST, stream_id, 0)
            return None
        stream = _Stream(inbound=True)
        self._streams[stream_id] = stream
        self._inbound += 1
        self._queue(TYPE_WINDOW_UPDATE, FLAG_ACK, stream_id, 0)
        events.append(StreamOpened(stream_id))
        return stream

    def _apply_close_flags(self, stream_id: int, stream: _Stream, flags: int, events: list[YamuxEvent]) -> None:
        if flags & FLAG_RST:
            self._remove(stream_id)
            events.append(StreamReset(stream_id))
        elif flags & FLAG_FIN and not stream.remote_fin:
            stream.remote_fin = True
            events.append(StreamEnded(stream_id))
            if stream.local_fin:
                self._remove(stream_id)

    # ---------------------------------------------------------------- internals

    def _writable_stream(self, stream_id: int) -> _Stream:
        if self.terminated:
            raise YamuxSessionClosed("yamux session is closed")
        stream = self._streams.get(stream_id)
        if stream is None:
            raise YamuxStreamError(f"stream {stream_id} is closed or reset")
        if stream.local_fin:
            raise YamuxStreamError(f"stream {stream_id} is closed for writing")
        return stream

    def _queue(self, frame_type: int, flags: int, stream_id: int, length: int) -> None:
        self._out.append(HEADER.pack(VERSION, frame_type, flags, stream_id, length))
        self._out_size += HEADER_SIZE

    def _remove(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        if stream.inbound:
            self._inbound -= 1
        else:
            self._outbound -= 1
        self._release_window(stream)
        if self._body_stream is stream:
            self._body_stream = None

    def _release_window(self, stream: _Stream) -> None:
        """Give a departing stream's window growth and budget share back to the tuner."""
        tuner = self.window_tuner
        tuner.growth -= stream.recv_window - INITIAL_WINDOW
        tuner.sharing -= stream.sharing
        stream.recv_window = INITIAL_WINDOW
        stream.sharing = False

    def close(self) -> None:
        """The connection is gone: forget every stream (their windows go back to the tuner).

        Frames already queued stay available to ``data_to_send``; later commands raise
        YamuxSessionClosed.
        """
        self.terminated = True
        for stream in self._streams.values():
            self._release_window(stream)
        self._streams.clear()
        self._body_stream = None
        self._pings.clear()

    def _terminate(self, code: int) -> None:
        if not self.local_go_away:
            self.local_go_away = True
            self._queue(TYPE_GO_AWAY, 0, 0, code)
        self.close()
