"""The downloader's scheduler: ranges, windows, liars, failures, end game (pure)."""
import pytest

from node.artifacts.scheduler import Scheduler, Verdict, _ranges


def test_ranges_group_consecutive_indices():
    assert _ranges([0, 1, 2, 3, 4, 7, 8], 4) == [(0, 4), (4, 1), (7, 2)]
    assert _ranges([], 4) == []


def test_holders_get_disjoint_ranges_up_to_their_window():
    s = Scheduler(20, [0] * 20, ["a", "b", "c"], window=8, request_chunks=4)
    assert s.requests("a") == [(0, 4), (4, 4)]
    assert s.requests("b") == [(8, 4), (12, 4)]
    assert s.requests("c") == [(16, 4)]
    assert s.requests("a") == []   # window full
    for i in range(4):
        assert s.on_chunk("a", i, True, 10) is Verdict.ACCEPT
    # a whole request fits again, but nothing new is left: end game only once a holder is idle
    assert s.requests("a") == []
    for i in range(4, 8):
        s.on_chunk("a", i, True, 10)
    assert s.requests("a") == [(8, 4), (12, 4)]   # idle: duplicates b's chunks in flight
    assert s.on_chunk("b", 8, True) is Verdict.ACCEPT
    assert s.on_chunk("a", 8, True) is Verdict.DUPLICATE
    assert s.holders["a"].chunks == 8 and s.holders["a"].bytes == 80


def test_chunks_already_held_are_skipped():
    s = Scheduler(6, [1, 1, 0, 1, 0, 0], ["a"], window=8, request_chunks=8)
    assert s.requests("a") == [(2, 1), (4, 2)]
    for i in (2, 4, 5):
        s.on_chunk("a", i, True)
    assert s.done and not s.stuck


def test_a_liar_is_dropped_and_its_chunks_reassigned():
    s = Scheduler(8, [0] * 8, ["a", "b"], window=4, request_chunks=4)
    assert s.requests("a") == [(0, 4)] and s.requests("b") == [(4, 4)]
    assert s.on_chunk("a", 0, False) is Verdict.LIAR
    assert s.holders["a"].dropped and s.liars() == ["a"] and s.requests("a") == []
    for i in range(4, 8):
        s.on_chunk("b", i, True)
    assert s.requests("b") == [(0, 4)]
    for i in range(4):
        s.on_chunk("b", i, True)
    assert s.done


def test_unsolicited_chunks_and_answers_mark_a_liar():
    s = Scheduler(8, [0] * 8, ["a", "b"], window=4, request_chunks=4)
    s.requests("a")
    assert s.on_chunk("a", 7, True) is Verdict.LIAR and s.holders["a"].liar
    s.requests("b")
    s.on_missing("b", 6)
    assert s.holders["b"].liar


def test_failures_requeue_and_drop_after_the_limit():
    s = Scheduler(4, [0] * 4, ["a", "b"], window=4, request_chunks=4, max_failures=2)
    assert s.requests("a") == [(0, 4)]
    assert s.on_failure("a", "reset") is True
    assert s.requests("b") == [(0, 4)]   # back in the pool
    assert s.on_failure("a", "reset") is True
    assert s.on_failure("a", "refused") is False
    assert "refused" in s.holders["a"].dropped and not s.holders["a"].liar
    s.on_success("b")
    assert s.holders["b"].failures == 0


def test_missing_chunks_go_to_other_holders_and_stuck_when_nobody_has_them():
    s = Scheduler(3, [0] * 3, ["a", "b"], window=4, request_chunks=4)
    assert s.requests("a") == [(0, 3)]
    s.on_missing("a", 1)
    s.on_chunk("a", 0, True)
    s.on_chunk("a", 2, True)
    assert s.requests("a") == [] and not s.stuck
    assert s.requests("b") == [(1, 1)]
    assert not s.stuck   # b's answer is pending
    s.on_missing("b", 1)
    assert s.holders["b"].dropped == "holds none of the missing chunks"
    assert s.stuck and not s.done


def test_bad_arguments():
    with pytest.raises(ValueError):
        Scheduler(3, [0, 0], ["a"])
    with pytest.raises(ValueError):
        Scheduler(3, [0] * 3, ["a"], window=0)


def test_a_chunk_a_holder_lacks_goes_back_to_the_pool_for_the_others():
    s = Scheduler(4, [0] * 4, ["a", "b"], window=2, request_chunks=1)
    assert s.requests("a") == [(0, 1), (1, 1)] and s.requests("b") == [(2, 1), (3, 1)]
    s.on_missing("a", 1)
    s.on_chunk("a", 0, True)
    s.on_chunk("b", 2, True)
    assert s.requests("b") == [(1, 1)]   # a lacked it: b is asked, although b's range is further on
    s.on_chunk("b", 1, True)
    s.on_chunk("b", 3, True)
    assert s.done
