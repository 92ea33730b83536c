"""Socket and identify helpers shared by the hole-punch strategies (holepunch, port prediction,
birthday probing): a reusable bound TCP socket, a connect retried until a deadline, waiting for a
connected socket to be readable and telling its first bytes from its end, the observed address
a peer's identify names, and one line for the failures of many tries (`no_path`)."""
from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection
from node.p2p.identify import MAX_IDENTIFY_BYTES, decode_identify
from node.p2p.identify import PROTOCOL_ID as IDENTIFY_PROTOCOL
from node.p2p.multiaddr import Multiaddr


def bound_socket(family: int, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to ``port`` on every address, shareable with other sockets on
    that port (SO_REUSEADDR and SO_REUSEPORT), as simultaneous open needs."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:   # IPv6 only: the IPv4 socket on the same port keeps IPv4
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setblocking(False)
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def connect_until(ip: str, port: int, local_port: int, deadline: float, retry_s: float) -> socket.socket:
    """Connect from ``local_port`` (0: one ephemeral port, kept across redials so the NAT's mapping
    stays the same flow) to ``ip:port``, redialling a refused connect after ``retry_s``, until the
    monotonic ``deadline`` (TimeoutError after it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    loop = asyncio.get_running_loop()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer from {ip}:{port} in the punch window")
        sock = bound_socket(family, local_port)
        local_port = sock.getsockname()[1]
        try:
            async with asyncio.timeout(left):
                await loop.sock_connect(sock, (ip, port))
            return sock
        except ConnectionRefusedError:
            sock.close()
            await asyncio.sleep(retry_s)
        except BaseException:
            sock.close()
            raise


def readable(sock: socket.socket) -> asyncio.Future[None]:
    """A future done once ``sock`` is readable (data, end of stream or an error); to stop waiting
    before then, ``loop.remove_reader(sock.fileno())`` before closing the socket."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def ready() -> None:
        loop.remove_reader(fd)
        if not done.done():
            done.set_result(None)
    loop.add_reader(fd, ready)
    return done


def speaks(sock: socket.socket) -> bool | None:
    """Whether the readable ``sock`` holds data (left unread): True; False if it ended or failed;
    None if nothing is there after all."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return False


async def observed_addr(conn: Connection) -> Multiaddr | None:
    """The address ``conn``'s peer says it sees us at (identify), read with a size bound."""
    stream = await conn.open_stream(IDENTIFY_PROTOCOL)
    data = b""
    while chunk := await stream.read():
        data += chunk
        if len(data) > MAX_IDENTIFY_BYTES:
            stream.reset()
            raise ProtocolError("identify response too large")
    await stream.close()
    return decode_identify(data).observed_addr


def no_path(what: str, errors: list[str], nothing: str) -> ConnectionError:
    """The error of a punch none of whose tries reached the peer: each distinct failure once, with how
    many tries ended so (a birthday punch makes hundreds of dials, most of them timing out)."""
    counts = Counter(errors)
    described = "; ".join(error if n == 1 else f"{error} x{n}" for error, n in counts.items())
    return ConnectionError(f"{what} found no path: " + (described or nothing))
