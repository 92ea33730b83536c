"""The provider dashboard in headless Chromium (Playwright, Debian's chromium; ADRs 0195, 0198), as a
provider would use it: the node joins (registered), a task arrives and shows its progress, its payout
appears in the earnings and the curve, the pause button pauses and resumes the node, the limits form
sets the node's limits, a slash shows its reason and a link to the explorer's evidence, a stake too
small for the network's tasks is said with what to do, the log tail shows what the node did, all with
no console error under the page's CSP. A page of another origin cannot press a button even knowing the
token. Screenshots of each step go under $DEKUBE_ARTIFACTS (default tests/provide/artifacts/), the CI
artifact folder. The ledger is scripted (tests/provide/test_provide_flow.py runs the real join against
a dev chain)."""
import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from node.identity import Identity
from node.runtime import Node
from tests.explorer.test_explorer_browser import browser  # noqa: F401  (the shared Chromium fixture)
from tests.node.node_harness import local_config

pytestmark = pytest.mark.timeout(120)
ARTIFACTS = Path(os.environ.get("DEKUBE_ARTIFACTS") or Path(__file__).parent / "artifacts")
OTHER = Identity.generate().peer_id
TASK = "bb" * 32
SLASHED = "cc" * 32


class ScriptedLedger:
    """The ledger as the compute role's dashboard section reads it, moved on by the test: ``stage`` is
    joined, assigned, paid or slashed."""

    available = False   # the role's loop idles; only the dashboard reads

    def __init__(self, me):
        self.me, self.stage = me, "joined"

    async def call(self, method, *params):
        paid = self.stage in ("paid", "slashed")
        if method == "dkb_getStake":
            return {"bonded": 28_330, "unbonding": [], "slashed": 2_833 if self.stage == "slashed" else 0}
        if method == "dkb_getBlockByNumber":
            return {"height": 40, "time_ms": int(time.time() * 1000)}
        if method == "dkb_getParams":
            return {"min_worker_stake": 100, "min_verifier_stake": 100}
        if method == "dkb_listTasks":
            tasks = []
            if self.stage != "joined":
                tasks.append({"task_id": TASK, "status": "paid" if paid else "running", "assigned_height": 7,
                              "workers": [self.me, OTHER], "payouts": {self.me: 2_500, OTHER: 2_500} if paid else {},
                              "slots": [{"slot": 0, "worker": self.me, "segment": 1, "outcome": "ok",
                                         "verdict": {"match": True, "evidence": "aa" * 32},
                                         "verifiers": [], "referees": []}] if paid else []})
            if self.stage == "slashed":
                tasks.append({"task_id": SLASHED, "status": "paid", "assigned_height": 9, "workers": [self.me],
                              "price": 1_000_000, "spec": {"workers": 1},
                              "payouts": {OTHER: 50}, "slots": [
                                  {"slot": 0, "worker": self.me, "segment": 3, "outcome": "guilty",
                                   "verdict": {"match": False, "evidence": "dd" * 32},
                                   "verifiers": [], "referees": []}]})
            return tasks
        raise AssertionError(method)

    async def balance(self, peer):
        return 1234 + (2_500 if self.stage in ("paid", "slashed") else 0)

    def describe(self):
        return "http://validator.test"


@pytest.fixture
def provider():
    """A compute node on an ephemeral port in a thread, reading a scripted ledger."""
    ready, holder = threading.Event(), {}

    async def serve():
        node = Node(local_config(), Identity.generate(), ["compute"])
        node.role("compute").ledger = ScriptedLedger(node.peer_id)
        holder["node"], holder["loop"] = node, asyncio.get_running_loop()
        task = asyncio.create_task(node.run())
        await node.ready.wait()
        ready.set()
        await task

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(20), "the node did not start"
    yield holder["node"], holder["loop"]
    holder["loop"].call_soon_threadsafe(holder["node"].request_stop)
    thread.join(20)


def on_loop(loop, fn):
    """Run ``fn`` on the node's event loop (the role's state is the loop's) and wait for it."""
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (fn(), done.set()))
    assert done.wait(5)


def shows(page, selector, text, timeout=15_000):
    page.wait_for_function("([s, t]) => document.querySelector(s).textContent.includes(t)", arg=[selector, text],
                           timeout=timeout)


def snap(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def test_a_provider_uses_the_dashboard_in_chromium(browser, provider):  # noqa: F811
    node, loop = provider
    compute = node.role("compute")
    ledger = compute.ledger
    page = browser.new_page()
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(node.http.url + "/")

    shows(page, "#status", "registerednot yet")   # joined, registration under way
    on_loop(loop, lambda: setattr(compute, "registered", True))
    shows(page, "#status", "registeredyes")
    shows(page, "#earnings", "28330")   # bonded
    snap(page, "1-joined")

    ledger.stage = "assigned"           # a task arrives and trains
    on_loop(loop, lambda: compute.board.start(TASK, workers=[node.peer_id, OTHER]))
    on_loop(loop, lambda: compute.board.update(TASK, state="training", step=4, steps=10, loss=0.75))
    shows(page, "#task", TASK)
    shows(page, "#task", "4 / 10")
    shows(page, "#task", "busy computing—")   # no compute figure yet
    on_loop(loop, lambda: compute.board.update(TASK, utilization=0.9512))
    shows(page, "#task", "busy computing95.1% of its training time")
    snap(page, "2-task-progress")

    on_loop(loop, lambda: compute.board.update(TASK, state="committed", step=10))
    ledger.stage = "paid"               # its payout
    shows(page, "#payouts", "2500")
    shows(page, "#audits", "audited")
    page.wait_for_function("() => document.querySelector('#earnings-curve polyline') !== null", timeout=10_000)
    shows(page, "#task", "none")
    snap(page, "3-paid")

    page.click("#pause")
    shows(page, "#pause", "Resume")
    assert compute.paused is True
    shows(page, "#status", "taking taskspaused")
    snap(page, "4-paused")
    page.click("#pause")
    shows(page, "#pause", "Pause")
    assert compute.paused is False

    page.fill("#limit-hours", "22-7")
    page.fill("#limit-max-task", "3600")
    page.fill("#limit-memory", "4000")
    page.click("#save-limits")
    shows(page, "#limits-said", "saved")
    shows(page, "#limits", "22-7")
    shows(page, "#limits", "4000")
    assert compute.limits.current.hours == "22-7" and compute.limits.current.max_task_s == 3600
    assert compute.limits.current.memory_mb == 4000 and compute.limits.current.cpu_cores == 0
    page.fill("#limit-hours", "99-1")
    page.click("#save-limits")
    shows(page, "#limits-said", "hours must be like 22-7")
    assert compute.limits.current.hours == "22-7"
    assert errors == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    errors.clear()   # Chromium logs the refused save; nothing else may fail

    ledger.stage = "slashed"            # a slash, with its reason and the explorer's evidence
    shows(page, "#slashes", "segment 3 did not replay")
    assert page.get_attribute("#slashes a", "href") == f"/explorer/#task/{SLASHED}"
    shows(page, "#earnings", "2833")    # slashed total
    shows(page, "#problems", "too little stake for the network's tasks")   # a big task came by: bond more
    shows(page, "#log", "compute paused from the dashboard")
    snap(page, "5-slashed")
    assert errors == []

    other = browser.new_page()   # another origin (an opaque one), even given the token
    other.goto("about:blank")
    statuses = other.evaluate("""async ([base, token]) => {
        const out = [];
        for (const [path, body] of [["/dashboard/pause", {paused: true}], ["/dashboard/limits", {hours: "1-2"}]]) {
          try {
            const r = await fetch(base + path, {method: "POST", headers: {"Content-Type": "application/json",
                                  "X-Dekube-Token": token}, body: JSON.stringify(body)});
            out.push(r.status);
          } catch (e) { out.push("blocked: " + e); }
        }
        return out;
      }""", [node.http.url, node.dashboard.token])
    assert 200 not in statuses and compute.paused is False and compute.limits.current.hours == "22-7", statuses
