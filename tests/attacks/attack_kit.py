"""Shared helpers for the attack tests: an in-process node on 127.0.0.1 and server-side socket counts."""
import asyncio
import contextlib

import aiohttp

from tests.node.node_harness import running_node  # noqa: F401  (the attack tests' node)


def run(coro, timeout: float = 60.0):
    """Run one test coroutine with a hard bound on its duration."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def established_server_sockets(port: int) -> int:
    """TCP connections in ESTABLISHED state whose local port is ``port`` (the server's side only)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


async def rpc_call(session: aiohttp.ClientSession, method: str, *params, headers=None):
    """POST one JSON-RPC request; (HTTP status, decoded body)."""
    async with session.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)},
                            headers=headers) as r:
        return r.status, await r.json(content_type=None)


class SocketFlood:
    """Idle TCP sockets to ``port`` from the loopback addresses ``sources`` (``per_source`` each),
    never sending a byte; one closed by the server is reopened at once, as a persistent attacker does."""

    def __init__(self, port: int, sources, per_source: int):
        self.port, self.sources, self.per_source = port, list(sources), per_source
        self.opened = 0
        self._task: asyncio.Task | None = None

    async def _hold(self, source: str) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self.opened += 1
            try:
                await reader.read()                 # returns when the server closes it
            except OSError:
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.01)               # and reconnects

    async def __aenter__(self):
        holders = [self._hold(src) for src in self.sources for _ in range(self.per_source)]
        self._task = asyncio.ensure_future(asyncio.gather(*holders))
        while self.opened < len(holders):
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc):
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
