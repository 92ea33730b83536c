"""The explorer's model coverage view (ADR 0174) in headless Chromium, against a stubbed JSON-RPC: the
served ranges announced in node records are drawn per block, a gap is flagged, and the weakest
block's summed tokens/s is shown; no console errors."""
import json
import shutil
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "node" / "explorer" / "static"
BASE = "http://explorer.test"


def served(model: str, start: int, end: int, tokens_per_s: int) -> dict:
    return {"model": model, "start": start, "end": end, "tokens_per_s": tokens_per_s, "profile": "", "price": 1}


def record(letter: str, *ranges: dict) -> dict:
    return {"peer_id": "12D3KooW" + letter * 44, "roles": ["compute"], "hardware": {"serving": list(ranges)}}


SERVING = [record("A", served("random:12x768@1", 0, 4, 30)),
           record("B", served("random:12x768@1", 2, 8, 20), served("char", 0, 3, 5)),
           record("C", served("random:12x768@1", 9, 12, 40))]
ANSWERS = {"dkb_chainId": "dekube-test", "dkb_blockNumber": 0, "dkb_getBlockByNumber": None, "dkb_listTasks": [],
           "dkb_getValidators": {"height": 1, "epoch_start": 1, "total_power": 0, "validators": [], "candidates": []},
           "dkb_peers": [], "dkb_listNodes": SERVING}
TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css"}


def test_model_coverage_shows_blocks_gaps_and_the_weakest_block():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary")

    def handle(route, request):
        path = request.url[len(BASE):].split("?")[0]
        if request.method == "POST":
            call = json.loads(request.post_data)
            if call["method"] in ANSWERS:
                body = {"jsonrpc": "2.0", "id": call["id"], "result": ANSWERS[call["method"]]}
            else:
                body = {"jsonrpc": "2.0", "id": call["id"], "result": None}
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
        name = path.removeprefix("/explorer/") or "index.html"
        file = STATIC / name
        if not file.is_file():
            return route.fulfill(status=404, body="")
        return route.fulfill(status=200, content_type=TYPES[file.suffix], body=file.read_text())

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.route(f"{BASE}/**", handle)
            page.goto(f"{BASE}/explorer/")
            page.wait_for_selector('tr[data-model="random:12x768@1"]', timeout=15_000)
            row = page.locator('tr[data-model="random:12x768@1"] td')
            blocks = row.nth(2).locator("span.block")
            assert blocks.count() == 12
            assert [blocks.nth(i).inner_text() for i in range(12)] == ["1", "1", "2", "2", "1", "1", "1", "1", "0",
                                                                      "1", "1", "1"]
            assert row.nth(2).locator("span.gap").count() == 1 and row.nth(3).inner_text() == "gap"
            char = page.locator('tr[data-model="char"] td')
            assert char.nth(1).inner_text() == "0:3" and char.nth(3).inner_text() == "5 tokens/s"
            assert not errors, errors
        finally:
            browser.close()
