"""The relay wiring end to end on loopback: a 4-validator chain in one process, a relay that is also a
validator (admission from its own ledger), a relay that asks a validator over JSON-RPC, and home
nodes that only use the relays (``[relay] relays``, ``reserve = true``).

Both relays register with the relay role. Registered, bonded home nodes reserve on both relays and
publish their relayed addresses in their ledger records (and /status), restored when another writer
drops them; an unregistered node and one with too little stake are refused. One home node reaches the other with
``host.open_bulk_connection`` (13 bulk circuits, past the default per-peer limit) and
``host.open_stream`` knowing only its relayed addresses from the ledger; the co-signed receipts are
paid on chain (the relays earn what the source paid); a validator without relay settings reaches
the home node the same way.
"""
import asyncio

import pytest
from ledger_testnet import CHAIN, LedgerTestnet, eventually, node_config
from relay_harness import SINK_PROTOCOL, Sink, expected_answer, pattern, send_and_check, start_endpoint, stop_all

from node.identity import Identity
from node.ledger import LedgerGateway
from relay.client import RelayRefused, split_circuit_addr
from relay.messages import Status
from relay.role import RelayRole

MIN_STAKE = 100


async def balance(client: LedgerGateway, peer_id: str) -> int:
    return await client.call("dkb_getBalance", peer_id)


def test_home_nodes_reserve_reach_each_other_and_the_relay_is_paid(tmp_path, monkeypatch):
    monkeypatch.setattr("node.ledger.record.RECHECK_S", 0.5)
    home_a, home_b, stranger, unbonded = (Identity.generate() for _ in range(4))
    relay2_id = Identity.generate()
    funds = {ident.peer_id: 10**6 for ident in (home_a, home_b, stranger, unbonded, relay2_id)}  # fees need funds
    net = LedgerTestnet(tmp_path, 4, funds, extra_roles={0: [RelayRole]},
                        relay_settings={"min_stake": MIN_STAKE, "reservation_ttl": 60})
    relay_on_validator = net.nodes[0].role("relay")

    async def main():
        await net.start()
        try:
            reader = net.client(Identity.generate(), 3)
            relay2 = await net.add(node_config(ledger_rpc=net.url(1), min_stake=MIN_STAKE, lookup_ttl=0.5),
                                   relay2_id, [RelayRole])
            standalone = relay2.role("relay")
            relays = [net.nodes[0].host.listen_addrs[0], relay2.host.listen_addrs[0]]
            await eventually(lambda: relay_on_validator.registered and standalone.registered, what="relays registered")
            assert set((await reader.call("dkb_getNode", relay2.peer_id))["roles"]) == {"relay"}
            assert set((await reader.call("dkb_getNode", net.nodes[0].peer_id))["roles"]) == {"relay", "validator"}
            assert relay2.host.limits.max_connections_per_peer >= 64  # one connection per bulk circuit fits

            for ident in (home_a, home_b):  # operators bond before their nodes join
                await net.client(ident, 2).send("bond", {"amount": 1_000})
            # no hole punching: on loopback it would always work, and this test is about the relay path
            a = await net.add(node_config(relays=relays, reserve=True, ledger_rpc=net.url(1), hole_punch=False), home_a)
            b = await net.add(node_config(relays=relays, reserve=True, ledger_rpc=net.url(2), hole_punch=False), home_b)
            c = await net.add(node_config(relays=relays, reserve=True), stranger)  # no ledger: never registered

            for home in (a, b):
                await eventually(lambda home=home: len(home.relay_client.client.reservations) == 2,
                                 what="two reservations")
                await eventually(
                    lambda home=home: home.relay_client.published == home.relay_client.client.relayed_addrs,
                    what="relayed addresses published")
                # published = the registration sent to its validator; the reader asks another, which
                # may be a block behind (a loaded machine made that read come back empty once)
                async def recorded(home=home):
                    found = await reader.call("dkb_getNode", home.peer_id)
                    return found if found["relay_addrs"] == home.relay_client.client.relayed_addrs else None
                await eventually(recorded, what="relayed addresses on the ledger")
                record = await recorded()
                assert record is not None
                assert {split_circuit_addr(addr)[0].peer_id for addr in record["relay_addrs"]} == {
                    net.nodes[0].peer_id, relay2.peer_id}
                status = (await home.status.snapshot())["relay_client"]
                assert status["relayed_addrs"] == record["relay_addrs"] and len(status["reservations"]) == 2

            # another writer of a record (the compute role re-registering) drops what the relay wiring
            # put there: the relay role and the relayed addresses come back
            for ident, _node in ((relay2_id, relay2), (home_a, a)):
                record = await reader.call("dkb_getNode", ident.peer_id)
                await net.client(ident, 3).send("register_node", {
                    "roles": ["compute"], "listen_addrs": record["listen_addrs"], "relay_addrs": [],
                    "hardware": record["hardware"]})

            async def restored():
                relay_record = await reader.call("dkb_getNode", relay2.peer_id)
                home_record = await reader.call("dkb_getNode", a.peer_id)
                return ("relay" in relay_record["roles"] and home_record["relay_addrs"]
                        and home_record["relay_addrs"] == a.relay_client.client.relayed_addrs)
            await eventually(restored, what="records restored")
            assert (await reader.call("dkb_getNode", relay2.peer_id))["roles"] == ["compute", "relay"]

            assert c.relay_client.client.reservations == {}
            for relay_addr in relays:
                with pytest.raises(RelayRefused) as info:
                    await c.relay_client.client.reserve(relay_addr)
                assert info.value.status == Status.PERMISSION_DENIED
            # registered but with less than min_stake bonded: refused too
            await net.client(unbonded, 1).send("register_node", {
                "roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                "hardware": {"cpu_cores": 1, "ram_mb": 0, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 0}})
            await net.client(unbonded, 1).send("bond", {"amount": MIN_STAKE - 1})
            await asyncio.sleep(0.6)  # past relay2's lookup_ttl
            poor = await start_endpoint(unbonded, chain_id=CHAIN)
            try:
                for relay_addr in relays:
                    with pytest.raises(RelayRefused) as info:
                        await poor.reserve(relay_addr)
                    assert info.value.status == Status.PERMISSION_DENIED
            finally:
                await stop_all(poor)
            assert relay_on_validator.service.counters["reservations_refused"] >= 1
            assert standalone.service.counters["reservations_refused"] >= 1

            # A knows nothing of B but its ledger record: the Host dials B through a relay.
            assert await a.relay_client.learn_peer(b.peer_id) == b.relay_client.client.relayed_addrs
            assert all("/p2p-circuit" in str(addr) for addr in a.host.peerbook.addrs(b.peer_id))
            relay_ids = [net.nodes[0].peer_id, relay2.peer_id]
            before = {pid: await balance(reader, pid) for pid in [a.peer_id, *relay_ids]}

            # first a bulk connection (a circuit on its own relay connection; bulk connections run no
            # identify, so B's loopback listen address stays unknown to A), then the shared one
            b.host.set_handler(SINK_PROTOCOL, Sink())
            bulk = await a.host.open_bulk_connection(b.peer_id)
            assert bulk.bulk and a.relay_client.client.pipe_for(bulk) is not None
            assert await send_and_check(bulk, pattern(1 << 20)) == expected_answer(pattern(1 << 20))
            await bulk.close()
            # more bulk circuits at once than the default 8 connections per peer (A to its relay, the
            # relay from A): both ends raised their per-peer limit
            many = await asyncio.gather(*(a.host.open_bulk_connection(b.peer_id) for _ in range(12)))
            assert all(a.relay_client.client.pipe_for(conn) is not None for conn in many)
            await asyncio.gather(*(conn.close() for conn in many))
            b.host.set_handler(SINK_PROTOCOL, Sink())
            stream = await a.host.open_stream(b.peer_id, SINK_PROTOCOL)
            assert a.relay_client.client.pipe_for(stream.connection) is not None, "the connection must be relayed"
            data = pattern(3 << 20)
            await stream.write(data)
            await stream.close()
            answer = b""
            while chunk := await stream.read():
                answer += chunk
            assert answer.decode() == expected_answer(data)
            await stream.connection.close()  # the circuits ended: the relays ask for final receipts


            async def settled():  # 1 per MiB, paid by A (the relays' gain is net of their receipt fees)
                now = {pid: await balance(reader, pid) for pid in before}
                return before[a.peer_id] - now[a.peer_id] >= 4
            await eventually(settled, what="both circuits' receipts paid on chain")
            # a payment can settle before the other relay's receipt round is counted: wait for both
            await eventually(lambda: relay_on_validator.service.counters["receipts"]
                             + standalone.service.counters["receipts"] >= 2, what="receipts of both relays")
            assert relay_on_validator.service.counters["receipts_failed"] == 0
            sent = [(await node.status.snapshot())["relay"] for node in (net.nodes[0], relay2)]
            assert sum(s["receipts_sent"] for s in sent) >= 2 and all(s["receipts_send_failed"] == 0 for s in sent)

            # a node with no [relay] settings at all (a validator) reaches B the same way
            validator = net.nodes[3]
            await validator.relay_client.learn_peer(b.peer_id)
            b.host.set_handler(SINK_PROTOCOL, Sink())
            assert await validator.host.ping(b.peer_id) > 0
            conn = validator.host.connections(b.peer_id)[0]
            assert validator.relay_client.client.pipe_for(conn) is not None
            assert await send_and_check(conn, pattern(1 << 16)) == expected_answer(pattern(1 << 16))
        finally:
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.slow  # imports torch (the compute role): ~10 s more on the loaded 2-core machine
def test_a_home_compute_node_keeps_its_relayed_addresses_next_to_the_compute_registration(tmp_path, monkeypatch):
    """The compute role registers the same record (roles, hardware, relay_addrs []): after it has,
    the record carries both what it wrote and this node's relayed addresses."""
    from ml.compute.role import ComputeRole

    monkeypatch.setattr("node.ledger.record.RECHECK_S", 0.5)
    home = Identity.generate()
    net = LedgerTestnet(tmp_path, 2, {home.peer_id: 10**6}, extra_roles={0: [RelayRole]})

    async def main():
        await net.start()
        try:
            reader = net.client(Identity.generate(), 1)
            config = node_config(relays=[net.nodes[0].host.listen_addrs[0]], reserve=True, rpc=False,
                                 extra={("compute", "rpc_url"): net.url(1)})
            a = await net.add(config, home, [ComputeRole])
            compute = a.role("compute")
            await eventually(lambda: compute.registered and a.relay_client.client.relayed_addrs, 60,
                             what="compute registration and a reservation")

            async def both():
                record = await reader.call("dkb_getNode", a.peer_id)
                return (record and "compute" in record["roles"] and record["hardware"]["bandwidth_mbps"] == 100
                        and record["relay_addrs"] == a.relay_client.client.relayed_addrs)
            await eventually(both, 30, what="the record carrying both")
            assert (await reader.call("dkb_getStake", a.peer_id))["bonded"] >= 1000
        finally:
            await net.stop()

    asyncio.run(asyncio.wait_for(main(), 120))
