"""A validator away longer than its peers keep blocks rejoins from a snapshot (docs/adr/0214): four real
validator processes pruning to the smallest retention; one is stopped while the others move 250+ blocks
on (every block it needs next is pruned everywhere), then restarted: it finds no peer serving its next
block, sets its database aside, state-syncs and follows the chain again."""
import time

import pytest

from devtools.testnet import Testnet
from node.ledger import jsonrpc
from node.ledger.errors import RpcAnswerError

FAST_PRUNING = {"consensus.retain_blocks": "100", "consensus.empty_block_wait": "0.01",
                "consensus.idle_block_wait": "0.01"}


def _error(url: str, method: str, *params):
    try:
        jsonrpc.call(url, method, *params)
    except RpcAnswerError as exc:
        return exc
    return None


@pytest.mark.slow   # ~40 s: 250 blocks past the stopped validator's height, then its catch-up
def test_a_validator_left_behind_the_retention_rejoins_from_a_snapshot(tmp_path):
    net = Testnet.create(tmp_path / "net", validators=4, settings=FAST_PRUNING)
    try:
        net.up(wait_height=3, timeout=60)
        laggard, ahead = net.nodes[3], net.nodes[0]
        net.stop_node(laggard)
        left = net.height(ahead)
        net.wait_height(left + 260, timeout=120, nodes=[ahead])
        pruned = _error(ahead.rpc_url, "dkb_getBlockByNumber", left + 1)
        assert pruned is not None and "pruned" in str(pruned)                 # nobody keeps its next block
        net.start_node(laggard)
        deadline = time.monotonic() + 90
        while True:
            height, tip = net.height(laggard), net.height(ahead) or 0
            if height is not None and height >= tip - 5 and height > left + 200:
                break
            assert time.monotonic() < deadline, (height, tip)
            time.sleep(0.5)
        log = laggard.log_file.read_text(errors="replace")
        assert "left behind" in log and "state synced" in log
        assert not list((laggard.home / "data").glob("chain.left-behind-*"))   # the old database is gone
        assert _error(laggard.rpc_url, "dkb_getBlockByNumber", left) is not None   # it never had these again
    finally:
        net.down()
