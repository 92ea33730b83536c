"""Test helper: a Node on 127.0.0.1 with an ephemeral HTTP port, and an aiohttp session for it."""
import asyncio
import contextlib

import aiohttp

from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node


def local_config(overrides=None):
    """Config for tests: HTTP and p2p on 127.0.0.1 with ephemeral ports, plus ``overrides``."""
    base = {("rpc", "port"): "0", ("p2p", "listen"): "/ip4/127.0.0.1/tcp/0"}
    return load_config(None, overrides={**base, **(overrides or {})})


@contextlib.asynccontextmanager
async def running_node(roles=None, **rpc_overrides):
    """A Node (an idle relay role, or ``roles``: names or factories) with HTTP on an ephemeral 127.0.0.1
    port and [rpc] overrides applied, and an aiohttp session on its HTTP server."""
    node = Node(local_config({("rpc", k): str(v) for k, v in rpc_overrides.items()}), Identity.generate(),
                list(roles) if roles is not None else [basic_role("relay")])
    task = asyncio.create_task(node.run())
    await asyncio.wait_for(node.ready.wait(), 10)
    try:
        async with aiohttp.ClientSession(base_url=node.http.url) as session:
            yield node, session
    finally:
        node.request_stop()
        await asyncio.wait_for(task, 10)
