"""/metrics of a running node passes `promtool check metrics` (when installed) and the name rules:
counters end in _total, HELP/TYPE everywhere, no duplicate series; the names the Grafana dashboard
queries are exported."""
import asyncio
import json
import re
from pathlib import Path

import pytest
from harness import lint_metrics, running_node

from consensus.validator.metrics import ConsensusMetrics
from node.metrics import Registry

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dekube.json"


def test_node_metrics_page_lints_clean():
    async def scenario():
        async with running_node() as (node, http):
            async with http.get("/health") as resp:
                assert resp.status == 200
            async with http.get("/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return await resp.text()

    text = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert lint_metrics(text) == []
    for name in ("process_start_time_seconds", "process_resident_memory_bytes", "python_gc_collections_total",
                 "dekube_p2p_connections", "dekube_p2p_bytes_sent_total", "dekube_relay_bytes_total",
                 "dekube_http_requests_total", "dekube_ledger_txs_sent_total"):
        assert re.search(rf"^# TYPE {name} ", text, re.M), name
    assert 'dekube_p2p_connections{direction="inbound",path="relayed"} 0.0' in text


def test_lint_catches_bad_pages():
    assert any("_total" in p for p in lint_metrics("# HELP x_count c\n# TYPE x_count counter\nx_count 1\n"))
    assert any("duplicate" in p for p in lint_metrics("# HELP g g\n# TYPE g gauge\ng 1\ng 2\n"))
    assert any("HELP" in p for p in lint_metrics("# TYPE g gauge\ng 1\n"))


def test_consensus_metrics_count_missed_blocks_and_intervals():
    reg = Registry(process=False)
    metrics = ConsensusMetrics(reg, lambda: 7, lambda: 3)
    metrics.on_commit(1, 0, 2, ["a", "b", "c"], ["a", "b", "c"], now=100.0)
    metrics.on_commit(2, 2, 0, ["a", "b", "c"], ["a", "c"], now=101.5)
    assert reg.sample("dekube_consensus_missed_blocks_total", validator="b") == 1
    assert reg.sample("dekube_consensus_missed_blocks_total", validator="a") is None
    assert reg.sample("dekube_consensus_block_interval_seconds_count") == 1
    assert reg.sample("dekube_consensus_block_interval_seconds_sum") == 1.5
    assert reg.sample("dekube_consensus_rounds") == 3
    assert reg.sample("dekube_consensus_block_txs_total") == 2
    assert reg.sample("dekube_consensus_height") == 7 and reg.sample("dekube_mempool_txs") == 3
    assert lint_metrics(reg.render()) == []


def test_grafana_dashboard_queries_exported_names():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    names = {n for e in exprs for n in re.findall(r"\b((?:dekube|process|python)_[a-z0-9_]+)", e)}
    source = "\n".join(p.read_text() for root in ("node", "consensus", "relay", "ml")
                       for p in (DASHBOARD.parents[2] / root).rglob("*.py"))
    for name in names:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base.startswith(("process_", "python_")):
            continue
        assert f'"{base}"' in source, f"dashboard queries {name}, which no code exports"


@pytest.mark.skipif(not __import__("shutil").which("promtool"), reason="promtool not installed (Debian: prometheus)")
def test_promtool_present_is_used():
    assert any("promtool" in p for p in lint_metrics("# HELP bad_x bad\n# TYPE bad_x counter\nbad_x 1\n"))
