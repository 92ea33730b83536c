"""Serving inside the node (ADR 0177): the [serve] section's service fills the gap in the ledger's
coverage, serves on the node's Host, adds hardware.serving to the compute role's record without
replacing it, and refreshes the announcement's height."""
import asyncio
from types import SimpleNamespace

from consensus.state.serve_disputes import list_open_disputes
from consensus.state.serving import list_nodes
from devtools.ledger_chain import Chain, ident
from ml.serve import protocol
from ml.serve.announce import REFRESH_BLOCKS
from ml.serve.catalog import parse_model
from ml.serve.service import ServingService
from node.config import defaults
from node.ledger.record import RecordPublisher
from node.p2p.host import Host
from node.rpc.status import StatusBoard

MODEL = "random:4x32@7"
MACHINE = {"cpu_cores": 8, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50,
           "profiles": ["cpu-x86-64-avx2/torch-2.13.0"]}


class ChainGateway:
    """The node.ledger calls the service makes, against an in-process chain."""

    def __init__(self, chain: Chain, identity):
        self.chain, self.identity = chain, identity
        self.record = RecordPublisher(identity.peer_id, self._node, self.send)

    async def _node(self, peer_id):
        return self.chain.ledger.node_info(peer_id)

    async def chain_id(self):
        return self.chain.chain_id

    async def call(self, method, *params):
        state = self.chain.ledger.state
        if method == "dkb_blockNumber":
            return self.chain.ledger.height
        if method == "dkb_listNodes":
            return list_nodes(state, *params, ttl=self.chain.ledger.params.serve_announce_ttl)
        if method == "dkb_listServeDisputes":
            return list_open_disputes(state, *params)
        raise AssertionError(method)

    async def send(self, tx_type, payload):
        return self.chain.ok(self.identity, tx_type, payload).to_json()


def node_with_serving(chain: Chain, host: Host, **serve) -> SimpleNamespace:
    config = defaults()
    config._values["serve"].update({"model": MODEL, "claim_every": 0.05, **serve})
    ready = asyncio.Event()
    ready.set()
    return SimpleNamespace(config=config, identity=ident(1), peer_id=host.peer_id, host=host, ready=ready,
                           roles=[SimpleNamespace(name="compute")], status=StatusBoard(dict),
                           ledger=ChainGateway(chain, ident(1)))


def test_the_serve_section_serves_the_gap_beside_the_compute_record_and_refreshes_it():
    spec = parse_model(MODEL)
    chain = Chain()
    other = {**MACHINE, "serving": [{"model": spec.model_id, "start": 0, "end": 2, "tokens_per_s": 100,
                                     "profile": MACHINE["profiles"][0], "price": 0, "height": 1}]}
    chain.block([chain.tx(ident(2), "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                                      "hardware": other})])

    async def scenario():
        host, client = Host(ident(1)), Host(ident(9))
        await host.start()
        await client.start()
        try:
            node = node_with_serving(chain, host, blocks="auto:2")
            node.ledger.record.contribute("compute", roles=["compute"], hardware=MACHINE)   # the compute role's
            service = ServingService(node)
            task = asyncio.create_task(service.run())
            for _ in range(400):
                if service.announced is not None:
                    break
                await asyncio.sleep(0.05)
            assert service.blocks == (2, 4)                               # the gap the ledger showed
            record = chain.ledger.node_info(host.peer_id)
            assert record["roles"] == ["compute"]
            assert {k: record["hardware"][k] for k in MACHINE} == MACHINE   # the compute role's hardware kept
            (entry,) = record["hardware"]["serving"]
            assert (entry["model"], entry["start"], entry["end"], entry["height"]) == (spec.model_id, 2, 4,
                                                                                       service.announced)
            client.peerbook.add_addrs(host.peer_id, host.listen_addrs)
            span = protocol.SpanClient(client, host.peer_id, 2, 4)
            info = await span.info()
            await span.close()
            assert (info["model"], info["start"], info["end"]) == (spec.model_id, 2, 4)
            first = service.announced
            chain.empty_blocks(REFRESH_BLOCKS)
            for _ in range(200):
                if service.announced != first:
                    break
                await asyncio.sleep(0.05)
            assert service.announced >= first + REFRESH_BLOCKS
            assert chain.ledger.node_info(host.peer_id)["hardware"]["serving"][0]["height"] == service.announced
            assert service.status()["blocks"] == [2, 4] and service.status()["model"] == MODEL
            task.cancel()
        finally:
            await client.stop()
            await host.stop()

    asyncio.run(scenario())


def test_an_empty_serve_section_is_idle_and_serving_needs_the_compute_role():
    chain = Chain()

    async def scenario():
        host = Host(ident(1))
        node = node_with_serving(chain, host, model="")
        idle = ServingService(node)
        assert not idle.enabled
        node = node_with_serving(chain, host)
        node.roles = [SimpleNamespace(name="relay")]
        lonely = ServingService(node)
        task = asyncio.create_task(lonely.run())
        await asyncio.sleep(0.05)
        assert lonely.last_error == "[serve] model needs the compute role" and lonely.server is None
        task.cancel()
        broken = ServingService(node_with_serving(chain, host, model="random:nonsense"))
        task = asyncio.create_task(broken.run())
        for _ in range(100):
            if broken.last_error:
                break
            await asyncio.sleep(0.02)
        assert broken.last_error.startswith("cannot serve") and not task.done()   # the node keeps running
        task.cancel()

    asyncio.run(scenario())
