"""A block server that listens nowhere (as behind a NAT) serves through a circuit relay: the client
reaches it over `/p2p-circuit` and the generated tokens still equal local inference, bit for bit."""
import asyncio

from ml.serve import protocol
from ml.serve.client import RemoteGenerator, ServerInfo, local_generate
from ml.serve.handler import ServeHandler
from ml.serve.model import DecoderConfig, random_decoder
from ml.serve.server import BlockServer
from node.identity import Identity
from node.p2p.host import Host
from relay.client import RelayClient
from relay.service import Admission, RelayService

CONFIG = DecoderConfig(vocab_size=40, context=64, width=32, layers=4, heads=4)
PROMPT = [1, 5, 9, 2, 7]


def test_generation_through_a_relayed_server_equals_local():
    expected = local_generate(random_decoder(CONFIG, 3), PROMPT, 16)

    async def main():
        relay_host = Host(Identity.generate())
        await relay_host.start()
        direct = Host(Identity.generate())
        direct.set_handler(protocol.PROTOCOL, ServeHandler(
            BlockServer(random_decoder(CONFIG, 3, (0, 2), ends=False)), "m"))
        await direct.start()
        clients = []
        for listen in (["/ip4/127.0.0.1/tcp/0"], []):   # the client, and a server that listens nowhere
            host = Host(Identity.generate(), listen)
            await host.start()
            client = RelayClient(host)
            client.start()
            clients.append(client)
        user, hidden = clients
        hidden.host.set_handler(protocol.PROTOCOL, ServeHandler(
            BlockServer(random_decoder(CONFIG, 3, (2, 4), ends=False)), "m"))
        service = RelayService(relay_host, Admission({user.host.peer_id, hidden.host.peer_id}))
        service.start()
        try:
            await hidden.reserve(relay_host.listen_addrs[0])
            user.host.register_circuit_dialer(lambda maddr, bulk: user.dial([str(maddr)], bulk=bulk))
            user.host.peerbook.add_addrs(direct.peer_id, direct.listen_addrs)
            await user.host.connect(hidden.relayed_addrs[0])
            servers = [ServerInfo(direct.peer_id, 0, 2), ServerInfo(hidden.host.peer_id, 2, 4)]
            generator = RemoteGenerator(user.host, random_decoder(CONFIG, 3, (0, 0)), servers)
            tokens = await generator.generate(PROMPT, 16)
            relayed = [user.pipe_for(c) is not None for c in user.host.connections(hidden.host.peer_id)]
            return tokens, relayed
        finally:
            await service.stop()
            for host in (user.host, hidden.host, direct, relay_host):
                await host.stop()

    tokens, relayed = asyncio.run(asyncio.wait_for(main(), 60))
    assert tokens == expected and relayed and all(relayed)
