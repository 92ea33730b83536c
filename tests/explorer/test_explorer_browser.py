"""The explorer in headless Chromium (Debian's chromium driven by Playwright) against a devnet of
2 validators and 2 compute nodes: the page renders blocks, validators and nodes from a validator's
RPC, updates live over the websocket, and draws a task's training curve (from the compute nodes'
dkb_taskProgress) while the task trains, and a task's audit slots (verifiers' answers, a dispute,
referees' votes, outcomes; a task document the page's RPC read is answered with); no console
errors under the page's strict CSP. Saves screenshots under
$DEKUBE_ARTIFACTS (default tests/explorer/artifacts/), the CI artifact folder.
"""
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from consensus.state.tasks import task_id_for
from consensus.tx import build_tx
from node.ledger import jsonrpc

pytestmark = pytest.mark.timeout(300)

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]
ARTIFACTS = Path(os.environ.get("DEKUBE_ARTIFACTS") or Path(__file__).parent / "artifacts")
ACTIVE = {"created", "assigned", "running"}
POINTS = """() => { const path = document.querySelector('#curve-loss path.series');
                   return path ? path.getAttribute('d').split('L').length : 0; }"""


FAKE_TASK = "ab" * 32
W1, W2, V1, V2, R1, OWNER = ("12D3KooW" + c * 44 for c in "abcdef")
SLOTTED_TASK = {
    "task_id": FAKE_TASK, "status": "paid", "owner": OWNER, "price": 100_000, "escrow": 0, "block_time_ms": 60_000,
    "spec": {"model": "digits-mlp", "dataset": "digits", "codec": "int8", "hyperparams": {"steps": 20}},
    "workers": [W1, W2], "commits": {W1: ["aa" * 32, "cc" * 32, 4, 30], W2: ["bb" * 32, "cc" * 32, 4, 31]},
    "created_height": 10, "assigned_height": 12, "profile": "cpu-x86-64-avx2/torch-2.13.0", "segments": 4,
    "slots": [
        {"slot": 0, "worker": W1, "segment": 3, "salt": "00" * 32, "outcome": "ok",
         "verifiers": [{"verifier": V1, "deadline": 80_000, "redraw": False,
                        "answer": {"match": True, "evidence": "e1" * 32, "step": 0}}],
         "dispute_deadline": 0, "dispute": None, "referees": [], "referee_deadline": 0,
         "verdict": {"match": True, "evidence": "e1" * 32}},
        {"slot": 1, "worker": W2, "segment": 1, "salt": "01" * 32, "outcome": "guilty",
         "verifiers": [{"verifier": V1, "deadline": 80_000, "redraw": False, "answer": None},   # block times
                       {"verifier": V2, "deadline": 90_000, "redraw": True,
                        "answer": {"match": False, "evidence": "e2" * 32, "step": 2}}],
         "dispute_deadline": 100_000, "dispute": {"height": 95}, "referee_deadline": 140_000,
         "referees": [{"referee": R1, "vote": {"match": False, "evidence": "e2" * 32}}],
         "verdict": {"match": False, "evidence": "e2" * 32}},
    ],
    "payouts": {W1: 42_500, V1: 2_500, R1: 2_500, OWNER: 52_500}, "relay_claims": {}, "result": "cc" * 32,
}


def answer_slotted_task(route) -> None:
    """The page's RPC reads pass through, except dkb_getTask of FAKE_TASK: answered with SLOTTED_TASK."""
    body = json.loads(route.request.post_data or "{}")
    if route.request.method == "POST" and body.get("method") == "dkb_getTask" and body.get("params") == [FAKE_TASK]:
        route.fulfill(status=200, content_type="application/json",
                      body=json.dumps({"jsonrpc": "2.0", "id": body.get("id"), "result": SLOTTED_TASK}))
    else:
        route.continue_()


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium binary (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    from devtools.devnet import ComputeDevnet

    # as `testnet up --compute` makes it: the compute nodes answer the validators' explorer origin
    net = ComputeDevnet.create(tmp_path_factory.mktemp("devnet"), validators=2, compute=2)
    try:
        net.up(timeout=150)
        yield net
    finally:
        net.down(timeout=5)


def submit_task(net) -> str:
    from ml.compute.task_spec import submit_payload
    from ml.train.spec import TrainSpec

    spec = TrainSpec(codec="int8", steps=3000, segment_steps=500, report_every=5)
    faucet = net.testnet.faucet()
    nonce = jsonrpc.call(net.rpc_url, "dkb_getTransactionCount", faucet.peer_id, "pending")
    from ml.profiles import default_profile

    payload = submit_payload(spec, 2, 100_000, default_profile("cpu"))
    tx = build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", payload)
    jsonrpc.call(net.rpc_url, "dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(faucet.peer_id, nonce).hex()


def wait_until(page, expression: str, timeout: float) -> None:
    """Poll a JS expression (page.wait_for_function evals inside the page, which its CSP forbids)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expression}")
        time.sleep(0.2)


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page, errors


def test_explorer_renders_chain_and_live_training_curve(browser, devnet):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = devnet.explorer_url()   # the link `testnet up` prints
    page, errors = open_page(browser, base)
    page.wait_for_selector("#block-rows tr", timeout=20_000)
    page.wait_for_selector("#validator-rows tr", timeout=20_000)
    wait_until(page, "document.querySelectorAll('#node-rows tr').length >= 4", 30)   # 2 validators, 2 compute
    assert page.inner_text("#chain-id") == devnet.testnet.chain_id
    assert page.inner_text("#live") == "websocket"
    first = int(page.inner_text("#height").replace(",", ""))
    wait_until(page, f"Number(document.getElementById('height').textContent.replace(/,/g, '')) > {first}",
               20)   # live: a new head arrived over the websocket
    assert "compute" in page.inner_text("#node-rows")
    wait_until(page, "document.querySelectorAll('#relay-local p').length === 3", 20)   # own + 2 listed nodes

    task_id = submit_task(devnet)
    page.wait_for_selector(f"tr[data-task='{task_id}']", timeout=30_000)   # the tasks event refreshed the list
    page.evaluate(f"location.hash = '#task/{task_id}'")
    deadline = time.monotonic() + 180
    curve_seen_while = None
    while time.monotonic() < deadline:
        status = jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)["status"]
        points = page.evaluate(POINTS)
        if points >= 2 and status in ACTIVE:
            curve_seen_while = status
            break
        assert status in ACTIVE, f"task ended ({status}) before the page showed its curve"
        time.sleep(0.5)
    assert curve_seen_while, "no training curve appeared while the task trained"
    page.screenshot(path=str(ARTIFACTS / "explorer-task-early.png"), full_page=True)
    # a fuller curve for the docs: up to 20 s more, while the task is still training
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and page.evaluate(POINTS) < 60:
        time.sleep(0.5)
    page.screenshot(path=str(ARTIFACTS / "explorer-task.png"), full_page=True)
    assert page.locator("#task-worker-rows tr").count() == 2
    page.evaluate("location.hash = ''")
    page.wait_for_selector("#detail", state="hidden")
    page.screenshot(path=str(ARTIFACTS / "explorer-overview.png"), full_page=True)
    page.evaluate(f"location.hash = '#block/{first}'")
    page.wait_for_selector("#block-tx-rows", state="attached", timeout=10_000)
    assert page.inner_text("#detail h2") == f"Block {first}"
    # a task's audit slots: each slot's worker, segment, verifiers' answers, dispute, referees, outcome
    page.route(f"{devnet.rpc_url}/", answer_slotted_task)
    page.evaluate(f"location.hash = '#task/{FAKE_TASK}'")
    page.wait_for_selector("#task-slot-rows tr", timeout=10_000)
    rows = page.locator("#task-slot-rows tr")
    assert rows.count() == 2
    ok, guilty = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert "match" in ok and "mismatch" not in ok and ok.rstrip().endswith("ok"), ok
    for text in ("mismatch", "from step 2", "no answer (due in 20s)", "(redrawn)", "disputed @95", "guilty"):
        assert text in guilty, (text, guilty)
    assert "audit slots (2)" in page.inner_text("#task-body") and "audited (2/2)" in page.inner_text("#task-body")
    assert page.locator("#task-worker-rows .badge.guilty").count() == 1
    page.screenshot(path=str(ARTIFACTS / "explorer-task-slots.png"), full_page=True)
    page.unroute(f"{devnet.rpc_url}/")
    assert errors == [], errors
    page.close()
