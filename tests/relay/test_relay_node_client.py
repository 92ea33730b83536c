"""The node's relay client service with allow-list relays and a stand-in ledger: reservations follow
reachability (``reserve = false``), the record follows the reservations when a relay dies, and the
pieces it is built from (admission lookup cache, record merging) behave."""
import asyncio

import pytest
from ledger_testnet import eventually, node_config
from relay_harness import start_relay, stop_all

from node.config import ConfigError, load_config
from node.identity import Identity
from node.ledger import LedgerUnavailable, RecordPublisher
from node.roles import basic_role
from node.runtime import Node
from relay.client import split_circuit_addr
from relay.ledger_access import StakeLookup
from relay.reachability import Reachability
from relay.role import RelayRole


class FakeLedger:
    """A stand-in for the node's ledger gateway: records register_node payloads; node_info answers
    the last one."""

    is_local = False
    available = True
    url = "fake://ledger"

    def __init__(self, stakes=None, fail=False, owner="12D3KooWfake", balances=None):
        self.record = RecordPublisher(owner, self.node_info, self.send)
        self.records: dict[str, dict] = {}
        self.stakes = stakes or {}
        self.balances = balances or {}
        self.sent: list[tuple[str, dict]] = []
        self.reads = 0
        self.fail = fail

    async def node_info(self, peer_id):
        self.reads += 1
        if self.fail:
            raise LedgerUnavailable("down")
        return self.records.get(peer_id)

    async def bonded(self, peer_id):
        return self.stakes.get(peer_id, 0)

    async def balance(self, peer_id):
        return self.balances.get(peer_id, 0)

    async def send(self, tx_type, payload):
        self.sent.append((tx_type, payload))
        return {"code": 0}


class OwnRecordLedger(FakeLedger):
    """A FakeLedger whose register_node transactions become ``owner``'s record."""

    def __init__(self, owner):
        super().__init__(owner=owner)
        self.owner = owner

    async def send(self, tx_type, payload):
        self.records[self.owner] = payload
        return await super().send(tx_type, payload)


async def start_home(identity, relays, reserve, ledger=None, assess=None):
    """A home Node (no ledger of its own unless ``ledger``) running the relay client service."""
    node = Node(node_config(relays=relays, reserve=reserve, rpc=False), identity, [basic_role("compute")])
    service = node.relay_client
    if assess is not None:
        service._assess = assess
    service.ledger = ledger
    task = asyncio.create_task(node.run())
    await asyncio.wait_for(node.ready.wait(), 10)
    return node, task


async def stop_home(node, task):
    node.request_stop()
    await asyncio.wait_for(task, 10)


def test_a_dead_relay_is_replaced_and_the_record_follows():
    home_id = Identity.generate()

    async def main():
        relays = [await start_relay({home_id.peer_id}) for _ in range(3)]
        ledger = OwnRecordLedger(home_id.peer_id)
        node, task = await start_home(home_id, [r.host.listen_addrs[0] for r in relays], True, ledger)
        dead = None
        try:
            service = node.relay_client
            await eventually(lambda: len(service.client.reservations) == 2 and
                             service.published == service.client.relayed_addrs, what="two relays published")
            first = set(service.client.reservations)
            assert {split_circuit_addr(a)[0].peer_id for a in ledger.records[node.peer_id]["relay_addrs"]} == first
            dead = next(r for r in relays if r.host.peer_id in first)
            await stop_all(dead)
            await eventually(lambda: dead.host.peer_id not in service.client.reservations
                             and len(service.client.reservations) == 2, what="replacement reservation")
            await eventually(lambda: service.published == service.client.relayed_addrs, what="record updated")
            published = {split_circuit_addr(a)[0].peer_id for a in ledger.records[node.peer_id]["relay_addrs"]}
            assert dead.host.peer_id not in published and len(published) == 2
            assert [t for t, _ in ledger.sent] == ["register_node"] * len(ledger.sent) and len(ledger.sent) >= 3
            status = (await node.status.snapshot())["relay_client"]
            assert status["reserving"] and status["published_relay_addrs"] == service.client.relayed_addrs
        finally:
            await stop_home(node, task)
            await stop_all(*[r for r in relays if r is not dead])

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("verdict, reserves", [(Reachability.PUBLIC, False), (Reachability.PRIVATE, True)])
def test_without_reserve_reachability_decides(verdict, reserves):
    async def main():
        home_id = Identity.generate()
        relay = await start_relay({home_id.peer_id})
        asked = []

        async def assess(host, servers):
            asked.append(servers)
            return verdict
        node, task = await start_home(home_id, [relay.host.listen_addrs[0]], False, assess=assess)
        try:
            await eventually(lambda: asked, what="reachability asked")
            assert asked[0] == [relay.host.listen_addrs[0]]
            if reserves:
                await eventually(lambda: node.relay_client.client.reservations, what="reservation")
            else:
                await asyncio.sleep(1.0)
                assert node.relay_client.client.reservations == {}
            status = (await node.status.snapshot())["relay_client"]
            assert status["reachability"] == verdict.value and status["reserving"] is reserves
        finally:
            await stop_home(node, task)
            await stop_all(relay)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_stake_lookup_caches_answers_not_failures():
    registered, unregistered = Identity.generate().peer_id, Identity.generate().peer_id
    ledger = FakeLedger(stakes={registered: 500})
    ledger.records[registered] = {"roles": ["compute"]}
    now = [0.0]
    lookup = StakeLookup(ledger, ttl=10, clock=lambda: now[0])

    async def main():
        assert await lookup(registered) == 500
        assert await lookup(unregistered) is None          # no record: not admitted by stake
        reads = ledger.reads
        ledger.stakes[registered] = 0
        assert await lookup(registered) == 500 and ledger.reads == reads  # cached
        now[0] = 11.0
        assert await lookup(registered) == 0                # expired: read again
        ledger.fail = True
        now[0] = 30.0
        with pytest.raises(LedgerUnavailable):
            await lookup(registered)
        ledger.fail = False
        assert await lookup(registered) == 0                # the failure was not cached

    asyncio.run(main())


def test_a_reachable_node_does_not_reserve_after_asking_a_relay_node():
    """Real AutoNAT: the relay role serves dial-backs; a home node on loopback is reachable."""
    async def main():
        home_id = Identity.generate()
        relay = Node(node_config(allow_list=[home_id.peer_id], rpc=False), Identity.generate(), [RelayRole])
        relay_task = asyncio.create_task(relay.run())
        await asyncio.wait_for(relay.ready.wait(), 10)
        node, task = await start_home(home_id, [relay.host.listen_addrs[0]], False)
        try:
            await eventually(lambda: node.relay_client.reachability is not None, what="reachability verdict")
            assert node.relay_client.reachability == Reachability.PUBLIC
            assert node.relay_client.client.reservations == {}
        finally:
            await stop_home(node, task)
            await stop_home(relay, relay_task)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_ledger_answering_junk_is_reported_and_reservations_go_on():
    class JunkLedger(FakeLedger):
        async def node_info(self, peer_id):
            return "not a record"

    async def main():
        home_id = Identity.generate()
        relay = await start_relay({home_id.peer_id})
        node, task = await start_home(home_id, [relay.host.listen_addrs[0]], True, JunkLedger())
        try:
            await eventually(lambda: node.relay_client.client.reservations, what="reservation")
            await eventually(lambda: node.relay_client.last_error, what="the error reported")
            assert "publishing the node record" in node.relay_client.last_error
            assert not task.done() and node.relay_client.published is None
        finally:
            await stop_home(node, task)
            await stop_all(relay)

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("key", ["ledger_rpc", "receipt_rpc"])
def test_a_malformed_ledger_url_is_a_config_error(key):
    with pytest.raises(ConfigError, match=f"\\[relay\\] {key}"):
        Node(node_config(rpc=False, **{key: "localhost:8645"}), Identity.generate(), [RelayRole])


def test_the_ledger_urls_come_from_the_ledger_section_then_the_legacy_keys():
    overrides = {("rpc", "enabled"): "false", ("compute", "rpc_url"): "http://127.0.0.1:9"}
    node = Node(load_config(None, env={}, overrides=overrides), Identity.generate(), [basic_role("compute")])
    assert node.relay_client.ledger is node.ledger and node.ledger.url == "http://127.0.0.1:9"
    assert not node.ledger.is_local
    overrides[("relay", "ledger_rpc")] = "http://127.0.0.1:10"
    overrides[("ledger", "rpc_urls")] = "http://127.0.0.1:11,http://127.0.0.1:12"
    node = Node(load_config(None, env={}, overrides=overrides), Identity.generate(), [basic_role("compute")])
    assert node.ledger.pool.urls == ["http://127.0.0.1:11", "http://127.0.0.1:12", "http://127.0.0.1:10",
                                     "http://127.0.0.1:9"]
    del overrides[("compute", "rpc_url")], overrides[("relay", "ledger_rpc")], overrides[("ledger", "rpc_urls")]
    node = Node(load_config(None, env={}, overrides=overrides), Identity.generate(), [basic_role("compute")])
    assert node.relay_client.ledger is None and not node.ledger.available


def test_stake_lookup_admits_funded_clients_only_when_asked():
    client, pauper = Identity.generate().peer_id, Identity.generate().peer_id
    ledger = FakeLedger(balances={client: 10})

    async def main():
        assert await StakeLookup(ledger, ttl=0)(client) is None               # off by default
        lookup = StakeLookup(ledger, ttl=0, min_client_balance=5)
        assert await lookup(client) == 0 and await lookup(pauper) is None
        assert await StakeLookup(ledger, ttl=0, min_client_balance=11)(client) is None
    asyncio.run(main())
