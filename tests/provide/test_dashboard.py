"""The provider dashboard (node/dashboard, docs/adr/0195): the page at GET / with its token and no outside
assets, the data it shows (peers, wallet, payouts, slashes, the current task), the pause switch refused
cross-site and without the page's token and honoured from loopback, the page refused to other hosts, and
a paused compute node taking no new task."""
import asyncio
import time

from aiohttp.test_utils import make_mocked_request

from consensus.task_info import TaskInfo
from ml.compute.dashboard_view import earnings_over_time, owned_by, payouts_to, slashes_of
from ml.compute.training import PAUSED_REASON
from node.dashboard import TOKEN_HEADER, is_loopback
from node.identity import Identity
from tests.compute.test_worker_flow import fake_list, make_role, task_doc
from tests.node.node_harness import running_node

OTHER = Identity.generate().peer_id


class DashboardLedger:
    """What the dashboard section reads through the node's ledger gateway (``available`` False: the role's
    loop idles, only the dashboard reads)."""

    available = False

    def __init__(self, me):
        self.me = me

    async def call(self, method, *params):
        if method == "dkb_getStake":
            return {"bonded": 150, "unbonding": [[90, 7]], "slashed": 15}
        if method == "dkb_getBlockByNumber":
            return {"height": 40, "time_ms": int(time.time() * 1000) - 120_000}   # this clock: 2 min ahead
        if method == "dkb_getParams":
            return {"min_worker_stake": 100, "min_verifier_stake": 100}
        if method == "dkb_listTasks":
            return [
                {"task_id": "aa" * 32, "status": "paid", "payouts": {self.me: 40, OTHER: 5}, "slots": [],
                 "assigned_height": 12},
                {"task_id": "bb" * 32, "status": "running", "payouts": {}, "slots": [], "owner": self.me,
                 "workers": [OTHER]},
                {"task_id": "cc" * 32, "status": "paid", "payouts": {OTHER: 50}, "slots": [
                    {"slot": 0, "worker": self.me, "segment": 3, "outcome": "guilty",
                     "verdict": {"match": False, "evidence": "dd" * 32}, "verifiers": [], "referees": []}]},
            ]
        raise AssertionError(method)

    async def balance(self, peer):
        return 1234

    def describe(self):
        return "http://validator.test"


def test_page_data_and_pause_switch():
    async def go():
        async with running_node(["compute"]) as (node, session):
            compute = node.role("compute")
            compute.ledger = DashboardLedger(node.peer_id)
            page = await session.get("/")
            html = await page.text()
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
            assert f'content="{node.dashboard.token}"' in html
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
            assert "http://" not in html and "https://" not in html   # nothing loaded from elsewhere
            script = await session.get("/dashboard/app.js")
            assert script.status == 200 and "X-Dekube-Token" in await script.text()
            # POST / is still JSON-RPC
            rpc = await session.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "dkb_peerId", "params": []})
            assert (await rpc.json())["result"] == node.peer_id

            data = await (await session.get("/dashboard/data")).json()
            assert data["node"]["peer_id"] == node.peer_id and data["node"]["peers"] == []
            assert data["bandwidth"] == {"upload_mbps": None, "download_mbps": None, "median_latency_ms": None}
            section = data["compute"]
            assert section["wallet"] == {"balance": 1234, "bonded": 150, "unbonding": 7}
            assert section["payouts"] == [{"task_id": "aa" * 32, "status": "paid", "amount": 40}]
            [slash] = section["slashes"]
            assert slash["task_id"] == "cc" * 32 and "segment 3 did not replay" in slash["reason"]
            assert section["paused"] is False and section["ledger_reachable"] is True
            [clock] = section["problems"]
            assert clock.startswith("this machine's clock is 120 s ahead of") and "timedatectl" in clock
            assert slash["evidence"] == f"/explorer/#task/{'cc' * 32}" and section["slashed"] == 15
            assert section["audits"] == [{"task_id": "cc" * 32, "slot": 0, "role": "audited", "outcome": "guilty",
                                          "evidence": slash["evidence"]}]
            assert section["earnings"] == [{"task_id": "aa" * 32, "height": 12, "amount": 40, "total": 40}]
            assert section["owned"] == [{"task_id": "bb" * 32, "status": "running", "workers": 1, "fetch": ""}]

            token = {TOKEN_HEADER: node.dashboard.token}
            for headers in ({**token, "Origin": "https://evil.example"},
                            {**token, "Sec-Fetch-Site": "cross-site"},
                            {},                                     # no token: another program or page
                            {TOKEN_HEADER: "guessed"}):
                refused = await session.post("/dashboard/pause", json={"paused": True}, headers=headers)
                assert refused.status == 403, headers
                assert compute.paused is False
            bad = await session.post("/dashboard/pause", data=b"[1]", headers=token)
            assert bad.status == 400 and compute.paused is False
            own = f"http://127.0.0.1:{node.http.port}"
            done = await session.post("/dashboard/pause", json={"paused": True}, headers={**token, "Origin": own})
            assert done.status == 200 and (await done.json()) == {"paused": True} and compute.paused is True
            data = await (await session.get("/dashboard/data")).json()
            assert data["compute"]["paused"] is True
            assert any(line["message"] == "compute paused from the dashboard" and line["level"] == "WARNING"
                       for line in data["log"])   # the log tail
            await session.post("/dashboard/pause", json={"paused": False}, headers=token)
            assert compute.paused is False

    asyncio.run(go())


def test_ledger_down_still_shows_the_node():
    async def go():
        async with running_node(["compute"]) as (node, session):
            data = await (await session.get("/dashboard/data")).json()
            assert data["node"]["peer_id"] == node.peer_id
            assert "error" in data["compute"]   # no ledger configured: said, not a 500

    asyncio.run(go())


class FakePeer:
    def __init__(self, host):
        self.host = host

    def get_extra_info(self, name, default=None):
        return (self.host, 50000) if name == "peername" else default


def test_only_loopback_clients_get_the_dashboard():
    assert is_loopback(make_mocked_request("GET", "/", transport=FakePeer("127.0.0.1")))
    assert is_loopback(make_mocked_request("GET", "/", transport=FakePeer("::1")))
    assert not is_loopback(make_mocked_request("GET", "/", transport=FakePeer("192.0.2.10")))


def test_a_paused_node_takes_no_new_task(tmp_path):
    role = make_role(tmp_path)
    task = task_doc(role)
    started = []

    async def run_job(t):
        started.append(t)

    role.training.run_job = run_job
    role.set_paused(True)

    async def tick():
        role.ledger.call = fake_list(task)
        await role._tick()
        await asyncio.sleep(0)   # the rejection runs as a background task
        for pending in list(role._background):
            await pending

    asyncio.run(tick())
    assert started == []
    assert role.ledger.sent == [("reject_task", {"task_id": bytes.fromhex(task["task_id"]),
                                                 "reason": PAUSED_REASON})]
    asyncio.run(tick())                            # once: the job is there now
    assert len(role.ledger.sent) == 1 and started == []
    # resumed: a new task is taken again
    role.set_paused(False)
    fresh = {**task, "task_id": "22" * 32}
    asyncio.run(tick_on(role, fresh))
    assert [t.task_id for t in started] == ["22" * 32]


async def tick_on(role, task):
    role.ledger.call = fake_list(task)
    await role._tick()
    await asyncio.gather(*role._background)


def test_payouts_and_slashes_from_task_records():
    me = Identity.generate().peer_id
    verdict = {"match": True, "evidence": ""}
    tasks = [TaskInfo.from_json(doc) for doc in [
        {"task_id": "01" * 32, "status": "paid", "payouts": {me: 9}, "slots": [
            {"slot": 1, "worker": OTHER, "outcome": "ok", "verdict": verdict, "referees": [],
             "verifiers": [{"verifier": me, "answer": {"match": False, "evidence": "ee" * 32}}]}]},
        {"task_id": "02" * 32, "status": "rejected", "payouts": {me: 2}, "slots": []},
        {"task_id": "03" * 32, "status": "committed", "payouts": {me: 5}, "slots": [
            {"slot": 0, "worker": me, "outcome": "pending", "verdict": None}]},
    ]]
    assert payouts_to(tasks, me) == [{"task_id": "01" * 32, "status": "paid", "amount": 9},
                                     {"task_id": "02" * 32, "status": "rejected", "amount": 2}]
    [slash] = slashes_of(tasks, me)
    assert slash["task_id"] == "01" * 32 and slash["reason"].startswith("as verifier: answered match=False")
    assert slashes_of(tasks, OTHER) == []


def test_earnings_over_time_and_owned_tasks():
    me = Identity.generate().peer_id
    tasks = [TaskInfo.from_json(doc) for doc in [
        {"task_id": "01" * 32, "status": "paid", "assigned_height": 9, "payouts": {me: 5}},
        {"task_id": "02" * 32, "status": "paid", "assigned_height": 3, "payouts": {me: 7}, "owner": me,
         "workers": [OTHER, me]},
        {"task_id": "03" * 32, "status": "running", "assigned_height": 1, "payouts": {me: 100}}]]
    assert [(e["height"], e["total"]) for e in earnings_over_time(tasks, me)] == [(3, 7), (9, 12)]
    [owned] = owned_by(tasks, me)
    assert owned["workers"] == 2 and owned["fetch"] == f"dekube-node task fetch {'02' * 32} --out weights-02020202"


def test_the_log_tail_is_bounded():
    import logging

    from node.dashboard.logtail import MAX_LINE_CHARS, MAX_LINES, LogTail
    tail = LogTail()
    for i in range(MAX_LINES + 20):
        tail.emit(logging.LogRecord("x", logging.INFO, "f", 1, "line %d " + "y" * MAX_LINE_CHARS, (i,), None))
    tail.emit(logging.LogRecord("x", logging.INFO, "f", 1, "bad %d %d", ("one",), None))
    assert len(tail.lines) == MAX_LINES and tail.tail(1)[0]["message"] == "bad %d %d"
    assert all(len(line["message"]) <= MAX_LINE_CHARS for line in tail.lines)
