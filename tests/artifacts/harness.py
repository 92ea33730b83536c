"""Test helpers: Hosts on 127.0.0.1 each with an ArtifactService, wired into each other's peer book."""
import contextlib

from node.artifacts import ArtifactLimits, ArtifactService
from node.identity import Identity
from node.p2p.host import Host


@contextlib.asynccontextmanager
async def artifact_peers(tmp_path, count, **limits):
    """``count`` started (host, service) pairs; every host knows every other's address."""
    peers = []
    try:
        for n in range(count):
            host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
            await host.start()
            peers.append((host, ArtifactService(host, tmp_path / f"peer{n}", ArtifactLimits(**limits))))
        for host, _ in peers:
            for other, _ in peers:
                if other is not host:
                    host.peerbook.add_addrs(other.peer_id, other.listen_addrs)
        yield peers
    finally:
        for host, _ in peers:
            await host.stop()


def know(host, other_host):
    host.peerbook.add_addrs(other_host.peer_id, other_host.listen_addrs)
