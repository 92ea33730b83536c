"""The JSON-line command loop both netlab agents run: each stdin line ``{"id", "op", ...}`` calls the
agent's ``op_<op>(...)`` concurrently and is answered ``{"id", "ok", "result" | "error"}`` on stdout."""
from __future__ import annotations

import asyncio
import json
import sys


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
