"""Helpers for the explorer and metrics tests: a running Node on 127.0.0.1, a headless Chromium page
for the pages' tests against a stubbed JSON-RPC, and a /metrics linter."""
import contextlib
import re
import shutil
import subprocess

from tests.node import node_harness

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@contextlib.asynccontextmanager
async def running_node(roles=("relay",), **rpc_overrides):
    """A Node with ``roles`` (names, e.g. the real relay role) and an aiohttp session on its HTTP server."""
    async with node_harness.running_node(roles, **rpc_overrides) as pair:
        yield pair


@contextlib.contextmanager
def browser_page():
    """A page of Debian's headless Chromium through Playwright (``page.errors`` collects the page's
    errors), or a skip with the reason where either is missing."""
    import pytest
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            page.errors = []
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            yield page
        finally:
            browser.close()


def lint_metrics(text: str) -> list[str]:
    """Problems in a /metrics page: prometheus_client's parser must accept it; every family has HELP
    and TYPE; counters end in _total; names are classic; no series appears twice. Plus `promtool
    check metrics` (Debian's prometheus package) when it is installed."""
    from prometheus_client.parser import text_string_to_metric_families

    problems: list[str] = []
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, kind in types.items():
        if name not in helps:
            problems.append(f"{name}: TYPE without HELP")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: counter name does not end in _total")
        if not METRIC_NAME.fullmatch(name):
            problems.append(f"{name}: not a classic metric name")
    seen: set = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                problems.append(f"duplicate series {key}")
            seen.add(key)
            if not sample.name.startswith(family.name):
                problems.append(f"sample {sample.name} outside its family {family.name}")
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[^{ ]+", line).group(0)
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if name not in types and base not in types and not any(name.startswith(t) for t in types):
                problems.append(f"{name}: sample without TYPE")
    promtool = shutil.which("promtool")
    if promtool:
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            problems.append(f"promtool: {done.stdout.strip()} {done.stderr.strip()}")
    return problems
