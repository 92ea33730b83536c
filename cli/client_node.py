"""A short-lived Node for CLI commands that need the p2p network (artifact get, task submit/fetch).

``async with client_node(identity, bootstrap=..., relays=..., data_dir=None) as node:`` runs a Node
with no roles of its own (an idle ``client`` role), no HTTP server and a p2p listener on an
ephemeral port of every interface, with its relay client (so relayed ``/p2p-circuit`` addresses
can be dialed, and with ``relays`` it reserves on them to be reachable itself); its artifact store
is ``data_dir/artifacts`` or a temporary directory. The node stops when the block exits.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def client_node(identity: Identity, *, bootstrap: Sequence[str] = (), relays: Sequence[str] = (),
                      data_dir: Path | None = None, listen: str = "/ip4/0.0.0.0/tcp/0") -> AsyncIterator[Node]:
    overrides = {("p2p", "listen"): listen, ("rpc", "enabled"): "false",
                 ("p2p", "bootstrap"): ",".join(bootstrap), ("relay", "relays"): ",".join(relays)}
    config = load_config(None, env={}, overrides=overrides)
    node = Node(config, identity, [basic_role("client")], data_dir=data_dir)
    task = asyncio.ensure_future(node.run())
    ready = asyncio.ensure_future(node.ready.wait())
    try:
        await asyncio.wait([task, ready], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the node failed to start: raise its error
            raise RuntimeError("the client node stopped while starting")
        if not ready.done():
            raise TimeoutError(f"the client node did not start within {START_TIMEOUT_S} s")
        for _ in range(3):   # let the node's services take their first step (the relay client's circuit dialer)
            await asyncio.sleep(0)
        yield node
    finally:
        ready.cancel()
        node.request_stop()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
