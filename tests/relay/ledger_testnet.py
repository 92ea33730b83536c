"""An in-process ledger for relay wiring tests: N validator Nodes on 127.0.0.1 sharing one event
loop, plus helpers to build more Nodes (relays, home nodes) against it."""
from __future__ import annotations

import asyncio
from pathlib import Path

from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.validator.role import ValidatorRole
from devtools.testnet import free_ports
from node.config import load_config
from node.identity import Identity
from node.ledger import LedgerGateway
from node.roles import RoleFactory, basic_role
from node.runtime import Node

CHAIN = "relay-wiring"


def _as_text(value) -> str:
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def node_config(port: int = 0, rpc: bool = True, extra: dict | None = None, **relay):
    """A loopback node config; keyword arguments are ``[relay]`` keys, ``extra`` maps (section,
    key) to a value for any other key."""
    overrides = {("p2p", "listen"): f"/ip4/127.0.0.1/tcp/{port}", ("rpc", "port"): "0",
                 ("rpc", "enabled"): _as_text(rpc),
                 ("consensus", "chain_id"): CHAIN, ("consensus", "empty_block_wait"): "0.05",
                 ("consensus", "idle_block_wait"): "0.05", ("consensus", "timeout_propose"): "0.5"}
    overrides.update({("relay", key): _as_text(value) for key, value in relay.items()})
    overrides.update({name: _as_text(value) for name, value in (extra or {}).items()})
    return load_config(None, env={}, overrides=overrides)


class LedgerTestnet:
    """Validators V0..Vn-1 (``extra_roles[i]`` added to Vi, each funded to pay fees) with ``balances``
    at genesis."""

    def __init__(self, root: Path, validators: int, balances: dict[str, int],
                 extra_roles: dict[int, list[RoleFactory]] | None = None, relay_settings: dict | None = None,
                 params: dict | None = None) -> None:
        self.identities = [Identity.generate() for _ in range(validators)]
        ports = free_ports(validators)
        funded = {**{ident.peer_id: 10**6 for ident in self.identities}, **balances}  # fees need a balance
        genesis = Genesis(CHAIN, 0, funded, tuple(
            GenesisValidator(ident.peer_id, 10_000, (f"/ip4/127.0.0.1/tcp/{port}",))
            for ident, port in zip(self.identities, ports)), Params(committee_size=validators, **(params or {})))
        self.nodes: list[Node] = []
        for i, (ident, port) in enumerate(zip(self.identities, ports)):
            home = root / f"v{i}"
            home.mkdir(parents=True)
            (home / "genesis.json").write_text(genesis.to_json())
            extra = (extra_roles or {}).get(i, [])
            settings = relay_settings or {} if extra else {}
            self.nodes.append(Node(node_config(port, **settings), ident, [ValidatorRole, *extra], home=home))
        self.validator_roles = [node.role("validator") for node in self.nodes]
        self.others: list[Node] = []
        self._clients: dict[tuple[str, int], LedgerGateway] = {}
        self._tasks: list[asyncio.Task] = []

    def url(self, i: int) -> str:
        return self.nodes[i].http.url

    async def start(self) -> None:
        for node in self.nodes:
            self._tasks.append(asyncio.create_task(node.run()))
        for node, role in zip(self.nodes, self.validator_roles):
            await asyncio.wait_for(node.ready.wait(), 20)
            await asyncio.wait_for(role.ready.wait(), 20)

    async def add(self, config, identity: Identity, roles: list[RoleFactory] | None = None) -> Node:
        node = Node(config, identity, roles or [basic_role("compute")])
        self.others.append(node)
        self._tasks.append(asyncio.create_task(node.run()))
        await asyncio.wait_for(node.ready.wait(), 20)
        return node

    async def stop(self) -> None:
        for node in self.others + self.nodes:
            node.request_stop()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 30)
        for client in self._clients.values():
            await client.close()

    def client(self, identity: Identity, i: int = 0) -> LedgerGateway:
        """A ledger gateway of ``identity`` (outside any node) over validator ``i``'s JSON-RPC."""
        key = (identity.peer_id, i)
        if key not in self._clients:
            self._clients[key] = LedgerGateway(identity, [self.url(i)])
        return self._clients[key]


async def eventually(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    """Await ``predicate()`` (sync or async) becoming true, polling every 0.1 s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
