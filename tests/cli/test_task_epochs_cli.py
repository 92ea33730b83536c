"""``task submit`` cuts a long task into epochs of a few minutes of its expected work (or ``--epochs``) and
says so; ``task show`` shows the epoch progress: epochs closed, the open one and its deadline, and each
worker's progress commitments, a worker that left the crew marked (docs/adr/0203)."""
from cli.main import main
from cli.task_epochs import epoch_lines
from consensus.genesis import Params
from consensus.state.audit_cost import min_segments
from consensus.task_info import TaskInfo
from ml.compute.epoch_commits import epochs_for


def submit(key, *argv):
    return main(["task", "submit", "--rpc", "http://127.0.0.1:9", "--key", str(key), "--price", "100",
                 "--model", "mlp", "--dataset", "digits", "--steps", "200", "--skip-dry-run", *argv])


def test_a_long_task_is_cut_into_epochs_and_a_short_one_is_not(key, sent, capsys):
    assert submit(key, "--expected-s", "3600", "--steps", "20000") == 0
    segments = sent[-1]["segments"]   # each epoch keeps the segments its own audits need (ADR 0230)
    assert segments > 1 and sent[-1]["epochs"] == epochs_for(3600, segments, min_segments=min_segments(Params())) > 1
    assert segments // sent[-1]["epochs"] >= min_segments(Params())
    assert f"cut into {sent[-1]['epochs']} epochs" in capsys.readouterr().out
    assert submit(key, "--expected-s", "60") == 0
    assert "epochs" not in sent[-1]
    assert submit(key, "--expected-s", "60", "--epochs", "2") == 0
    assert sent[-1]["epochs"] == 2


def test_task_show_tells_the_epoch_progress():
    workers = ["12D3KooWAlpha" + "a" * 20, "12D3KooWBravo" + "b" * 20, "12D3KooWCharlie" + "c" * 20]
    first, second = ["11" * 32, "33" * 32, 2, 5], ["11" * 32, "44" * 32, 4, 9]
    task = {"status": "running", "spec": {"epochs": 3}, "workers": workers, "commits": {}, "rejections": {},
            "commit_deadline": 70_000, "block_time_ms": 10_000,
            "epochs": {"current": 2, "commits": {workers[0]: [first, second], workers[1]: [first, second],
                                                 workers[2]: [first]}}}
    lines = epoch_lines(TaskInfo.from_json(task))
    assert lines[0] == "epochs:     2 of 3 closed; epoch 3 open, commit by in 1m00s"
    assert lines[1].endswith("2 of 3 epochs committed, state 444444444444")
    assert lines[3].endswith("1 of 3 epochs committed, state 333333333333 (left the crew)")
    paid = {**task, "escrow": 6_000, "epochs": {**task["epochs"], "released": [0, 1],
                                                "earned": {workers[0]: 1_700, workers[1]: 1_700, workers[2]: 850}}}
    lines = epoch_lines(TaskInfo.from_json(paid))   # epochs paid out as audited (docs/adr/0230)
    assert lines[1] == "paid out:   epochs 1-2 of 3 (audited); 4250 to workers, 6000 still in escrow"
    assert lines[2].endswith("2 of 3 epochs committed, state 444444444444, earned 1700")
    stopped = {**task, "status": "committed", "epochs": {**task["epochs"], "stopped": 2}}
    assert epoch_lines(TaskInfo.from_json(stopped))[0] == "epochs:     stopped in epoch 3 of 3; 2 closed"
    assert epoch_lines(TaskInfo.from_json({"spec": {}, "epochs": {}})) == []


def test_task_show_tells_who_joined_the_crew_at_which_epoch_and_seat():
    workers = ["12D3KooWAlpha" + "a" * 20, "12D3KooWBravo" + "b" * 20, "12D3KooWCharlie" + "c" * 20,
               "12D3KooWDelta" + "d" * 20]
    first, second, third = ["11" * 32, "33" * 32, 2, 5], ["11" * 32, "44" * 32, 4, 9], ["11" * 32, "55" * 32, 6, 12]
    task = {"status": "running", "spec": {"epochs": 4, "workers": 3}, "workers": workers, "commits": {},
            "rejections": {}, "commit_deadline": 70_000, "block_time_ms": 10_000,
            "epochs": {"current": 3, "joined": {workers[3]: [2, 2]},
                       "commits": {workers[0]: [first, second, third], workers[1]: [first, second, third],
                                   workers[2]: [first], workers[3]: [third]}}}
    lines = epoch_lines(TaskInfo.from_json(task))
    assert lines[3].endswith("1 of 4 epochs committed, state 333333333333 (left the crew)")
    assert lines[4].endswith("1 of 2 epochs committed, state 555555555555 (joined at epoch 3, seat 3)")


def test_a_crew_that_may_grow_is_submitted_with_max_workers_and_shown_with_its_seats(key, sent, capsys):
    assert submit(key, "--expected-s", "60", "--epochs", "2", "--max-workers", "5") == 0
    assert sent[-1]["max_workers"] == 5 and sent[-1]["workers"] == 3
    assert "may grow from 3 to 5 workers" in capsys.readouterr().out
    sent_before = len(sent)
    assert submit(key, "--expected-s", "60", "--max-workers", "5") != 0   # one epoch: nobody could join
    assert submit(key, "--expected-s", "60", "--epochs", "2", "--max-workers", "2") != 0
    assert len(sent) == sent_before
    workers = ["12D3KooWAlpha" + "a" * 20, "12D3KooWBravo" + "b" * 20, "12D3KooWCharlie" + "c" * 20,
               "12D3KooWDelta" + "d" * 20]
    first = ["11" * 32, "33" * 32, 2, 5]
    task = {"status": "running", "spec": {"epochs": 4, "workers": 3, "max_workers": 5}, "workers": workers,
            "commits": {}, "rejections": {}, "commit_deadline": 70_000, "block_time_ms": 10_000,
            "epochs": {"current": 2, "joined": {workers[3]: [3, 2]},
                       "commits": {w: [first, first] for w in workers[:3]}}}
    lines = epoch_lines(TaskInfo.from_json(task))
    assert lines[1].startswith("seats:      4 open of up to 5 (3 asked")
    assert lines[-1].endswith("(joined at epoch 3, seat 4)")
