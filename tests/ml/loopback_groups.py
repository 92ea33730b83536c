"""All-reduce groups of TcpTransport peers on 127.0.0.1 in one process, shared by the ml tests."""
import asyncio

from ml.allreduce import AllReduceGroup, TcpTransport


def ids(n):
    return [f"peer{i}" for i in range(n)]


async def start_transports(names):
    """Started TcpTransports for `names`, every one knowing every address."""
    transports = [TcpTransport(name) for name in names]
    addresses = {t.my_id: await t.start() for t in transports}
    for t in transports:
        t.addresses.update(addresses)
    return transports


async def make_groups(n, names=None, **kwargs):
    """`n` started groups (peers `names`, default peer0..), every transport knowing every address;
    `kwargs` go to AllReduceGroup. Returns (groups, transports)."""
    names = names or ids(n)
    transports = await start_transports(names)
    groups = [AllReduceGroup(t, t.my_id, names, **kwargs) for t in transports]
    for g in groups:
        await g.start()
    return groups, transports


async def close_all(groups, transports):
    for g in groups:
        await g.close()
    for t in transports:
        await t.close()


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class LinkDropTransport:
    """Wraps a transport: while `cut` is set, every write on a stream it opened fails and resets the stream
    (a home link that drops for a moment); the streams opened after it is cleared work."""

    def __init__(self, inner):
        self.inner = inner
        self.cut = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def open_stream(self, peer, protocol):
        return _DroppingStream(await self.inner.open_stream(peer, protocol), self)


class _DroppingStream:
    def __init__(self, inner, owner):
        self._inner, self._owner = inner, owner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def write(self, data):
        if self._owner.cut:
            self._inner.reset()
            raise ConnectionResetError("the link dropped")
        await self._inner.write(data)
