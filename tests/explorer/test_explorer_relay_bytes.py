"""The explorer's task page shows the bytes a task's circuits carried through relays (ADR 0223, issue 25
item 4): per worker in the workers table and per relay with the total, from ``dkb_getTask``'s
``relay_bytes`` (the workers' reports at commit); a task with none says so. Headless Chromium against a
stubbed JSON-RPC, as test_explorer_frictions."""
import json
from pathlib import Path

import pytest

from tests.explorer.harness import browser_page

STATIC = Path(__file__).resolve().parents[2] / "node" / "explorer" / "static"
BASE = "http://explorer.test"
TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css"}
V1, R1, R2, W1, W2, W3 = ("12D3KooW" + c * 44 for c in "VRSABC")
RELAYED, DIRECT = "ab" * 32, "cd" * 32
MIB = 1 << 20


def task(task_id: str, relay_bytes: dict) -> dict:
    return {"task_id": task_id, "status": "running", "owner": V1, "price": 1000, "escrow": 1000, "created_height": 3,
            "spec": {"model": "mlp", "dataset": "digits"}, "workers": [W1, W2, W3],
            "commits": {W1: ["aa" * 32, "cc" * 32, 4, 20], W2: ["bb" * 32, "cc" * 32, 4, 21]},
            "relay_claims": {}, "relay_bytes": relay_bytes}


TASKS = {RELAYED: task(RELAYED, {W1: {R1: 3 * MIB, R2: MIB // 2}, W2: {R1: MIB, R2: "junk"}}),
         DIRECT: task(DIRECT, {})}
ANSWERS = {"dkb_chainId": "dekube-test", "dkb_blockNumber": 30, "dkb_listTasks": list(TASKS.values()),
           "dkb_getValidators": {"height": 30, "epoch_start": 1, "total_power": 1,
                                 "validators": [{"peer_id": V1, "power": 1}], "candidates": []},
           "dkb_peers": [], "dkb_listNodes": []}


def handle(route, request):
    if request.method == "POST":
        call = json.loads(request.post_data)
        method, params = call["method"], call.get("params") or []
        if method == "dkb_getTask":
            result = TASKS.get(params[0])
        elif method == "dkb_getBlockByNumber":
            result = {"height": params[0], "time_ms": 1_700_000_000_000, "transactions": [], "proposer": V1,
                      "hash": f"{params[0]:064x}", "commit": []}
        elif method in ANSWERS:
            result = ANSWERS[method]
        else:
            body = {"jsonrpc": "2.0", "id": call["id"], "error": {"code": -32601, "message": "method not found"}}
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
        body = {"jsonrpc": "2.0", "id": call["id"], "result": result}
        return route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
    file = STATIC / (request.url[len(BASE):].split("?")[0].removeprefix("/explorer/") or "index.html")
    if not file.is_file():
        return route.fulfill(status=404, body="")
    return route.fulfill(status=200, content_type=TYPES[file.suffix], body=file.read_text())


@pytest.fixture
def page():
    with browser_page() as tab:
        tab.route(f"{BASE}/**", handle)
        yield tab


def show(page, task_id: str) -> None:
    page.goto(f"{BASE}/explorer/#task/{task_id}")
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    page.wait_for_selector("#task-relay-bytes", timeout=10_000)


def test_task_page_shows_relay_bytes_per_worker_and_per_relay(page):
    show(page, RELAYED)
    line = page.inner_text("#task-relay-bytes")
    assert line.startswith("4.5 MiB through relays"), line               # 3 + 0.5 + 1 MiB; "junk" left out
    assert "12D3KooW…RRRRRR: 4.0 MiB" in line and "12D3KooW…SSSSSS: 512.0 KiB" in line, line
    rows = page.locator("#task-worker-rows tr")
    cells = [rows.nth(i).locator("td").nth(4).inner_text() for i in range(3)]
    assert cells == ["3.5 MiB", "1.0 MiB", "–"], cells                     # W3 reported nothing
    assert not page.errors, page.errors


def test_a_task_without_reports_says_none(page):
    show(page, DIRECT)
    assert page.inner_text("#task-relay-bytes") == "none reported (all direct, or no commit yet)"
    assert not page.errors, page.errors
