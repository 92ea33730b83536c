"""Node lifecycle: roles built by the node before serving, run in one TaskGroup, cancelled on stop; failures surface."""
import asyncio

import aiohttp
import pytest
from node_harness import local_config

from node import plugins
from node.identity import Identity
from node.plugins import Plugins
from node.roles import BasicRole, Role, RoleError, basic_role, create_role, role_factory
from node.runtime import Node


class CountingRole(Role):
    """A role that registers an RPC method and a status section, and records its cancellation."""

    name = "compute"

    def __init__(self, node):
        super().__init__(node)
        self.ticks = 0
        self.cancelled = False

        async def dkb_ticks() -> int:
            return self.ticks

        node.rpc.register("dkb_ticks", dkb_ticks)
        node.status.add_section("compute", lambda: {"ticks": self.ticks})

    async def run(self):
        try:
            while True:
                self.ticks += 1
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class FailingRole(Role):
    name = "relay"

    async def run(self):
        await asyncio.sleep(0.05)
        raise RuntimeError("relay broke")


def test_roles_register_methods_and_are_cancelled_on_stop():
    async def scenario():
        node = Node(local_config(), Identity.generate(), [CountingRole])
        role = node.role("compute")
        assert node.roles == [role] and isinstance(role, CountingRole) and role.node is node
        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http:
            async with http.post(node.http.url, json={"jsonrpc": "2.0", "id": 1, "method": "dkb_ticks"}) as resp:
                assert (await resp.json())["result"] > 0
            async with http.get(node.http.url + "/status") as resp:
                assert (await resp.json())["compute"]["ticks"] > 0
        url = node.http.url
        node.request_stop()
        node.request_stop()  # idempotent
        await asyncio.wait_for(task, 10)
        assert role.cancelled
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(url + "/health")

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_failing_role_stops_the_node_and_surfaces_the_error():
    async def scenario():
        node = Node(local_config(), Identity.generate(), [CountingRole, FailingRole])
        other = node.role("compute")
        with pytest.raises(ExceptionGroup) as group:
            await node.run()
        assert group.group_contains(RuntimeError, match="relay broke")
        assert other.cancelled

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_rpc_can_be_disabled():
    async def scenario():
        node = Node(local_config({("rpc", "enabled"): "false"}), Identity.generate(), [basic_role("relay")])
        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        assert node.http is None
        node.request_stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_node_needs_a_role():
    with pytest.raises(ValueError, match="at least one role"):
        Node(local_config(), Identity.generate(), [])


def test_role_registry(monkeypatch):
    def fresh():
        return Node(local_config(), Identity.generate(), [basic_role("relay")])

    node = fresh()
    validator = create_role("validator", node)   # the installed (product) plugins, tests/conftest.py
    assert validator.name == "validator" and not isinstance(validator, BasicRole) and validator.node is node
    with pytest.raises(RoleError, match="unknown role 'miner'"):
        role_factory("miner")
    counting = Plugins(roles={"compute": lambda: CountingRole, "relay": lambda: CountingRole})
    assert isinstance(role_factory("compute", counting)(fresh()), CountingRole)
    with pytest.raises(RoleError, match="did not create a Role named 'relay'"):
        role_factory("relay", counting)(fresh())

    def missing():
        import no.such.module  # noqa: F401

    with pytest.raises(RoleError, match="cannot load role implementation"):
        role_factory("relay", Plugins(roles={"relay": missing}))
    with pytest.raises(RoleError, match="unknown role 'relay' \\(roles: none installed\\)"):
        role_factory("relay", Plugins())


def test_node_builds_roles_by_name(monkeypatch):
    monkeypatch.setattr(plugins, "_installed", Plugins(roles={"compute": lambda: CountingRole}))
    node = Node(local_config(), Identity.generate(), ["compute", basic_role("relay")])
    assert [type(r) for r in node.roles] == [CountingRole, BasicRole]
    assert node.role("relay").node is node and "relay" in node.status._sections
    assert set(node.services) == {"bandwidth"}   # no services installed: only the node's own
    with pytest.raises(KeyError):
        node.role("validator")


def test_p2p_host_listens_and_bootstrap_connects_nodes():
    async def scenario():
        a = Node(local_config(), Identity.generate(), [basic_role("relay")])
        a_task = asyncio.create_task(a.run())
        await asyncio.wait_for(a.ready.wait(), 10)
        a_addr = a.host.listen_addrs[0]
        assert a_addr.startswith("/ip4/127.0.0.1/tcp/") and a_addr.endswith(f"/p2p/{a.peer_id}")
        dead = f"/ip4/127.0.0.1/tcp/1/p2p/{Identity.generate().peer_id}"
        b = Node(local_config({("p2p", "bootstrap"): f"{dead},{a_addr}"}), Identity.generate(),
                 [basic_role("compute")])
        b_task = asyncio.create_task(b.run())
        await asyncio.wait_for(b.ready.wait(), 10)
        assert b.host.is_protected(a.peer_id) and b.host.is_protected(dead.rsplit("/", 1)[1])  # ADR 0145
        for _ in range(200):
            if a.peers() == [b.peer_id] and b.peers() == [a.peer_id]:
                break
            await asyncio.sleep(0.025)
        async with aiohttp.ClientSession() as http:
            async with http.get(b.http.url + "/status") as resp:
                status = await resp.json()
            assert status["peers"] == [a.peer_id] and status["listen_addrs"] == b.host.listen_addrs
            async with http.post(a.http.url, json={"jsonrpc": "2.0", "id": 1, "method": "dkb_peers"}) as resp:
                assert (await resp.json())["result"] == [b.peer_id]
            async with http.get(a.http.url + "/metrics") as resp:
                assert "dekube_p2p_peers 1.0" in await resp.text()
        for node, task in ((b, b_task), (a, a_task)):
            node.request_stop()
            await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_p2p_port_in_use_is_a_clear_start_error():
    from node.runtime import NodeStartError

    async def scenario():
        a = Node(local_config(), Identity.generate(), [basic_role("relay")])
        a_task = asyncio.create_task(a.run())
        await asyncio.wait_for(a.ready.wait(), 10)
        taken = a.host.listen_addrs[0].split("/p2p/")[0]
        b = Node(local_config({("p2p", "listen"): taken}), Identity.generate(), [basic_role("relay")])
        with pytest.raises(NodeStartError, match=f"cannot listen on {taken}"):
            await b.run()
        a.request_stop()
        await asyncio.wait_for(a_task, 10)

    asyncio.run(asyncio.wait_for(scenario(), 30))


class BlockRole(Role):
    """Serves GET /block?height= the way the validator role will."""

    name = "validator"

    def __init__(self, node):
        super().__init__(node)
        from node.rpc.errors import InvalidParams, ResourceNotFound

        async def block(query):
            if "height" not in query or not query["height"].isdigit():
                raise InvalidParams("height must be a non-negative integer")
            if int(query["height"]) > 10:
                raise ResourceNotFound(f"no block at height {query['height']}")
            if query["height"] == "7":
                raise RuntimeError("secret detail")
            return {"height": int(query["height"])}

        node.add_json_get("/block", block)
        with pytest.raises(ValueError):
            node.add_json_get("/status", block)

    async def run(self):
        await asyncio.Event().wait()


def test_roles_add_json_get_routes():
    async def scenario():
        node = Node(local_config(), Identity.generate(), [BlockRole])
        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        with pytest.raises(RuntimeError, match="before the node starts"):
            node.add_json_get("/late", None)
        async with aiohttp.ClientSession(base_url=node.http.url) as http:
            async with http.get("/block", params={"height": "3"}) as resp:
                assert resp.status == 200 and await resp.json() == {"height": 3}
            async with http.get("/block") as resp:
                assert resp.status == 400 and (await resp.json())["error"]["code"] == -32602
            async with http.get("/block", params={"height": "99"}) as resp:
                assert resp.status == 404 and "no block" in (await resp.json())["error"]["message"]
            async with http.get("/block", params={"height": "7"}) as resp:
                assert resp.status == 500 and "secret" not in await resp.text()
        node.request_stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_stop_does_not_wait_forever_for_a_hanging_request():
    async def scenario():
        node = Node(local_config(), Identity.generate(), [basic_role("relay")])

        @node.rpc.method("dkb_hang")
        async def hang() -> None:
            await asyncio.sleep(3600)

        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(http.post(node.http.url, json={"jsonrpc": "2.0", "id": 1,
                                                                         "method": "dkb_hang"}))
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            started = loop.time()
            node.request_stop()
            await asyncio.wait_for(task, 20)
            assert loop.time() - started < 10
            with pytest.raises(aiohttp.ClientError):
                await request

    asyncio.run(asyncio.wait_for(scenario(), 30))
