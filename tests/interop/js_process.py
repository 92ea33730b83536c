"""The js-libp2p peer (js/peer.mjs, versions pinned in js/package.json) as a subprocess for the
interop tests: whether it can run here, start it, read its event lines, send it commands, kill it."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

JS_DIR = Path(__file__).with_name("js")
PEER_SCRIPT = JS_DIR / "peer.mjs"


def missing() -> str | None:
    """Why the js peer cannot run here (None when it can)."""
    if shutil.which("node") is None:
        return "node is not installed (the js-libp2p interop tests need Node.js >= 20)"
    if not (JS_DIR / "node_modules" / "libp2p" / "package.json").exists():
        return "js-libp2p is not installed: run `npm ci --prefix tests/interop/js`"
    return None


def js_version(package: str = "libp2p") -> str:
    return json.loads((JS_DIR / "node_modules" / package / "package.json").read_text())["version"]


class JsPeer:
    """One js peer: ``lines`` keeps every line it printed, ``expect`` waits for one by prefix."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.peer_id = ""
        self.addr = ""

    @classmethod
    async def start(cls, mode: str, listen_ip: str, *args: str, port: int = 0) -> JsPeer:
        """``port``: listen there and announce ``listen_ip:port`` (0: any port, not announced)."""
        env = {**os.environ, "JS_PEER_PORT": str(port)}
        proc = await asyncio.create_subprocess_exec(
            "node", "--import", "./node20.mjs", PEER_SCRIPT.name, mode, listen_ip, *args, cwd=JS_DIR,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        peer = cls(proc)
        [addr] = await peer.expect("ADDR ")
        peer.peer_id = addr.rsplit("/p2p/", 1)[1]
        peer.addr = addr
        return peer

    async def expect(self, prefix: str, timeout: float = 30, *, where=lambda fields: True) -> list[str]:
        """The fields of the next line (seen before or printed within ``timeout``) that starts with
        ``prefix`` and satisfies ``where``."""
        for line in self.lines:
            if line.startswith(prefix) and where(line[len(prefix):].split(" ", 3)):
                self.lines.remove(line)
                return line[len(prefix):].split(" ", 3)
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise AssertionError(f"the js peer exited before printing {prefix!r}: {self.lines}")
                line = raw.decode().rstrip("\n")
                fields = line[len(prefix):].split(" ", 3)
                if line.startswith(prefix) and where(fields):
                    return fields
                self.lines.append(line)

    async def command(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
