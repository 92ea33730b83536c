"""The validator role in one process: a two-validator chain commits client transactions (JSON-RPC,
newHeads, /block, /status), restarts from its databases, and refuses a corrupt or foreign database.
(Two validators, not one: the driver commits a one-validator height recursively inside start_height.)"""
import asyncio

import aiohttp
import pytest

from consensus.genesis import Genesis, GenesisValidator, Params
from consensus.tx import build_tx
from consensus.validator.role import ValidatorRole, ValidatorStartError
from devtools.testnet import free_ports
from node.config import load_config
from node.identity import Identity
from node.runtime import Node

VALIDATOR = Identity.from_seed(b"\x61" * 32)
PARTNER = Identity.from_seed(b"\x63" * 32)
FOLLOWER = Identity.from_seed(b"\x64" * 32)
USER = Identity.from_seed(b"\x62" * 32)
CHAIN = "role-test"


PORTS = {}


def make_home(tmp_path, chain_id=CHAIN, balance=10**6, params=None):
    if not PORTS:
        PORTS.update(zip((VALIDATOR.peer_id, PARTNER.peer_id), free_ports(2)))
    validators = tuple(GenesisValidator(ident.peer_id, 10_000, (f"/ip4/127.0.0.1/tcp/{PORTS[ident.peer_id]}",))
                       for ident in (VALIDATOR, PARTNER))
    genesis = Genesis(chain_id, 0, {USER.peer_id: balance}, validators, params or Params(committee_size=2))
    for name in ("", "partner", "follower"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "genesis.json").write_text(genesis.to_json())
    return tmp_path


def config(identity, extra=None):
    port = PORTS.get(identity.peer_id, 0)
    return load_config(None, env={}, overrides={
        ("rpc", "port"): "0", ("p2p", "listen"): f"/ip4/127.0.0.1/tcp/{port}",
        ("consensus", "chain_id"): CHAIN, ("consensus", "empty_block_wait"): "0.05",
        ("consensus", "idle_block_wait"): "0.05", ("consensus", "timeout_propose"): "0.5", **(extra or {})})


async def rpc(session, method, *params):
    async with session.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}) as r:
        doc = await r.json()
    if "error" in doc:
        raise AssertionError(doc["error"])
    return doc["result"]


async def run_node(home, body, extra=None, partner_extra=None):
    node = Node(config(VALIDATOR, extra), VALIDATOR, [ValidatorRole], home=home)
    role = node.role("validator")
    partner = Node(config(PARTNER, partner_extra), PARTNER, [ValidatorRole], home=home / "partner")
    tasks = [asyncio.create_task(n.run()) for n in (node, partner)]
    await asyncio.wait_for(node.ready.wait(), 10)
    await asyncio.wait_for(role.ready.wait(), 10)
    try:
        async with aiohttp.ClientSession(base_url=node.http.url) as session:
            return await body(node, role, session)
    finally:
        for n in (node, partner):
            n.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


async def wait_for(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_single_validator_commits_transfers_and_restarts(tmp_path):
    home = make_home(tmp_path)

    async def first_run(node, role, session):
        async with session.ws_connect("/ws") as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe", "params": ["newHeads"]})
            await ws.receive_json(timeout=5)
            head = (await ws.receive_json(timeout=5))["params"]["result"]
            assert head["height"] >= 1 and len(head["hash"]) == 64
        assert await rpc(session, "dkb_chainId") == CHAIN
        tx = build_tx(USER, CHAIN, 0, "transfer", {"to": VALIDATOR.peer_id, "amount": 700}, 3)
        assert await rpc(session, "dkb_sendRawTransaction", tx.raw.hex()) == tx.hash.hex()
        assert await rpc(session, "dkb_getTransactionCount", USER.peer_id, "pending") == 1

        async def receipt():
            return await rpc(session, "dkb_getTransactionReceipt", tx.hash.hex()) is not None
        await wait_for(receipt)
        got = await rpc(session, "dkb_getTransactionReceipt", tx.hash.hex())
        assert got["status"] == "ok" and got["fee_paid"] == 3
        assert await rpc(session, "dkb_getBalance", USER.peer_id) == 10**6 - 703
        assert await rpc(session, "dkb_getTransactionCount", USER.peer_id) == 1
        block = await rpc(session, "dkb_getBlockByNumber", got["height"], True)
        assert block["transactions"][0]["hash"] == tx.hash.hex()
        assert block["transactions"][0]["payload"]["amount"] == 700
        assert {v["validator"] for v in block["commit"]} == {VALIDATOR.peer_id, PARTNER.peer_id}
        async with session.get("/block", params={"height": str(got["height"])}) as r:
            assert (await r.json())["hash"] == block["hash"]
        async with session.get("/block", params={"height": "999999"}) as r:
            assert r.status == 404
        async with session.get("/status") as r:
            status = (await r.json())["consensus"]
        assert status["ready"] and status["height"] >= got["height"] and status["catching_up"] is False
        supply = await rpc(session, "dkb_getSupply")
        assert supply["total"] == supply["genesis"]
        served = await rpc(session, "dkb_getGenesis")   # what `provide` fetches and checks (ADR 0195)
        assert served["hash"] == role.genesis.hash.hex() == Genesis.from_obj(served["genesis"]).hash.hex()
        validators = await rpc(session, "dkb_getValidators")
        assert {v["peer_id"] for v in validators["validators"]} == {VALIDATOR.peer_id, PARTNER.peer_id}
        return got["height"], block["hash"]

    height, block_hash = asyncio.run(run_node(home, first_run))

    async def second_run(node, role, session):
        assert role.ledger.height >= height                  # state reloaded from RocksDB
        assert await rpc(session, "dkb_getBalance", USER.peer_id) == 10**6 - 703
        assert (await rpc(session, "dkb_getBlockByNumber", height - 1 or 1))["height"] == (height - 1 or 1)
        first = await rpc(session, "dkb_blockNumber")

        async def advanced():
            return await rpc(session, "dkb_blockNumber") > first + 1
        await wait_for(advanced)                             # consensus resumes after the restart
        return (await rpc(session, "dkb_getBlockByNumber", height))["hash"]

    assert asyncio.run(run_node(home, second_run)) == block_hash


def test_an_idle_chain_paces_its_blocks_and_a_transfer_ends_the_wait(tmp_path):
    """docs/adr/0213: with nothing in flight a proposer waits idle_block_wait for a transaction; the
    other validator grants it that wait (no round change); a transfer goes in the next block at once."""
    home = make_home(tmp_path)
    idle = {("consensus", "idle_block_wait"): "1.5", ("consensus", "timeout_propose"): "0.3"}

    async def body(node, role, session):
        async with session.ws_connect("/ws") as ws:
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe", "params": ["newHeads"]})
            await ws.receive_json(timeout=5)
            loop = asyncio.get_running_loop()
            heads = []
            for _ in range(4):
                head = (await ws.receive_json(timeout=10))["params"]["result"]
                heads.append((loop.time(), head))
            gaps = [b[0] - a[0] for a, b in zip(heads, heads[1:])]
            assert min(gaps) > 1.2, gaps                                  # idle: one block per ~1.5 s
            tx = build_tx(USER, CHAIN, 0, "transfer", {"to": VALIDATOR.peer_id, "amount": 5}, 3)
            sent = loop.time()
            await rpc(session, "dkb_sendRawTransaction", tx.raw.hex())
            while True:
                head = (await ws.receive_json(timeout=10))["params"]["result"]
                if head["txs"]:
                    break
            assert loop.time() - sent < 1.0                               # not held for the idle wait
        async with session.get("/metrics") as r:
            text = await r.text()
        assert "dekube_consensus_rounds_per_height_count" in text
        sums = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("dekube_consensus_rounds_per_height_")}
        # every height in its first round: the partner waited for the paced proposer
        assert sums["dekube_consensus_rounds_per_height_sum"] == sums["dekube_consensus_rounds_per_height_count"]

    asyncio.run(run_node(home, body, idle, idle))


@pytest.mark.slow   # ~20 s: 110 blocks past the smallest retention the config allows
def test_a_pruning_validator_answers_pruned_for_old_blocks_and_restarts(tmp_path):
    home = make_home(tmp_path)
    retain = {("consensus", "retain_blocks"): "100", ("consensus", "empty_block_wait"): "0.01",
              ("consensus", "idle_block_wait"): "0.01"}

    async def first_run(node, role, session):
        async def past_retention():
            return await rpc(session, "dkb_blockNumber") >= 110
        await wait_for(past_retention, timeout=60)
        storage = role.store.storage
        assert storage.base > 1 and storage.height - storage.base + 1 <= 100 + 1
        async with session.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "dkb_getBlockByNumber",
                                           "params": [1]}) as r:
            error = (await r.json())["error"]
        assert "block 1 is pruned" in error["message"] and "retain_blocks = 100" in error["message"]
        assert error["data"]["pruned"] is True and error["data"]["first_block"] > 1
        async with session.get("/block", params={"height": "1"}) as r:
            assert r.status == 404 and "pruned" in (await r.text())
        kept = await rpc(session, "dkb_getBlockByNumber", storage.base)
        assert kept["height"] == storage.base and kept["commit"]
        return storage.base

    base = asyncio.run(run_node(home, first_run, retain))

    async def second_run(node, role, session):
        storage = role.store.storage
        assert storage.base >= base and storage.is_pruned(base - 1)
        first = await rpc(session, "dkb_blockNumber")

        async def advanced():
            return await rpc(session, "dkb_blockNumber") > first + 2
        await wait_for(advanced)
        assert (await rpc(session, "dkb_getBlockByNumber", first))["commit"]
        return storage.base

    assert asyncio.run(run_node(home, second_run, retain)) >= base


def test_a_new_node_joins_by_state_sync_from_the_validators(tmp_path):
    home = make_home(tmp_path, params=Params(committee_size=2, epoch_length=4))

    async def body(node, role, session):
        async def grown():
            return role.ledger.height >= 10
        await wait_for(grown, timeout=20)
        follower = Node(config(FOLLOWER), FOLLOWER, [ValidatorRole], home=home / "follower")
        joined = follower.role("validator")
        task = asyncio.create_task(follower.run())
        try:
            await asyncio.wait_for(joined.ready.wait(), 20)
            storage = joined.store.storage
            assert storage.base > 4 and storage.block_by_height(1) is None   # restored, not replayed

            target = role.ledger.height   # fixed: the validators keep committing while we wait

            async def caught_up():
                return joined.ledger.height >= target and joined.ledger.height > storage.base + 2
            await wait_for(caught_up, timeout=30)
            height = joined.ledger.height - 1
            assert joined.store.block(height).hash == role.store.block(height).hash
            assert joined.ledger.balance(USER.peer_id) == role.ledger.balance(USER.peer_id)
        finally:
            follower.request_stop()
            await asyncio.wait_for(task, 10)

    asyncio.run(run_node(home, body))


def start_fails(home):
    async def main():
        node = Node(config(VALIDATOR), VALIDATOR, [ValidatorRole], home=home)
        await asyncio.wait_for(node.run(), 10)
    with pytest.raises(BaseException) as info:
        asyncio.run(main())
    errors = info.value.exceptions if isinstance(info.value, BaseExceptionGroup) else [info.value]
    assert all(isinstance(e, ValidatorStartError) for e in errors), errors
    return str(errors[0])


def test_missing_genesis_corrupt_and_foreign_databases_are_clear_errors(tmp_path):
    assert "cannot read genesis" in start_fails(tmp_path)
    (tmp_path / "genesis.json").write_text("{not json")
    assert "genesis" in start_fails(tmp_path) and "invalid" in start_fails(tmp_path)
    make_home(tmp_path, chain_id="other-chain")
    assert "chain_id" in start_fails(tmp_path)
    make_home(tmp_path)
    (tmp_path / "data" / "chain").mkdir(parents=True)
    (tmp_path / "data" / "chain" / "junk").write_bytes(b"\x00" * 100)
    assert "not a RocksDB database" in start_fails(tmp_path)
    (tmp_path / "data" / "chain" / "junk").unlink()

    async def create(node, role, session):
        return role.ledger.height
    asyncio.run(run_node(tmp_path, create))                  # a good database for this genesis
    make_home(tmp_path, balance=5)                           # same chain id, different genesis
    assert "another genesis" in start_fails(tmp_path)


def test_a_node_outside_the_committee_follows_the_chain(tmp_path):
    home = make_home(tmp_path)

    async def body(node, role, session):
        follower = Node(config(FOLLOWER), FOLLOWER, [ValidatorRole], home=home / "follower")
        follower_role = follower.role("validator")
        task = asyncio.create_task(follower.run())
        try:
            await asyncio.wait_for(follower_role.ready.wait(), 10)
            tx = build_tx(USER, CHAIN, 0, "transfer", {"to": FOLLOWER.peer_id, "amount": 50}, 1)
            await rpc(session, "dkb_sendRawTransaction", tx.raw.hex())

            # a fixed target: the leader keeps committing (empty blocks every 0.05 s), so "caught up with
            # the leader's height right now" is a race a loaded machine can lose for the whole timeout
            async def committed():
                return role.ledger.balance(FOLLOWER.peer_id) == 50
            await wait_for(committed, timeout=15)
            target = max(role.ledger.height, 2)

            async def synced():
                return follower_role.ledger.height >= target and \
                    follower_role.ledger.balance(FOLLOWER.peer_id) == 50
            await wait_for(synced, timeout=30)
            height = follower_role.ledger.height
            assert follower_role.store.block(height).hash == role.store.block(height).hash
            assert follower_role.status()["in_committee"] is False
            # the committee's connections are never evicted for inbound newcomers (ADR 0145)
            assert all(follower.host.is_protected(p) for p in follower_role.committee.peer_ids)
            assert not follower.host.is_protected(USER.peer_id)
        finally:
            follower.request_stop()
            await asyncio.wait_for(task, 10)

    asyncio.run(run_node(home, body))


def test_prepare_returns_the_whole_chain_state_and_nothing_is_read_before(tmp_path):
    """ValidatorRole.prepare() opens the chain once and returns it complete (ADR 0201); before it, the
    chain and the ledger methods answer "still loading" instead of failing on a field left None."""
    from consensus.validator.role import ChainState
    from node.rpc.errors import ResourceUnavailable

    home = make_home(tmp_path)

    async def main():
        role = Node(config(VALIDATOR), VALIDATOR, [ValidatorRole], home=home).role("validator")
        with pytest.raises(ResourceUnavailable, match="still loading"):
            _ = role.chain
        with pytest.raises(ResourceUnavailable, match="still loading"):
            await role.call("dkb_blockNumber")
        try:
            chain = await role.prepare()
            assert isinstance(chain, ChainState) and role.chain is chain
            assert (chain.genesis.chain_id, chain.ledger.height, chain.prev_committee) == (CHAIN, 0, None)
            assert set(chain.committee.peer_ids) == {VALIDATOR.peer_id, PARTNER.peer_id}
            assert role.ledger is chain.ledger and role.store is chain.store and role.mempool is chain.mempool
        finally:
            await asyncio.get_running_loop().run_in_executor(role._worker, role._close)

    asyncio.run(main())
