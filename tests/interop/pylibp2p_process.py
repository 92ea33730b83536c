"""The py-libp2p peer (pylibp2p_peer.py) as a subprocess for the interop tests: start it, read the
address it listens on, kill it."""
import asyncio
import os
import subprocess
import sys
from pathlib import Path

PEER_SCRIPT = Path(__file__).with_name("pylibp2p_peer.py")


async def spawn(*args: str, transport: str | None = None) -> asyncio.subprocess.Process:
    """The peer script with ``args``; ``transport`` "quic" makes it speak /quic-v1 (TCP otherwise)."""
    env = {**os.environ, "PYLIBP2P_TRANSPORT": transport} if transport else None
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PEER_SCRIPT), *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)


async def read_addr(proc, within: bytes = b"") -> str:
    """The address the peer prints first (``ADDR <multiaddr>``), which must contain ``within``."""
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"ADDR ") and within in line, line
    return line.split()[1].decode()


async def stop(proc) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
