"""The JSON-line command loop the netlab agents run: each stdin line ``{"id", "op", ...}`` calls the
agent's ``op_<op>(...)`` concurrently and is answered ``{"id", "ok", "result" | "error"}`` on stdout;
``run_node_agent`` runs an agent that embeds a whole Node around that loop; ``agent_parser`` and
``run_agent`` are every agent's command line and entry point."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


async def answer(agent, line: str) -> None:
    cmd_id = None
    try:
        cmd = json.loads(line)
        cmd_id = cmd.pop("id", None)
        op = getattr(agent, f"op_{cmd.pop('op')}")
        reply = {"id": cmd_id, "ok": True, "result": await op(**cmd)}
    except Exception as exc:  # every failure is reported to the orchestrator, never fatal
        reply = {"id": cmd_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(reply), flush=True)


async def serve_commands(agent) -> None:
    """Answer commands until stdin closes; then cancel the ones still running."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while line := await reader.readline():
        task = asyncio.ensure_future(answer(agent, line.decode()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()


async def run_node_agent(agent, reserve_timeout: float) -> None:
    """Run ``agent.node``, wait for its relay reservations (if ``agent.relays``), print the READY line
    the orchestrator waits for, serve commands until stdin closes, then stop the node."""
    node = agent.node
    node_task = asyncio.ensure_future(node.run())
    try:
        await asyncio.wait_for(node.ready.wait(), reserve_timeout)
        client = node.relay_client.client
        deadline = time.monotonic() + reserve_timeout
        while agent.relays and not client.relayed_addrs:
            if node_task.done():
                node_task.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no reservation within {reserve_timeout} s")
            await asyncio.sleep(0.05)
        print("READY " + json.dumps({"peer_id": node.peer_id, "addrs": node.host.listen_addrs,
                                     "punch_port": None, "relayed_addrs": client.relayed_addrs}), flush=True)
        await serve_commands(agent)
    finally:
        node.request_stop()
        await asyncio.wait_for(node_task, 10)


def agent_parser() -> argparse.ArgumentParser:
    """The arguments every agent takes (``--seed HEX``, ``--listen MULTIADDR``); agents add theirs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", required=True)
    parser.add_argument("--listen", required=True)
    return parser


def run_agent(agent) -> None:
    """Run ``agent.run()`` (its command loop, until stdin closes) on uvloop."""
    import uvloop
    uvloop.run(agent.run())
