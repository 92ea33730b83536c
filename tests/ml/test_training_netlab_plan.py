"""bench/training_netlab.py's plan (no lab needed): the DiLoCo/streaming flags reach the specs of the
outer modes and never data-parallel's, every spec is checked before the lab starts, ``--modes`` runs a
subset, ``--dp-reference-lr`` adds a data-parallel run at that lr, and the summary gives the gaps
against both baselines and the least utilization of any worker."""
from __future__ import annotations

import pytest

from bench.training_netlab import REFERENCE, parse_args, plan, summarize
from ml.train.spec import InvalidSpec

WINNING = ("--steps 600 --inner-steps 100 --warmup 0 --fragments 2 --overlap 10 --lr 0.016 --outer-lr 1.0 "
           "--dp-reference-lr 0.016").split()


def test_flags_set_the_outer_modes_and_leave_data_parallel_on_its_recipe():
    specs = dict(plan(parse_args(WINNING)))
    assert list(specs) == ["data-parallel-fp32", REFERENCE, "diloco-int8", "streaming-int4"]
    dp, reference, diloco, streaming = specs.values()
    assert (dp.lr, dp.warmup_steps, dp.steps) == (4e-3, 50, 600)           # the recipe's baseline
    assert (reference.mode, reference.lr, reference.steps) == ("data-parallel", 0.016, 600)
    assert (diloco.codec, diloco.lr, diloco.outer_lr, diloco.inner_steps, diloco.warmup_steps) == (
        "int8", 0.016, 1.0, 100, 0)
    assert (streaming.codec, streaming.fragments, streaming.overlap_steps, streaming.lr, streaming.outer_lr) == (
        "int4", 2, 10, 0.016, 1.0)


def test_short_still_plans_the_three_recipes():
    specs = dict(plan(parse_args(["--short"])))
    assert list(specs) == ["data-parallel-fp32", "diloco-int8", "streaming-int4"]
    assert all(s.steps == 60 for s in specs.values())
    assert (specs["streaming-int4"].fragments, specs["streaming-int4"].overlap_steps) == (3, 2)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "600", "--inner-steps", "100", "--fragments", "3"], "multiple of fragments"),
    (["--steps", "600", "--inner-steps", "100", "--fragments", "2", "--overlap", "50"], "overlap_steps"),
    (["--modes", "streaming-int4,allreduce"], "unknown modes"),
])
def test_a_bad_setting_is_refused_before_the_lab_starts(argv, message):
    with pytest.raises(InvalidSpec, match=message):
        plan(parse_args(argv))


def test_modes_runs_a_subset():
    specs = plan(parse_args(["--modes", "streaming-int4", "--dp-reference-lr", "0.01"]))
    assert [label for label, _ in specs] == ["streaming-int4"]


def test_summary_gives_both_gaps_and_the_least_utilization():
    args = parse_args(WINNING)
    specs = dict(plan(args))

    def result(label, loss, mb, utilization, least):
        return {"label": label, "loss": loss, "bytes_per_worker": mb * 1e6, "utilization": utilization,
                "utilization_least": least, "bits_per_char": loss * 1.44, "spec": specs[label].to_dict()}
    results = {"data-parallel-fp32": result("data-parallel-fp32", 2.0, 400.0, 0.1, 0.09),
               REFERENCE: result(REFERENCE, 1.8, 400.0, 0.1, 0.09),
               "diloco-int8": result("diloco-int8", 2.2, 1.0, 0.8, 0.7),
               "streaming-int4": result("streaming-int4", 2.02, 0.5, 0.96, 0.9)}
    summary = summarize(results, args)
    assert (summary["bytes_vs_dp"], summary["loss_gap"], summary["utilization"]) == (800.0, 0.01, 0.96)
    assert summary["loss_gap_vs_dp_reference"] == pytest.approx(0.1222, abs=1e-4)
    assert summary["utilization_least"] == 0.9
    assert summary["streaming_spec"] == {"lr": 0.016, "outer_lr": 1.0, "outer_momentum": 0.9, "fragments": 2,
                                         "overlap_steps": 10, "mix": 0.5, "codec": "int4"}
    assert summary["data_parallel_fp32_reference"]["lr"] == 0.016
    assert summary["diloco_int8"]["loss_gap"] == 0.1


def test_a_failed_mode_is_reported_with_the_paths_after_it_and_the_others_still_run(monkeypatch, capsys):
    import json
    import sys

    import bench.training_netlab as bench
    from devtools.netlab.nodes import AgentError

    class FakeNet:
        closed = False

        def close(self):
            FakeNet.closed = True

    ran = []

    def fake_run(crew, circuits, label, spec, timeout):
        ran.append(label)
        if label == "data-parallel-fp32":
            raise AgentError("a: ExcludedFromRound: excluded from round 40: link failed: StreamResetError")
        return {"label": label}

    monkeypatch.setattr(bench, "unavailable", lambda: None)
    monkeypatch.setattr(bench, "start_crew", lambda *a: (FakeNet(), []))
    monkeypatch.setattr(bench, "settle", lambda crew: ({}, {"a-c": ["relayed"]}))
    monkeypatch.setattr(bench, "paths", lambda crew: {"a-c": ["direct"]})
    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["training_netlab.py", "--short"])
    with pytest.raises(SystemExit, match="failed: \\['data-parallel-fp32'\\]"):
        bench.main()
    assert ran == ["data-parallel-fp32", "diloco-int8", "streaming-int4"] and FakeNet.closed
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"label": "data-parallel-fp32", "error": "a: ExcludedFromRound: excluded from round 40: link failed: "
            "StreamResetError", "paths_after": {"a-c": ["direct"]}} in lines


def test_the_long_task_trains_the_streaming_char_transformer_in_whole_epochs_with_room_in_its_deadline():
    import argparse

    from bench import long_task
    from ml.train.spec import TrainSpec

    args = long_task.netlab_args(25.0, [20.0, 30.0, 40.0])
    spec = long_task.task_spec(args)
    assert isinstance(spec, TrainSpec)
    assert (spec.model, spec.mode, spec.codec) == ("char-transformer", "streaming-diloco", "int4")
    assert (spec.inner_steps, spec.fragments, spec.overlap_steps, spec.warmup_steps) == (100, 4, 10, 0)
    assert spec.segment_count % args.epochs == 0          # every epoch ends on an outer step
    assert args.min_training_s >= 1800 and args.expected_s >= args.min_training_s
    devnet = argparse.Namespace(**{**vars(args), "recipe": None})
    assert long_task.task_spec(devnet).model == "digits-mlp"   # without a recipe: the devnet's digits MLP


def test_the_long_task_fills_long_task_paid_in_the_summary(monkeypatch, capsys):
    import json
    import sys

    import bench.training_netlab as bench

    class FakeNet:
        def close(self):
            pass

    monkeypatch.setattr(bench, "unavailable", lambda: None)
    monkeypatch.setattr(bench, "start_crew", lambda *a: (FakeNet(), []))
    monkeypatch.setattr(bench, "settle", lambda crew: ({}, {}))
    monkeypatch.setattr(bench, "run", lambda crew, circuits, label, spec, timeout: {"label": label})
    monkeypatch.setattr(bench, "summarize", lambda results, args: {
        "long_task_paid": None, "long_task_paid_reason": "no chain", "join_s_reason": "", "kill_recovered_reason": ""})
    monkeypatch.setattr(bench, "run_long_task", lambda args: {"long_task_paid": False, "status": "expired"})
    monkeypatch.setattr(sys, "argv", ["training_netlab.py", "--short", "--long-task"])
    bench.main()
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["long_task_paid"] is False and summary["long_task"]["status"] == "expired"
    assert "long_task_paid_reason" not in summary


def test_pay_per_contribution_is_judged_from_the_ledgers_wages():
    from bench import long_task
    from consensus.genesis import Params
    from consensus.state.tasks import worker_share

    share = worker_share(Params(), 100_000, 3)
    churn = {"victim": "v", "joiner": "j", "killed_after_epochs": 3, "joined_at_epoch": 5}

    def final(victim: int, joiner: int, survivor: int) -> dict:
        return {"workers": ["a", "b", "j"], "epochs": {"earned": {"v": victim, "j": joiner, "a": share, "b": survivor}}}
    fair = long_task.churn_figures(final(share * 2 // 10, share * 5 // 10, share), churn, 10)
    assert fair["paid_per_contribution"] and fair["victim_epochs_bound"] == share * 3 // 10
    assert fair["joiner_epochs_floor"] == share * 5 // 10 and fair["survivors_earned"] == [share, share]
    assert "victim" not in fair and fair["joined_at_epoch"] == 5
    assert not long_task.churn_figures(final(share * 6 // 10, share // 2, share), churn, 10)["paid_per_contribution"]
    assert not long_task.churn_figures(final(share // 10, share // 10, share), churn, 10)["paid_per_contribution"]
    assert not long_task.churn_figures(final(0, share // 2, share), churn, 10)["paid_per_contribution"]
    assert not long_task.churn_figures(final(share // 10, share // 2, share // 2), churn, 10)["paid_per_contribution"]
