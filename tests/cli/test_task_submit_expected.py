"""``task submit`` declares the job's expected duration (docs/adr/0187): steps x the dry run's measured step
time, or ``--expected-s``; the ledger derives the commit deadline from it, and the command says how long
the workers get before anything is sent."""
import pytest

import cli.task_submit as task_submit
from cli.main import main
from consensus.genesis import Params
from consensus.state.deadlines import commit_span_ms


def submit(key, *argv):
    return main(["task", "submit", "--rpc", "http://127.0.0.1:9", "--key", str(key), "--price", "100",
                 "--model", "mlp", "--dataset", "digits", "--steps", "200", *argv])


def test_the_dry_run_measures_the_expected_duration_and_the_window_is_told(key, sent, capsys, monkeypatch):
    monkeypatch.setattr("ml.train.dry_run.dry_run", lambda spec, files=None, world=1: {
        "loss": 2.3, "params": 1000, "step_seconds": 0.39, "metrics": {}})
    assert submit(key) == 0
    assert sent[-1]["expected_s"] == 78                      # 200 steps x 0.39 s
    out = capsys.readouterr().out
    span = commit_span_ms(Params(), 78) // 1000
    assert f"workers must commit within about {span} s of assignment (expected 78 s of work" in out


def test_expected_s_flag_wins_and_a_skipped_dry_run_declares_nothing(key, sent, capsys):
    assert submit(key, "--skip-dry-run", "--expected-s", "36000") == 0
    assert sent[-1]["expected_s"] == 36_000
    assert submit(key, "--skip-dry-run") == 0
    assert "expected_s" not in sent[-1]
    assert "no expected duration declared: the chain's minimum" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        submit(key, "--skip-dry-run", "--expected-s", "0")


def test_expected_seconds_rounds_up_to_at_least_one():
    assert task_submit.expected_seconds(0.0001, 10) == 1
    assert task_submit.expected_seconds(0.39, 200) == 78
