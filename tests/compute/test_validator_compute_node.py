"""A node running validator and compute together uses its own RPC as the ledger, registers as compute
without losing its validator role, and the chain keeps producing blocks."""
import time

import pytest

from devtools.testnet import Testnet
from node.ledger import jsonrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_validator_and_compute_roles_on_one_node(tmp_path):
    net = Testnet.create(tmp_path / "net", 2, settings={"node.roles": "validator,compute"})
    try:
        net.up(wait_height=1, timeout=60)
        deadline = time.monotonic() + 60
        while not all(jsonrpc.call(n.rpc_url, "dkb_computeStatus")["registered"] for n in net.nodes):
            assert time.monotonic() < deadline, "compute role did not register"
            time.sleep(0.3)
        url = net.nodes[0].rpc_url
        for node in net.nodes:
            assert {"validator", "compute"} <= set(jsonrpc.call(url, "dkb_getNode", node.peer_id)["roles"])
        candidates = {c["peer_id"] for c in jsonrpc.call(url, "dkb_getValidators")["candidates"]}
        assert candidates == {n.peer_id for n in net.nodes}
        height = jsonrpc.call(url, "dkb_blockNumber")
        net.wait_height(height + 3, timeout=30)
    finally:
        net.down(timeout=5)
