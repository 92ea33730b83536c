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
