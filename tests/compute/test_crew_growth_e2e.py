"""Issue 23 item 3 end to end, a crew that grows (docs/adr/0234): on a local devnet (1 validator, 4 compute
node processes) a task for 3 workers that may grow to 4 is cut into 6 epochs. When epoch 0 closes the
ledger opens a fourth seat for the free node, from one epoch past the furthest commitment; it fetches a
member's committed state, every member cuts the data into 4 shards from that epoch on, and the four train
to the end. The auditors replay the new worker's segments with the grown world's cut and find them honest;
each of the four seats is paid its share of the price over 4 seats for the epochs it trained, the rest goes
back to the owner. Before ADR 0234 the fourth node never trained (no max_workers)."""
import pytest
from test_crew_restart_e2e import ENDED, wait_for
from test_task_epochs_e2e import PRICE, rpc, submit_epoch_task

from consensus.genesis import Params
from consensus.state.tasks import worker_share
from devtools.devnet import ComputeDevnet
from ml.train.spec import TrainSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = TrainSpec(codec="int8", steps=960, segment_steps=80)   # 12 segments: 6 epochs of 2
EPOCHS, EXPECTED_S = 6, 30
PARAMS = {"task_min_s": 12, "task_slack_s": 6}


def test_a_free_node_takes_an_extra_seat_and_is_paid_for_the_epochs_it_trained(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=4, params=PARAMS)
    try:
        net.up(timeout=120)
        task_id = submit_epoch_task(net, SPEC, 3, EXPECTED_S, epochs=EPOCHS, max_workers=4)
        workers = rpc(net, "dkb_getTask", task_id)["workers"]
        extra = next(n for n in net.compute if n.peer_id not in workers)
        task = wait_for(net, task_id, lambda t: t["status"] in ENDED, 480)
        assert task["status"] == "paid", {k: task[k] for k in ("status", "reason", "epochs", "slots", "commits")}
        joined = task["epochs"].get("joined", {})
        assert list(joined) == [extra.peer_id], task["epochs"]
        seat, first = joined[extra.peer_id]
        assert seat == 3 and 1 < first < EPOCHS, joined
        per_epoch = 12 // EPOCHS
        progress = task["epochs"]["commits"]
        ends = [per_epoch * (e + 1) for e in range(first, EPOCHS - 1)]   # its epochs, its layout's ends
        assert [e[2] for e in progress.get(extra.peer_id, [])] == ends
        assert all(task["commits"][w][2] == 12 for w in [*workers, extra.peer_id]), task["commits"]
        extra_slots = [s for s in task["slots"] if s["worker"] == extra.peer_id]
        # replayed with the 4-shard cut from its first epoch: honest
        assert extra_slots and all(s["segment"] >= first * per_epoch and s["outcome"] == "ok" for s in extra_slots)
        assert all(s["outcome"] == "ok" for s in task["slots"]), task["slots"]
        share = worker_share(Params(), PRICE, 4)   # the price pays four seats
        earned = task["epochs"]["earned"]
        assert all(earned[w] == share for w in workers), earned
        assert earned[extra.peer_id] == share - share * first // EPOCHS, earned
        assert task["payouts"][task["owner"]] >= share * first // EPOCHS   # the seat's epochs nobody trained
        supply = rpc(net, "dkb_getSupply")
        assert supply["total"] == supply["genesis"], supply
    finally:
        net.down(timeout=5)
