"""The explorer in headless Chromium against a stubbed JSON-RPC (issues 21 and 22): chain text is shown
as text (a task's model with markup and terminal escapes creates no element); every registered
node is in the Nodes table (relays and verifier-only compute nodes were left out), runs of empty
blocks fold into one row, a node listed in the link (`?nodes=`) is named as the source of the data it
reports and flagged when it is not a worker of the task on chain (a crafted link showed an attacker's
curve as if real), and a listed node the page cannot read is named with the reason (CORS or down)."""
import json
from pathlib import Path

import pytest

from tests.explorer.harness import browser_page

STATIC = Path(__file__).resolve().parents[2] / "node" / "explorer" / "static"
BASE = "http://explorer.test"
EVIL, DOWN = "http://evil.test", "http://down.test"
TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css"}
V1, R1, R2, C1, C2, C3, ATTACKER = ("12D3KooW" + c * 44 for c in "VRSCDEZ")
TASK = "ab" * 32


def record(peer: str, *roles: str) -> dict:
    return {"peer_id": peer, "roles": list(roles), "listen_addrs": [], "relay_addrs": [], "hardware": {},
            "reputation": 0}


def block(height: int) -> dict:
    txs = [{"hash": "cd" * 32, "type": "transfer"}] if height == 25 else []
    return {"height": height, "time_ms": 1_700_000_000_000 + height * 300, "transactions": txs, "proposer": V1,
            "hash": f"{height:064x}", "commit": []}


NODES = [record(V1, "validator"), record(R1, "relay"), record(R2, "relay"), record(C1, "compute"),
         record(C2, "compute"), record(C3, "compute")]   # C3: verifier-only, in no task
HOSTILE = {"task_id": "cd" * 32, "status": "running", "owner": V1, "price": 1, "workers": [C1], "created_height": 3,
           "spec": {"model": '<img id="pwn" src="x"><b id="pwn2">bold</b>\x1b[2J', "dataset": "<script>x</script>"}}
ANSWERS = {"dkb_chainId": "dekube-test", "dkb_blockNumber": 30, "dkb_listTasks": [HOSTILE],
           "dkb_getValidators": {"height": 30, "epoch_start": 1, "total_power": 1,
                                 "validators": [{"peer_id": V1, "power": 1}], "candidates": []},
           "dkb_peers": [], "dkb_listNodes": NODES,
           "dkb_getTask": {"task_id": TASK, "status": "running", "owner": V1, "price": 1000, "escrow": 1000,
                           "spec": {"model": "mlp", "dataset": "digits"}, "workers": [C1, C2]}}


def reply(route, call: dict, result=None, error=None, cors=False) -> None:
    body = {"jsonrpc": "2.0", "id": call["id"], **({"error": error} if error else {"result": result})}
    headers = {"Access-Control-Allow-Origin": BASE} if cors else {}
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body), headers=headers)


def handle_explorer(route, request):
    if request.method == "POST":
        call = json.loads(request.post_data)
        method, params = call["method"], call.get("params") or []
        if method == "dkb_getBlockByNumber":
            return reply(route, call, block(params[0]))
        if method == "dkb_getNode":
            return reply(route, call, next((n for n in NODES if n["peer_id"] == params[0]), None))
        if method in ANSWERS:
            return reply(route, call, ANSWERS[method])
        return reply(route, call, error={"code": -32601, "message": "method not found"})
    name = request.url[len(BASE):].split("?")[0].removeprefix("/explorer/") or "index.html"
    file = STATIC / name
    if not file.is_file():
        return route.fulfill(status=404, body="")
    return route.fulfill(status=200, content_type=TYPES[file.suffix], body=file.read_text())


def handle_evil(route, request):
    """A node the link names: answers, with CORS, as a peer that is no worker of the task."""
    if request.method == "OPTIONS":
        return route.fulfill(status=204, headers={"Access-Control-Allow-Origin": BASE,
                                                  "Access-Control-Allow-Methods": "POST",
                                                  "Access-Control-Allow-Headers": "Content-Type"})
    if request.method != "POST":
        return route.fulfill(status=404, body="", headers={"Access-Control-Allow-Origin": BASE})
    call = json.loads(request.post_data)
    if call["method"] == "dkb_peerId":
        return reply(route, call, ATTACKER, cors=True)
    if call["method"] == "dkb_taskProgress":
        return reply(route, call, {"state": "training", "step": 3, "steps": 10, "loss": 0.01,
                                   "history": [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.05}]}, cors=True)
    return reply(route, call, error={"code": -32601, "message": "method not found"}, cors=True)


@pytest.fixture
def page():
    with browser_page() as tab:
        tab.route(f"{BASE}/**", handle_explorer)
        tab.route(f"{EVIL}/**", handle_evil)
        tab.route(f"{DOWN}/**", lambda route, request: route.abort())
        yield tab


def test_every_registered_node_and_folded_empty_blocks(page):
    page.goto(f"{BASE}/explorer/")
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    rows = page.locator("#node-rows tr")
    assert rows.count() == 6, page.inner_text("#node-rows")
    assert {rows.nth(i).get_attribute("data-peer") for i in range(6)} == {n["peer_id"] for n in NODES}
    blocks = page.locator("#block-rows tr")   # 30..26 empty, 25 with a transaction, 24..11 empty
    assert blocks.count() == 3, page.inner_text("#block-rows")
    assert blocks.nth(0).get_attribute("data-heights") == "26-30" and "5 empty blocks" in blocks.nth(0).inner_text()
    assert blocks.nth(1).get_attribute("data-height") == "25"
    assert blocks.nth(2).get_attribute("data-heights") == "11-24" and "14 empty blocks" in blocks.nth(2).inner_text()
    assert page.locator("#sources").is_hidden()   # no other node in the link: nothing to attribute
    row = page.inner_text(f'tr[data-task="{HOSTILE["task_id"]}"]')
    assert '<img id="pwn" src="x">' in row and "<script>x</script>" in row
    assert page.locator("#pwn, #pwn2, #task-rows script").count() == 0
    assert not page.errors, page.errors


def test_the_page_never_parses_text_as_html():
    for name in ("app.js", "chart.js"):
        code = (STATIC / name).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in code, f"{name} uses {sink}"


def test_listed_nodes_are_named_as_sources_and_unreachable_ones_say_why(page):
    page.goto(f"{BASE}/explorer/?nodes={EVIL},{DOWN}#task/{TASK}")
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    banner = page.inner_text("#sources")
    assert "not by this node or the chain" in banner and EVIL in banner and DOWN in banner
    page.wait_for_selector(f'ul.sources li[data-source="{EVIL}"]', timeout=15_000)
    evil = page.inner_text(f'ul.sources li[data-source="{EVIL}"]')
    assert "evil.test" in evil and ATTACKER in evil and "NOT a worker of this task" in evil
    page.wait_for_selector(f'ul.sources li.unreachable[data-source="{DOWN}"]', timeout=15_000)
    down = page.inner_text(f'ul.sources li.unreachable[data-source="{DOWN}"]')
    assert "down.test" in down and "cors" in down and "allowed_origins" in down and BASE in down
    assert "@ evil.test" in page.inner_text("#task-curves .legend")
    assert not page.errors, page.errors
