"""Training over NAT'd, shaped home links (devtools/netlab/train_net.py, the crew of
bench/training_netlab.py): three real Nodes in homes behind eim, eim and symmetric NATs at 25 Mbit/s,
each running the compute node's all-reduce group and trainer, train streaming DiLoCo int4 and
data-parallel fp32 to the end and finish with the same weights (slow: about a minute).
"""
from __future__ import annotations

import math

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.train_net import settle, start_crew, train
from ml.train.recipes import recipe

pytestmark = [pytest.mark.netlab, pytest.mark.slow]


@pytest.fixture(scope="module")
def crew():
    why = unavailable()
    if why:
        pytest.skip(why)
    net, nodes = start_crew(3, 25.0)
    try:
        circuits, paths = settle(nodes)
        yield nodes, circuits, paths
    finally:
        net.close()


def test_every_pair_of_the_crew_has_a_path_and_the_eim_pair_is_direct(crew):
    """The pairs with the symmetric home punch direct or stay relayed depending on the mappings the NAT
    hands out (birthday probing, QUIC; bench/nat_matrix.py measures which): the crew trains either way."""
    _, _, paths = crew
    assert set(paths) == {"a-b", "a-c", "b-c"} and paths["a-b"] == ["direct"]
    assert all(path and set(path) <= {"direct", "relayed"} for path in paths.values()), paths


@pytest.mark.parametrize("spec", [
    recipe("digits-streaming", steps=40, warmup_steps=20, report_every=40),
    recipe("digits-data-parallel", steps=20, report_every=20),
], ids=["streaming-int4", "data-parallel-fp32"])
def test_a_crew_over_nat_trains_to_one_model(crew, spec):
    nodes, circuits, _ = crew
    runs = train(nodes, circuits, spec.to_dict(), 300)
    assert [r["rank"] for r in runs] == [0, 1, 2]
    assert all(r["steps"] == spec.steps and r["bytes_sent"] > 0 for r in runs), runs
    assert len({r["params_hash"] for r in runs}) == 1, runs
    assert all(math.isfinite(r["metrics"]["loss"]) and 0 < r["compute_s"] <= r["wall_s"] for r in runs), runs
