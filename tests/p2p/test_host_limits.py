"""Inbound lockout (ADR 0145): per-IP pending cap, separate inbound/outbound budgets, eviction of
idle unprotected inbound connections. Loopback only; attacker sockets come from 127.0.0.2."""
import asyncio
import socket

import pytest

from node.identity import Identity
from node.p2p.host import Host
from node.p2p.limits import HostLimits
from node.p2p.resources import Protector, pending_pool, pick_victim
from tests.p2p.host_kit import until


def port_of(host):
    return int(host.listen_addrs[0].split("/")[4])


def peers(host):
    return {c.remote_peer for c in host.connections() if not c.closed}


async def stop_all(*hosts):
    for h in hosts:
        await h.stop()


def test_pending_pool_caps_per_ip_and_evicts_the_most_represented():
    pending = pending_pool(HostLimits(max_pending_inbound=3, max_pending_inbound_per_ip=2,
                                      max_pending_inbound_per_prefix=3, pending_inbound_reserved=0), lambda: 0.0)
    assert pending.admit("a1", "10.0.0.1", "10.0.0.1").admitted and pending.admit("a2", "10.0.0.1", "10.0.0.1").admitted
    assert not pending.admit("a3", "10.0.0.1", "10.0.0.1").admitted       # per IP
    assert pending.admit("b", "10.0.0.2", "10.0.0.2").evict == ()
    assert pending.admit("c", "10.1.0.1", "10.1.0.1").evict == ("a1",)     # the oldest of the crowded IP
    assert pending.release("a2") and not pending.release("zzz")
    assert len(pending) == 2


def test_protector_tags_and_victim_order():
    prot = Protector()
    prot.protect("p", "bootstrap")
    prot.set_tag("committee", ["p", "q"])
    prot.set_tag("committee", ["q"])
    assert prot.is_protected("p") and prot.tags("p") == {"bootstrap"}
    assert not prot.unprotect("p", "bootstrap") and not prot.is_protected("p")

    class C:
        def __init__(self, peer, streams, last):
            self.remote_peer, self.num_streams, self.last_active = peer, streams, last
    conns = [C("q", 0, 1.0), C("busy", 1, 0.5), C("idle", 0, 3.0), C("older", 0, 2.0)]
    assert pick_victim(conns, prot.is_protected).remote_peer == "older"
    assert pick_victim([conns[0]], prot.is_protected) is None
    assert pick_victim(conns[:2], prot.is_protected).remote_peer == "busy"


def test_idle_sockets_from_one_ip_do_not_lock_out_peers():
    async def main():
        server = Host(Identity.generate())  # default limits: 64 pending, 8 per IP
        client = Host(Identity.generate())
        await server.start()
        await client.start()
        socks = []
        try:
            loop = asyncio.get_running_loop()
            for _ in range(64):  # idle, never speak; all from 127.0.0.2
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.bind(("127.0.0.2", 0))
                await loop.sock_connect(sock, ("127.0.0.1", port_of(server)))
                socks.append(sock)
            await until(lambda: len(server._upgrading) >= 8)
            await asyncio.sleep(0.3)  # let every accept be decided
            await asyncio.wait_for(client.connect(server.listen_addrs[0]), 5)  # old code: refused
            assert 0 < await client.ping(server.peer_id)
            assert len(server._upgrading) <= server.limits.max_pending_inbound_per_ip
        finally:
            for sock in socks:
                sock.close()
            await stop_all(client, server)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_full_inbound_does_not_block_own_outbound_dial():
    async def main():
        server = Host(Identity.generate(), limits=HostLimits(max_inbound_connections=4, max_outbound_connections=4))
        server.protect("nobody", "test")
        sybils = [Host(Identity.generate()) for _ in range(4)]
        target = Host(Identity.generate())
        for h in (server, target, *sybils):
            await h.start()
        try:
            for sybil in sybils:  # fresh identities fill the inbound budget
                await sybil.connect(server.listen_addrs[0])
            await until(lambda: len(server.connections()) == 4)
            await asyncio.wait_for(server.connect(target.listen_addrs[0]), 5)
            assert 0 < await server.ping(target.peer_id)
            assert {c.direction for c in server.connections()} == {"inbound", "outbound"}
            assert len(server.connections()) == 5
        finally:
            await stop_all(server, target, *sybils)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_protected_peer_is_never_evicted_unprotected_idle_one_is():
    async def main():
        server = Host(Identity.generate(), limits=HostLimits(max_inbound_connections=2))
        protected, idle = Host(Identity.generate()), Host(Identity.generate())
        newcomers = [Host(Identity.generate()) for _ in range(3)]
        for h in (server, protected, idle, *newcomers):
            await h.start()
        server.protect(protected.peer_id, "committee")
        try:
            await protected.connect(server.listen_addrs[0])  # the longest idle of all
            await until(lambda: len(server.connections()) == 1)
            await asyncio.sleep(0.05)
            await idle.connect(server.listen_addrs[0])
            await until(lambda: len(server.connections()) == 2)
            for newcomer in newcomers:
                await asyncio.sleep(0.05)
                await newcomer.connect(server.listen_addrs[0])
                await until(lambda n=newcomer: n.peer_id in peers(server))
                assert protected.peer_id in peers(server)
                assert len(server.connections()) == 2
            assert idle.peer_id not in peers(server)
            assert peers(server) == {protected.peer_id, newcomers[-1].peer_id}
            assert 0 < await protected.ping(server.peer_id)
            await until(lambda: not idle.is_connected(server.peer_id))
        finally:
            await stop_all(server, protected, idle, *newcomers)
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("tag_twice", [False, True])
def test_unprotect_makes_peer_evictable(tag_twice):
    host = Host(Identity.generate())
    host.protect("p", "a")
    if tag_twice:
        host.protect("p", "b")
    assert host.unprotect("p", "a") is tag_twice
    assert host.is_protected("p") is tag_twice
