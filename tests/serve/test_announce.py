"""Serving announcements (ADR 0174): node records -> servers to chain, coverage for choosing blocks."""
import pytest

from ml.serve.announce import announced_servers, coverage, own_throughput, served_range
from ml.serve.balance import choose_blocks
from ml.serve.client import ServerInfo
from ml.serve.model import random_decoder
from ml.serve.server import BlockServer
from tests.serve.test_generation import CONFIG, SEED


def record(peer: str, *ranges, model="m", addrs=("/ip4/10.0.0.1/tcp/1",)):
    return {"peer_id": peer, "listen_addrs": list(addrs), "relay_addrs": [],
            "hardware": {"cpu_cores": 1, "serving": [served_range(model, a, b, 10 * (a + 1), "p", 1)
                                                     for a, b in ranges]}}


def test_announced_servers_keep_the_models_valid_ranges():
    nodes = [record("a", (0, 2)), record("b", (2, 6), (0, 1)), record("c", (0, 6), model="other"),
             record("me", (2, 4)), {"peer_id": "d", "hardware": {"serving": [{"model": "m", "start": 3, "end": 99}]}},
             "junk", {"peer_id": 5}]
    found = announced_servers(nodes, "m", 6, exclude="me")
    assert [a.server for a in found] == [ServerInfo("a", 0, 2, "p"), ServerInfo("b", 2, 6, "p"),
                                         ServerInfo("b", 0, 1, "p")]   # with the profile announced (ADR 0179)
    assert found[0].addrs == ("/ip4/10.0.0.1/tcp/1",) and found[1].tokens_per_s == 30
    assert coverage(found) == [(0, 2, 10.0), (2, 6, 30.0), (0, 1, 10.0)]
    assert announced_servers("not a list", "m", 6) == []


def test_a_joining_server_fills_the_gap_the_ledger_shows():
    found = announced_servers([record("a", (0, 2)), record("b", (4, 6))], "m", 6)
    assert choose_blocks(6, 2, coverage(found)) == (2, 4)


def test_served_range_is_bounded_and_own_throughput_is_measured():
    assert served_range("m", 0, 2, 1e12, "p", 0)["tokens_per_s"] == 10**9
    with pytest.raises(ValueError):
        served_range("m", 2, 2, 1.0, "p", 0)
    assert own_throughput(BlockServer(random_decoder(CONFIG, SEED, (0, 2), False)), repeats=1) > 0
