"""Orchestrator side of the netlab: start agents (``agent.py``) inside namespaces and call them.

``Node.start(lab_ns, seed, listen, ...)`` launches one agent module (``agent.py``, or
``node_agent.py`` for a real dekube Node) from the repository root with ``ip netns exec`` and waits
for its READY line; ``node.call(op, **args)`` sends one JSON command and returns the result
(raising ``AgentError`` with the agent's message on failure); ``node.call_async`` returns a
Future, so an orchestrator can kill a relay while a transfer runs. A reader thread per agent routes
replies by id. ``kill()`` is SIGKILL (a crashed relay); ``stop()`` closes stdin and waits; both
are bounded. ``agents_in(lab)`` holds a built lab and a list for the agents started in it; on exit
it stops them all and tears the lab down.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from node.identity import Identity

from .lab import Lab

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT = "devtools.netlab.agent"             # agents run as modules from the repository root
NODE_AGENT = "devtools.netlab.node_agent"   # a real Node with the same command loop
READY_TIMEOUT = 60.0


class AgentError(RuntimeError):
    """An agent answered a command with an error."""


def seed_of(name: str) -> str:
    return name.encode().ljust(32, b"\0")[:32].hex()


def peer_id_of(name: str) -> str:
    return Identity.from_seed(bytes.fromhex(seed_of(name))).peer_id


class Node:
    def __init__(self, name: str, ns: str, proc: subprocess.Popen, info: dict) -> None:
        self.name = name
        self.ns = ns
        self.proc = proc
        self.peer_id: str = info["peer_id"]
        self.addrs: list[str] = info["addrs"]
        self.punch_port: int | None = info["punch_port"]
        self.info = info
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_replies, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, name: str, ns: str, listen: str, *extra: str, agent: str = AGENT) -> Node:
        """Start the module ``agent`` (``AGENT``, or ``NODE_AGENT`` for a real Node) as ``name``."""
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", agent, "--seed", seed_of(name), "--listen", listen,
               *extra]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                cwd=REPO_ROOT)
        ready: concurrent.futures.Future[dict] = concurrent.futures.Future()

        def wait_ready():
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("READY "):
                    ready.set_result(json.loads(line[6:]))
                    return
            ready.set_exception(AgentError(f"agent {name} exited before READY (rc={proc.poll()})"))

        threading.Thread(target=wait_ready, daemon=True).start()
        try:
            info = ready.result(READY_TIMEOUT)
        except BaseException:
            proc.kill()
            proc.wait(5)
            raise
        return cls(name, ns, proc, info)

    @property
    def addr(self) -> str:
        return self.addrs[0]

    def _read_replies(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                future = self._pending.pop(reply.get("id"), None)
            if future is None:
                continue
            if reply["ok"]:
                future.set_result(reply["result"])
            else:
                future.set_exception(AgentError(f"{self.name}: {reply['error']}"))
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(AgentError(f"agent {self.name} exited"))

    def call_async(self, op: str, **args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        cmd_id = next(self._ids)
        with self._lock:
            self._pending[cmd_id] = future
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"id": cmd_id, "op": op, **args}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            with self._lock:
                self._pending.pop(cmd_id, None)
            future.set_exception(AgentError(f"agent {self.name} is gone: {exc}"))
        return future

    def call(self, op: str, timeout: float = 60.0, **args):
        return self.call_async(op, **args).result(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def agents_in(lab: Lab) -> Iterator[tuple[Lab, list[Node]]]:
    """``(lab, agents)``: append every agent started in ``lab``; all stop, and the lab goes, on exit."""
    agents: list[Node] = []
    try:
        yield lab, agents
    finally:
        for agent in agents:
            agent.stop()
        lab.teardown()
