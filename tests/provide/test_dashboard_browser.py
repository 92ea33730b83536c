"""The provider dashboard in headless Chromium (Playwright, Debian's chromium; docs/adr/0195): the page
shows the compute node's wallet, payouts and slashes with no console error under its CSP, its pause
button pauses and resumes the node, and a page of another origin cannot press it even knowing the
token. Saves a screenshot under $DEKUBE_ARTIFACTS (default tests/provide/artifacts/)."""
import asyncio
import os
import threading
from pathlib import Path

import pytest

from node.identity import Identity
from node.runtime import Node
from tests.explorer.test_explorer_browser import browser  # noqa: F401  (the shared Chromium fixture)
from tests.node.node_harness import local_config
from tests.provide.test_dashboard import DashboardLedger

pytestmark = pytest.mark.timeout(120)
ARTIFACTS = Path(os.environ.get("DEKUBE_ARTIFACTS") or Path(__file__).parent / "artifacts")


@pytest.fixture
def provider():
    """A compute node on an ephemeral port in a thread, reading a fake ledger."""
    ready, holder = threading.Event(), {}

    async def serve():
        node = Node(local_config(), Identity.generate(), ["compute"])
        node.role("compute").ledger = DashboardLedger(node.peer_id)
        holder["node"], holder["loop"] = node, asyncio.get_running_loop()
        task = asyncio.create_task(node.run())
        await node.ready.wait()
        ready.set()
        await task

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(20), "the node did not start"
    yield holder["node"]
    holder["loop"].call_soon_threadsafe(holder["node"].request_stop)
    thread.join(20)


def test_dashboard_pause_in_chromium(browser, provider):  # noqa: F811
    compute = provider.role("compute")
    page = browser.new_page()
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(provider.http.url + "/")
    page.wait_for_function("() => document.getElementById('earnings').textContent.includes('1234')", timeout=15_000)
    assert "segment 3 did not replay" in page.text_content("#slashes")
    assert "40" in page.text_content("#payouts")
    page.click("#pause")
    page.wait_for_function("() => document.getElementById('pause').textContent.startsWith('Resume')", timeout=10_000)
    assert compute.paused is True
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-paused.png"), full_page=True)
    page.click("#pause")
    page.wait_for_function("() => document.getElementById('pause').textContent.startsWith('Pause')", timeout=10_000)
    assert compute.paused is False and errors == []

    other = browser.new_page()   # another origin (an opaque one), even given the token
    other.goto("about:blank")
    status = other.evaluate("""async ([url, token]) => {
        try {
          const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json",
                                "X-Dekube-Token": token}, body: JSON.stringify({paused: true})});
          return r.status;
        } catch (e) { return "blocked: " + e; }
      }""", [provider.http.url + "/dashboard/pause", provider.dashboard.token])
    assert status != 200 and compute.paused is False, status
