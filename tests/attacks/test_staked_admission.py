"""A flood of unknown identities cannot keep a staked peer out (issue 22 leftovers, ADR 0197).

The holder learns who is staked from its ledger (``dkb_listStakes`` answered by the real RPC method
over a ledger state, read through the node's ledger gateway as a validator node reads its own chain)
and tags them (node/staked.py). Before ADR 0197 no node tagged anyone ``STAKED``: a staked downloader
competed with the flood as an unknown and got BUSY for as long as the flood stayed."""
import asyncio
from types import SimpleNamespace

from attack_kit import run
from test_admission_attacks import STALE_NEVER, idle_artifact_streams, manifest_wait

from consensus.genesis import Params
from consensus.state.store import LedgerState
from consensus.validator.rpc_methods import LedgerMethods
from node.admission import PeerClass
from node.identity import Identity
from node.ledger import LedgerGateway
from node.p2p.host import Host
from node.p2p.resources import pick_victim


class InProcessLedger:
    """A validator's state behind the real ``dkb_*`` methods, attached to a gateway like the validator role."""

    def __init__(self, params: Params) -> None:
        self.state = LedgerState()
        self.ready = asyncio.Event()
        self.ready.set()
        chain = SimpleNamespace(ledger=SimpleNamespace(params=params, state=self.state, height=1))
        role = SimpleNamespace(require_ready=lambda: chain, read_state=self._read_state)
        self.methods = LedgerMethods(role).register(SimpleNamespace(register=lambda name, fn: None))

    async def _read_state(self, fn, *args):
        return fn(*args)

    async def call(self, method, *params):
        return await self.methods[method](*params)


async def busy_for(client, holder, ident, seconds=0.6):
    """True if ``client`` still gets BUSY after ``seconds`` of retrying."""
    try:
        await manifest_wait(client, holder, ident, limit=seconds)
        return False
    except AssertionError:
        return True


def test_unknown_identities_cannot_keep_a_staked_downloader_out(tmp_path):
    from node.artifacts.service import ArtifactLimits, ArtifactService
    from node.staked import refresh

    async def main():
        params = Params()
        holder, staked, stranger = (Host(Identity.generate()) for _ in range(3))
        for host in (holder, staked, stranger):
            await host.start()
            host.peerbook.add_addrs(holder.peer_id, holder.listen_addrs)
        ledger = InProcessLedger(params)
        ledger.state.stake(staked.peer_id).bonded = params.min_worker_stake
        ledger.state.stake(stranger.peer_id).bonded = params.min_worker_stake - 1   # below every minimum
        gateway = LedgerGateway(holder.identity, [])
        gateway.attach_local(ledger)
        service = ArtifactService(holder, tmp_path, ArtifactLimits(upload_grace=STALE_NEVER))
        hosts = []
        try:
            assert await refresh(holder.classes, gateway, holder.peer_id) == 1
            assert holder.peer_class(staked.peer_id) == PeerClass.STAKED
            assert holder.peer_class(stranger.peer_id) == PeerClass.UNKNOWN
            ident = await service.add_bytes(b"weights" * 1000)
            # 24 throwaway identities, one idle stream each: the 16 unknown slots are full, no one over-represented
            hosts, held = await idle_artifact_streams(holder, ident, identities=24, streams=1)
            assert await busy_for(stranger, holder, ident)         # the flood does keep unknowns out
            waited = await manifest_wait(staked, holder, ident, limit=2.0)
            print(f"\nfigure: upload slots, 24 unknown identities: a staked downloader served after {waited:.2f} s")
            assert waited < 0.5
            # it unbonds below the minimum: the next refresh drops the tag, it is an unknown again
            ledger.state.stake(staked.peer_id).bonded = 0
            await refresh(holder.classes, gateway, holder.peer_id)
            assert holder.peer_class(staked.peer_id) == PeerClass.UNKNOWN
            assert await busy_for(staked, holder, ident)
            # a jailed validator with a big bond is not staked either
            ledger.state.stake(staked.peer_id).bonded = 10**6
            ledger.state.stake(staked.peer_id).jailed_until = 99
            await refresh(holder.classes, gateway, holder.peer_id)
            assert holder.peer_class(staked.peer_id) == PeerClass.UNKNOWN
        finally:
            for h in (staked, stranger, *hosts, holder):
                await h.stop()
            service.close()
    run(main(), 60)


def test_a_staked_peers_handshake_socket_uses_the_reserve_and_its_connection_outlives_unknowns():
    """At the p2p host: a socket from a staked peer's known address is STAKED before the handshake
    (reserved pending capacity), and at the inbound connection cap unknown connections go first."""
    from node.p2p.multiaddr import Multiaddr

    host = Host(Identity.generate())
    staked = Identity.generate().peer_id
    host.peerbook.add_addrs(staked, [Multiaddr.parse("/ip4/198.51.100.7/tcp/4001")])
    assert host._ip_class("198.51.100.7") == PeerClass.UNKNOWN
    host.classes.set_tag("staked", PeerClass.STAKED, [staked])
    assert host._ip_class("198.51.100.7") == PeerClass.STAKED
    assert host._ip_class("198.51.100.8") == PeerClass.UNKNOWN
    conns = [SimpleNamespace(remote_peer=staked, num_streams=0, last_active=0.0),     # idlest of all
             SimpleNamespace(remote_peer="unknown", num_streams=1, last_active=5.0)]
    assert pick_victim(conns, lambda _p: False, host.classes.class_of).remote_peer == "unknown"
